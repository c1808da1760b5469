"""The event loop's side of the engine protocol: one engine core behind a ZMQ pair.

Inputs go out on a PUSH socket (a NOBLOCK send never blocks the loop and
never leaves a future behind); each step's outputs come back as one msgpack
message on a PULL socket, read by one task, decoded into fresh values and
routed to their sinks (`SinkRouter`). An idle engine sends a heartbeat every
second: silence for `heartbeat_timeout_s` with nothing unread means a hang,
and the engine is killed (`kill`), which is then a death like any other.

Subclasses say where the engine runs and how its death is noticed:
`MultiprocessEngineClient` (a child process: the client binds, the engine
connects, the process sentinel tells of its exit) and
`sluice.scaleout.replica_client.ReplicaClient` (a Ray actor on any node: the
engine binds, the client connects, the actor's pending `serve` call tells).
Either way a death ends every open request once with EngineDeadError, and
`restart()` replaces the engine on fresh sockets; the sink router survives, empty.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time

import zmq
import zmq.asyncio

from sluice.engine.messages import (
    EngineAlive,
    EngineFailed,
    EngineInput,
    EngineReady,
    StepOutputs,
    input_encoder,
    output_decoder,
)
from sluice.engine.routed_client import RoutedEngineClient
from sluice.errors import ModelLoadError

logger = logging.getLogger("sluice.engine")

# The longest an engine may be silent while it starts (its load beats while it moves).
STARTUP_TIMEOUT_S = 600.0


class ZmqEngineClient(RoutedEngineClient):
    can_restart = True

    def __init__(self, heartbeat_timeout_s: float):
        super().__init__()
        # Silence after which the engine is declared hung (a tuning knob tests lower).
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._last_output_s = 0.0
        self._tasks: list[asyncio.Task] = []
        self._sync_context = zmq.Context()
        self._context = zmq.asyncio.Context()
        self._inputs: zmq.Socket | None = None
        self._outputs: zmq.asyncio.Socket | None = None

    # -- what a subclass provides ------------------------------------------------

    @abc.abstractmethod
    async def _launch(self) -> None:
        """Start the engine and open the sockets to it (`_open_sockets`)."""

    @abc.abstractmethod
    def _exit_reason(self) -> str | None:
        """Why the engine is gone while it starts; None while it may still come up."""

    @abc.abstractmethod
    def kill(self) -> None:
        """End the engine now (a forced exit); its death is reported as usual."""

    @abc.abstractmethod
    async def _dispose(self) -> None:
        """Make sure what is left of the engine is gone (after the sockets closed)."""

    def _on_running(self) -> None:
        """Hook: the engine answered ready; watch for its death from here on
        (a watching task goes into `self._tasks`, stopped with the others)."""

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self._launch()
            self.info = await self._wait_ready()
        except BaseException:
            await self._stop_engine()
            raise
        self._is_alive = True
        self._last_output_s = time.monotonic()
        self._tasks = [
            asyncio.create_task(self._read_outputs(), name="sluice-engine-outputs"),
            asyncio.create_task(self._watch_heartbeat(), name="sluice-engine-heartbeat"),
        ]
        self._on_running()

    async def restart(self) -> None:
        """A fresh engine in place of a dead (or hung) one."""
        await self._stop_engine()
        await self.start()

    async def shutdown(self) -> None:
        await self._stop_engine()
        self._context.term()
        self._sync_context.term()

    def _open_sockets(self, input_address: str, output_address: str, *, bind: bool) -> None:
        """Inputs out on a plain PUSH socket, outputs in on an asyncio PULL socket."""
        self._inputs = self._sync_context.socket(zmq.PUSH)
        self._inputs.setsockopt(zmq.SNDHWM, 0)  # never refuse a request for lack of queue
        self._outputs = self._context.socket(zmq.PULL)
        for socket, address in ((self._inputs, input_address), (self._outputs, output_address)):
            socket.bind(address) if bind else socket.connect(address)

    async def _wait_ready(self) -> EngineReady:
        """The engine's first message: ready, or why it failed. A load that
        goes on beating (`EngineAlive`, engine/progress_beat.py's LoadBeat)
        may take as long as it needs; one silent for STARTUP_TIMEOUT_S, or
        an engine that exits, is refused."""
        while True:
            ready = asyncio.ensure_future(self._outputs.recv())
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while not ready.done():
                reason = self._exit_reason()
                if reason is None and time.monotonic() > deadline:
                    reason = f"the engine did not start: silent for {STARTUP_TIMEOUT_S:g} s"
                if reason is not None:
                    ready.cancel()
                    raise ModelLoadError(reason)
                await asyncio.wait([ready], timeout=0.2)
            message = output_decoder.decode(ready.result())
            if isinstance(message, EngineAlive):  # the load moves on: the bound starts again
                continue
            if isinstance(message, EngineFailed):
                raise ModelLoadError(message.message)
            assert isinstance(message, EngineReady), f"unexpected first message {message!r}"
            return message

    async def _stop_engine(self) -> None:
        """Stop the tasks, close the sockets, and get rid of what is left of the engine."""
        self._mark_dead("the engine was shut down", is_failure=False)
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            if task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for socket in (self._inputs, self._outputs):
            if socket is not None:
                socket.close(linger=0)
        self._inputs = self._outputs = None
        await self._dispose()

    # -- inputs ----------------------------------------------------------------

    def _send(self, message: EngineInput) -> None:
        if self._inputs is None:
            return
        try:
            self._inputs.send(input_encoder.encode(message), flags=zmq.NOBLOCK)
        except zmq.Again:
            # Only when the engine end is gone; its death is reported separately.
            logger.warning("engine input dropped: the engine is not reading")

    # -- state -----------------------------------------------------------------

    @property
    def seconds_since_output(self) -> float:
        return time.monotonic() - self._last_output_s

    # -- outputs ---------------------------------------------------------------

    async def _read_outputs(self) -> None:
        while True:
            message = output_decoder.decode(await self._outputs.recv())
            self._last_output_s = time.monotonic()
            if isinstance(message, StepOutputs):
                self._on_step(message.deltas, message.errors, message.stats)
            elif isinstance(message, EngineFailed):
                self._mark_dead(message.message)
                return

    async def _watch_heartbeat(self) -> None:
        while True:
            timeout_s = self.heartbeat_timeout_s
            await asyncio.sleep(min(1.0, timeout_s / 4))
            if self.seconds_since_output > timeout_s and not self._has_unread_output():
                logger.error("the engine sent nothing for %.0f s: killing it", timeout_s)
                self.kill()
                self._mark_dead(f"the engine stopped answering (no heartbeat for {timeout_s:g} s)")
                return

    def _has_unread_output(self) -> bool:
        # After a long stall of this loop, messages may be waiting unread: not a hang.
        return self._outputs is not None and bool(self._outputs.getsockopt(zmq.EVENTS) & zmq.POLLIN)

    def _mark_dead(self, message: str, *, is_failure: bool = True) -> None:
        if self._is_alive:
            log = logger.error if is_failure else logger.info
            log("engine down: %s", message)
        super()._mark_dead(message)
