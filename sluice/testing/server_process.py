"""The real server on the fake engine in its own process, for tests.

`ServerProcess` runs `python -m sluice.testing.fake_server ARGS` on a free
port, so signals, exit status, RSS and the loop's timing are its own and not
shared with the test's clients. (Tests that reach into the engine, its
records or its pid use `sluice.testing.live_server.LiveServer` on a thread.)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_health(url: str, timeout_s: float, expect: int = 200) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                status = response.status
        except urllib.error.HTTPError as error:
            status = error.code
        except OSError:
            status = None
        if status == expect:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"/health did not answer {expect} in {timeout_s} s")
        time.sleep(0.05)


class ServerProcess:
    """`python -m sluice.testing.fake_server ARGS` on a free port, until stopped."""

    def __init__(self, *args: str, log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._argv = [sys.executable, "-m", "sluice.testing.fake_server",
                      "--port", str(self.port), *args]  # fmt: skip
        self._log_path = log_path
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        with open(self._log_path, "wb") as log:
            self.process = subprocess.Popen(
                self._argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        wait_for_health(self.url, 60)
        return self

    def __exit__(self, *exc) -> None:
        process = self._started()
        if process.poll() is None:
            process.kill()
            process.wait(10)

    @property
    def pid(self) -> int:
        return self._started().pid

    def _started(self) -> subprocess.Popen:
        assert self.process is not None, "the server process starts on __enter__"
        return self.process

    def rss_bytes(self) -> int:
        return psutil.Process(self.pid).memory_info().rss

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def log(self) -> str:
        return self._log_path.read_text(errors="replace")


@contextmanager
def sluice_serve(*args: str, log_path: Path, startup_timeout_s: float = 300.0) -> Iterator[str]:
    """`sluice serve ARGS` (the real command, the real engine) on a free port
    of 127.0.0.1: its URL while the block runs, its output in `log_path`."""
    port = free_port()
    command = [sys.executable, "-m", "sluice.cli", "serve", "--host", "127.0.0.1",
               "--port", str(port), *args]  # fmt: skip
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_health(url, startup_timeout_s)
        yield url
    finally:
        process.terminate()
        process.wait(30)
