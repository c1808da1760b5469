"""Keeps an engine running: notices its death and restarts it, or stops the server.

The client has already done the urgent part when its engine dies: every open
request heard EngineDeadError once, and `is_alive` is False, so new requests
and /health answer 503. The supervisor does the slow part on the event loop:

    policy "restart"   start a fresh engine (the model is loaded again); if that
                       fails, retry with exponential backoff, up to `max_backoff_s`
                       apart; /health returns to 200 once one is up.
    policy "exit"      call `on_exit` once (the server stops with status 1 and a
                       process supervisor restarts it).

Invariant: at most one restart runs at a time; `stop()` (before the engine's
own shutdown) ends the watch, so a deliberate shutdown is never "recovered".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Literal, Protocol, runtime_checkable

logger = logging.getLogger("sluice.engine")

# How often `is_alive` is read: the client fails requests at once by itself,
# so this only delays the restart.
CHECK_INTERVAL_S = 0.1
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0


@runtime_checkable
class RestartableEngine(Protocol):
    @property
    def is_alive(self) -> bool: ...

    async def restart(self) -> None:
        """Replace a dead engine with a fresh one; raises ModelLoadError on failure."""


class EngineSupervisor:
    def __init__(
        self,
        engine: RestartableEngine,
        policy: Literal["restart", "exit"],
        on_exit: Callable[[], None],
        max_backoff_s: float = MAX_BACKOFF_S,
    ):
        self.engine = engine
        self.policy = policy
        self.on_exit = on_exit
        self.max_backoff_s = max_backoff_s
        self.num_restarts = 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="sluice-engine-supervisor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            if self.engine.is_alive:
                continue
            if self.policy == "exit":
                logger.error("the engine died; stopping the server (on_engine_death=exit)")
                self.on_exit()
                return
            await self._restart_until_alive()

    async def _restart_until_alive(self) -> None:
        backoff_s = FIRST_BACKOFF_S
        while not self.engine.is_alive:
            logger.warning("the engine died; starting a new one")
            try:
                await self.engine.restart()
            except Exception as error:  # noqa: BLE001 - the watch must outlive any failure
                logger.error("engine restart failed: %s; retrying in %.0f s", error, backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, self.max_backoff_s)
                continue
            self.num_restarts += 1
            logger.info("the engine is back (restart %d)", self.num_restarts)
