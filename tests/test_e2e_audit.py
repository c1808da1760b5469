"""`sluice audit`, quick profile sized for CI, against `sluice serve` on the embedded model.

The server runs as users run it: `python -m sluice.cli serve` in its own
process (the engine in a process of its own below it) on a free port (port 0,
the bound address read from its log), the embedded model converted once by
the session's `embedded_model_config`. The audit runs in this process through
`sluice.audit.cli.main`, every scenario of the quick profile with sizes small
enough for a loaded 2-core CPU (a few tokens/s per stream), and must pass: exit
status 0, no broken invariant in its JSON (determinism notes aside), every
scenario measured, and an HTML page whose plots are drawn.

Invariants: the server is always stopped (SIGTERM, then SIGKILL of its whole
process group) when the module ends, whatever happened; its log is shown
when it fails to start.
"""

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
from xml.etree import ElementTree

import pytest

from sluice.audit.options import PROFILE_SCENARIOS
from sluice.config import ModelConfig
from tests.audit_runs import AuditRun, run_quick_audit

pytestmark = pytest.mark.slow

STARTUP_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.5
QUICK_SCENARIOS = PROFILE_SCENARIOS["quick"]
# One intra-op thread for the engine: on 2 cores shared with other tests, two
# torch threads per engine spin against each other (measured side by side at
# load 7: the same audit took 160 s with one thread, 390 s with two).
SERVER_ENV = {"OMP_NUM_THREADS": "1"}
PLOT_TITLES = [
    "Time to first token (CDF)",
    "Inter-token latency (CDF)",
    "End-to-end latency (CDF)",
    "Output throughput over time",
    "Tokens per chunk",
]
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
    log_path = tmp_path_factory.mktemp("sluice-serve") / "serve.log"
    with log_path.open("wb") as log:
        process = _spawn(embedded_model_config, log)
        try:
            base_url = wait_until_healthy(process, log_path)
            _, models = _get(base_url + "/v1/models")
            (card,) = json.loads(models)["data"]
            yield RunningServer(base_url, card["id"])
        finally:
            stop(process)


def _spawn(config: ModelConfig, log: IO[bytes]) -> subprocess.Popen:
    return subprocess.Popen(
        serve_command(config),
        env={**os.environ, **SERVER_ENV},
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def quick_audit(sluice_server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> AuditRun:
    out = tmp_path_factory.mktemp("audit")
    return run_quick_audit(sluice_server.base_url, sluice_server.model, out)


def test_the_quick_audit_of_sluice_passes_with_no_finding(quick_audit: AuditRun):
    """No broken invariant. The default (bfloat16) is not batch-invariant, so a
    stream and its non-streamed twin, computed in different batches, may
    differ: that is the determinism figure, reported as a note (issue 16)."""
    assert quick_audit.exit_status == 0, quick_audit.text
    assert quick_audit.report["exit_status"] == 0
    assert quick_audit.report["invariants_broken"] is False
    notes = {"text_mismatch_nonstream"}
    assert all(
        f["severity"] == "note" and f["check_id"] in notes for f in quick_audit.report["findings"]
    ), quick_audit.text


def test_every_quick_scenario_ran_and_was_measured(quick_audit: AuditRun):
    report = quick_audit.report
    assert report["profile"] == "quick"
    assert report["scenarios"] == list(QUICK_SCENARIOS)
    metrics = report["metrics"]["server"]
    for scenario in QUICK_SCENARIOS:
        assert metrics[scenario]["requests"] > 0, scenario
        assert metrics[scenario]["errors"] == 0, scenario
    assert metrics["all"]["output_tokens"] > 0
    # Streams were compared with their non-streamed twins.
    assert report["determinism"]["server"]["compared"] > 0


def test_the_html_report_draws_every_plot(quick_audit: AuditRun):
    assert "PASS: no invariant broken" in quick_audit.html
    plots = re.findall(r"<svg.*?</svg>", quick_audit.html, flags=re.DOTALL)
    assert [ElementTree.fromstring(plot).get("aria-label") for plot in plots] == PLOT_TITLES
    assert all("no data" not in plot for plot in plots)
    assert all(plot.count("<polyline") >= 2 for plot in plots[:4])
