"""An engine client that runs the engine core on a thread of this process.

For tests and the offline API's async users. Same contract as the process
client: inputs go through a queue the engine thread drains between steps;
each step's deltas cross to the event loop as one value via
`call_soon_threadsafe`, never as a shared object. If a step raises, every
open request hears EngineDeadError; `restart()` then builds a fresh core on
the same loaded weights. A hung thread cannot be stopped: hang detection
needs the process engine.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading

from sluice.engine.core import EngineCore
from sluice.engine.messages import EngineInput, Shutdown
from sluice.engine.outputs import EngineError, RequestDelta
from sluice.engine.pooling_core import PoolingCore, fresh_core
from sluice.engine.routed_client import RoutedEngineClient

logger = logging.getLogger("sluice.engine")

IDLE_WAIT_S = 0.5


class InProcessEngineClient(RoutedEngineClient):
    can_restart = True

    def __init__(self, core: EngineCore | PoolingCore):
        super().__init__()
        self.core = core
        self.info = core.info
        self._inputs: queue.SimpleQueue[EngineInput] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._is_alive = True
        self._thread = threading.Thread(target=self._run, name="sluice-engine", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        if self._thread is None:
            return
        self._inputs.put(Shutdown())
        await asyncio.to_thread(self._thread.join, 30)
        self._thread = None
        self._mark_dead("the engine was shut down")

    async def restart(self) -> None:
        """A fresh core (new scheduler and KV cache, same weights) on a new thread."""
        await self.shutdown()
        # Allocating the KV cache takes a while: off the loop.
        self.core = await asyncio.to_thread(fresh_core, self.core)
        self._inputs = queue.SimpleQueue()
        await self.start()

    def _send(self, message: EngineInput) -> None:
        self._inputs.put(message)

    # -- the engine thread -----------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                deltas: list[RequestDelta] = []
                errors: list[EngineError] = []
                if not self._drain(deltas, errors):
                    return
                if self.core.has_unfinished_requests():
                    deltas.extend(self.core.step())
                    errors.extend(self.core.take_errors())
                if deltas or errors:
                    stats = self.core.stats()
                    self._loop.call_soon_threadsafe(self._on_step, deltas, errors, stats)
        except Exception as error:  # noqa: BLE001 - the engine is down; every request hears it
            logger.exception("engine step failed")
            self._loop.call_soon_threadsafe(self._mark_dead, f"engine failed: {error}")

    def _drain(self, deltas: list[RequestDelta], errors: list[EngineError]) -> bool:
        """Apply queued inputs; block while idle. False on shutdown."""
        block = not self.core.has_unfinished_requests()
        while True:
            try:
                message = (
                    self._inputs.get(timeout=IDLE_WAIT_S) if block else self._inputs.get_nowait()
                )
            except queue.Empty:
                return True
            block = False
            if not self.core.handle(message, deltas, errors):
                return False
