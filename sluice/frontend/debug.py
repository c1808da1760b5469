"""Fault injection for tests and benchmarks: a stalled event loop, a slow reader.

`DebugHooks` reproduces the original failure (a consumer lagging behind the
engine) on demand: a background task blocks the whole event loop with
`time.sleep(loop_stall_for_s)` every `loop_stall_every_s` seconds, and every
read of a stream's mailbox waits `reader_delay_s` first. Off by default: a
`Frontend(debug=None)` never touches this module's code paths.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class DebugHooks:
    # Block the event loop this often (None: never) ...
    loop_stall_every_s: float | None = None
    # ... for this long, with time.sleep (nothing else runs meanwhile).
    loop_stall_for_s: float = 0.0
    # Sleep before each mailbox read in Frontend.stream (a slow reader).
    reader_delay_s: float = 0.0
    _stall_task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    def ensure_running(self) -> None:
        """Start the loop-stalling task on the running loop, once."""
        if self.loop_stall_every_s is None or self._stall_task is not None:
            return
        self._stall_task = asyncio.get_running_loop().create_task(self._stall_loop())

    async def before_read(self) -> None:
        if self.reader_delay_s > 0:
            await asyncio.sleep(self.reader_delay_s)

    async def stop(self) -> None:
        task, self._stall_task = self._stall_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _stall_loop(self) -> None:
        assert self.loop_stall_every_s is not None, "started only when configured"
        while True:
            await asyncio.sleep(self.loop_stall_every_s)
            time.sleep(self.loop_stall_for_s)  # on purpose: blocks the whole loop
