"""Stall an event loop on purpose, from outside the code under test.

A `LoopStaller` blocks a whole event loop with `time.sleep(for_s)` every
`every_s` seconds, from a task of its own: nothing of the server's knows it
is there, exactly as when a large prefill, a slow tokenizer call or a busy
neighbour holds the loop. `for_s` may be changed while it runs (a test sizes
the stall once it knows how long an engine step takes).

    staller = LoopStaller(every_s=1.0, for_s=2.0)
    staller.start(loop)        # any thread; the task runs on `loop`
    ...
    staller.stop()
"""

from __future__ import annotations

import asyncio
import time


class LoopStaller:
    def __init__(self, every_s: float, for_s: float = 0.0):
        self.every_s = every_s
        self.for_s = for_s
        self.num_stalls = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Future[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start stalling `loop` (callable from any thread)."""
        self._loop = loop
        self._task = asyncio.run_coroutine_threadsafe(self._run(), loop)  # type: ignore[assignment]

    def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            if self.for_s > 0:
                time.sleep(self.for_s)  # on purpose: blocks the whole loop
                self.num_stalls += 1
