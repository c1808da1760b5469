"""Stopping without losing anyone: drain, then cut what is left, every stream told.

SIGTERM (or a first SIGINT) runs `GracefulShutdown.drain()` on the event loop:
1. Refuse new work: generation routes and /health answer 503 with Retry-After;
   the engine is no longer restarted if it dies.
2. Let running requests finish, up to `drain_timeout_s`.
3. End the rest: each open stream gets one error event and [DONE], each
   non-streamed request a 503, and their engine requests are aborted.
4. Ask the server to stop: it closes the listener, waits briefly for those
   last events to be written, and stops the engine; the exit status is 0.

`force()` is the second SIGINT: the engine process is killed (so it is not
left behind) and the server stops at once, exit status 130. `exit(code)` stops
the server without draining (the engine died under on_engine_death=exit).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from sluice.errors import ServiceUnavailableError
from sluice.server.in_flight.admission import ShuttingDownError

logger = logging.getLogger("sluice.server")

EXIT_FORCED = 130


class Drainable(Protocol):
    """What a drain needs of the server's engines: one `AdmissionGate`, or
    the `ModelPool` of a server of several models."""

    @property
    def is_draining(self) -> bool: ...

    @property
    def num_in_flight(self) -> int: ...

    def start_draining(self) -> None: ...

    async def wait_idle(self, timeout_s: float) -> bool: ...

    def fail_all(self, error: ServiceUnavailableError) -> int: ...

    def kill(self) -> None:
        """Kill the engine processes now (a forced exit)."""


@runtime_checkable
class Stoppable(Protocol):
    async def stop(self) -> None: ...


class GracefulShutdown:
    def __init__(
        self,
        gate: Drainable,
        drain_timeout_s: float,
        supervisor: Stoppable | None = None,
    ):
        self.gate = gate
        self.drain_timeout_s = drain_timeout_s
        self.supervisor = supervisor
        self.exit_code = 0
        self.num_cut = 0
        self._stop_server: Callable[[bool], None] | None = None
        self._task: asyncio.Task | None = None

    @property
    def is_draining(self) -> bool:
        return self.gate.is_draining

    def bind(self, stop_server: Callable[[bool], None]) -> None:
        """How to stop the server: `stop_server(force)`; called by the server at startup."""
        self._stop_server = stop_server

    def begin(self) -> None:
        """Start draining (on the event loop); a second call changes nothing."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.drain(), name="sluice-drain")

    async def drain(self) -> None:
        # 1. Refuse new work; a dead engine stays dead.
        logger.info("draining: %d requests in flight", self.gate.num_in_flight)
        self.gate.start_draining()
        if self.supervisor is not None:
            await self.supervisor.stop()
        # 2. Let running requests finish.
        if not await self.gate.wait_idle(self.drain_timeout_s):
            # 3. Cut the rest, each with one error.
            self.num_cut = self.gate.fail_all(ShuttingDownError("the server is shutting down"))
            logger.warning("drain timeout: %d requests cut", self.num_cut)
        # 4. Stop serving; the server flushes what is being written.
        self._stop(force=False)

    def force(self) -> None:
        """Exit now: kill the engine process, stop the server without waiting."""
        logger.warning("forced exit")
        self.gate.kill()
        self.exit_code = EXIT_FORCED
        self._stop(force=True)

    def exit(self, code: int) -> None:
        """Stop the server with exit status `code`, without draining."""
        self.exit_code = code
        self.gate.start_draining()
        self._stop(force=False)

    def _stop(self, *, force: bool) -> None:
        if self._stop_server is None:
            logger.error("no server to stop (not bound)")
            return
        self._stop_server(force)
