"""Event loops for a test's async body: a fresh real one, bounded, or one in virtual time.

`run(coroutine)` runs the body on a fresh loop with a generous timeout, so a
hang fails the test instead of the suite.

`run_in_virtual_time(coroutine)` runs it on a `VirtualClockLoop`, whose clock
moves only when the loop has nothing to run, and then straight to the next
timer. Code between two waits takes no time at all: `asyncio.sleep(0.02)`
lasts exactly 0.02 s of loop time, a 50 ms timeout fires exactly 50 ms after
it was armed, and a fake engine stepping every 10 ms steps exactly then,
however loaded the machine is. So a test of timers (deadlines, write
timeouts, drains) can assert exact times instead of wall-clock bounds.

What sees virtual time: everything that reads the loop's clock (`loop.time`,
`call_later`, `call_at`, `asyncio.sleep`, `wait_for` and `timeout` deadlines).
What does not: `time.monotonic`, `time.sleep`, threads. With a timer pending
the loop does not wait for sockets or threads, it jumps to the timer: use it
for code driven by timers and in-process events, not real I/O.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# A test body that runs longer than this has hung.
RUN_TIMEOUT_S = 120.0


def run(coroutine: Coroutine[Any, Any, T], timeout_s: float = RUN_TIMEOUT_S) -> T:
    """Run a test's async body on a fresh loop, bounded so nothing hangs the suite."""
    return asyncio.run(asyncio.wait_for(coroutine, timeout_s))


def run_in_virtual_time(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a test's async body on a fresh `VirtualClockLoop` (its clock starts at 0)."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(coroutine)


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """A selector loop whose `time()` advances only while it would wait."""

    def __init__(self) -> None:
        self._now_s = 0.0
        super().__init__(_AdvancingSelector(self._advance))

    def time(self) -> float:
        return self._now_s

    def _advance(self, seconds: float) -> None:
        self._now_s += seconds


class _AdvancingSelector(selectors.DefaultSelector):
    """Polls instead of waiting, and moves the loop's clock by the wait it skipped.

    The loop asks to wait until its next timer is due (or forever when it has
    none, then the wait is real: only I/O or another thread can wake it)."""

    def __init__(self, advance) -> None:
        super().__init__()
        self._advance = advance

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            return super().select(None)
        events = super().select(0)
        if not events and timeout > 0:
            self._advance(timeout)
        return events
