"""The live progress display.

On a terminal: one line rewritten in place a few times a second. Otherwise
(CI logs, pipes): a plain line at every scenario start and every few seconds.
Counters are plain integers owned by the event loop; the transport bumps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None, *, is_tty: bool, interval_s: float | None = None):
        self._stream = stream
        self._is_tty = is_tty
        self._interval_s = interval_s if interval_s is not None else (0.2 if is_tty else 5.0)
        self._started_s = time.perf_counter()
        self._label = ""
        self.requests_done = 0
        self.requests_failed = 0
        self.in_flight = 0
        self.findings = 0
        self._task: asyncio.Task[None] | None = None

    # Counters, bumped by the transport and the runner.
    def request_started(self) -> None:
        self.in_flight += 1

    def request_finished(self, is_ok: bool) -> None:
        self.in_flight -= 1
        self.requests_done += 1
        self.requests_failed += not is_ok

    def add_findings(self, count: int) -> None:
        self.findings += count

    def start_scenario(self, target: str, scenario: str) -> None:
        self._label = f"[{target}] {scenario}"
        if not self._is_tty:
            self._print_line()

    # Display.
    def line(self) -> str:
        elapsed_s = time.perf_counter() - self._started_s
        return (
            f"{self._label:<24} done {self.requests_done:>5}  in flight {self.in_flight:>3}  "
            f"failed {self.requests_failed:>3}  findings {self.findings:>3}  {elapsed_s:6.1f}s"
        )

    def _print_line(self) -> None:
        if self._stream is None:
            return
        if self._is_tty:
            self._stream.write("\r\x1b[2K" + self.line())
        else:
            self._stream.write(self.line() + "\n")
        self._stream.flush()

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            self._print_line()

    def start(self) -> None:
        if self._stream is not None:
            self._task = asyncio.get_running_loop().create_task(self._refresh())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._stream is not None:
            self._print_line()
            if self._is_tty:
                self._stream.write("\n")
            self._stream.flush()
