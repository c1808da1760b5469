"""`sluice serve` as users run it, in its own process, for the served end-to-end
tests: `python -m sluice.cli serve` on a free port (port 0, the bound address
read from its log), the embedded model converted once by the session's
`embedded_model_config`. The server is always stopped (SIGTERM, then SIGKILL
of its whole process group) when the module using it ends; its log is shown
when it fails to start."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from sluice.config import ModelConfig

STARTUP_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.5
# One intra-op thread for the engine: on 2 cores shared with other tests, two
# torch threads per engine spin against each other (measured side by side at
# load 7: the same audit took 160 s with one thread, 390 s with two).
SERVER_ENV = {"OMP_NUM_THREADS": "1"}
_LISTENING = re.compile(r"sluice listening on (http://127\.0\.0\.1:\d+)")


@dataclass(frozen=True, slots=True)
class RunningServer:
    base_url: str
    # The name the server lists in /v1/models, sent as `model` by the audit.
    model: str


def serve_command(config: ModelConfig) -> list[str]:
    return [
        sys.executable, "-m", "sluice.cli", "serve", "--host", "127.0.0.1", "--port", "0",
        "--cache-dir", str(config.cache_dir), "--max-model-len", "2048",
        "--kv-cache-memory", "512MiB",
    ]  # fmt: skip


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def _log_tail(log_path: Path) -> str:
    return log_path.read_text(encoding="utf-8", errors="replace")[-4000:]


def wait_until_healthy(process: subprocess.Popen, log_path: Path) -> str:
    """The server's base URL once /health answers 200; fails with its log otherwise."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"sluice serve exited {process.returncode}:\n{_log_tail(log_path)}")
        found = _LISTENING.search(log_path.read_text(encoding="utf-8", errors="replace"))
        if found and _get(found.group(1) + "/health")[0] == 200:
            return found.group(1)
        time.sleep(POLL_INTERVAL_S)
    pytest.fail(f"sluice serve not healthy after {STARTUP_TIMEOUT_S}s:\n{_log_tail(log_path)}")


def stop(process: subprocess.Popen) -> None:
    """SIGTERM (drain, then exit); SIGKILL to the whole group if it lingers."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(STOP_TIMEOUT_S)
    # The engine process is the server's child, in the session started for it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture(scope="module")
def sluice_server(
    embedded_model_config: ModelConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with running_server(embedded_model_config, tmp_path_factory) as server:
        yield server


@contextlib.contextmanager
def running_server(
    config: ModelConfig, tmp_path_factory: pytest.TempPathFactory, *flags: str
) -> Iterator[RunningServer]:
    """`sluice serve` with the defaults and `flags`, until the block ends."""
    log_path = tmp_path_factory.mktemp("sluice-serve") / "serve.log"
    with log_path.open("wb") as log:
        process = _spawn(config, log, flags)
        try:
            base_url = wait_until_healthy(process, log_path)
            _, models = _get(base_url + "/v1/models")
            (card,) = json.loads(models)["data"]
            yield RunningServer(base_url, card["id"])
        finally:
            stop(process)


def _spawn(config: ModelConfig, log: IO[bytes], flags: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen(
        [*serve_command(config), *flags],
        env={**os.environ, **SERVER_ENV},
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
