"""The engine client for an engine core in its own process (the default).

The event loop and the model never compete for the GIL: the engine process
steps the model, this client lives on the event loop. Requests go out on a ZMQ
PUSH socket (sends never block the loop); each step's outputs come back as one
msgpack message, decoded into fresh values and routed to their sinks.
If the engine process dies, the loop learns it at once through the process
sentinel (no polling) and every open request gets EngineDeadError. If it hangs
(no message, not even the idle heartbeat, for `heartbeat_timeout_s`), it is
killed, which is then the same case. `restart()` replaces a dead engine with a
fresh process on fresh sockets; the sink router survives, empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import tempfile
import time
import uuid
from pathlib import Path

import zmq
import zmq.asyncio

from sluice.config import EngineConfig
from sluice.engine.client_base import DeltaSink, EngineClient
from sluice.engine.core_process import run_engine_process
from sluice.engine.messages import (
    AbortRequests,
    AddRequest,
    EngineFailed,
    EngineInput,
    EngineReady,
    EngineStatsSnapshot,
    ResetPrefixCache,
    Shutdown,
    StepOutputs,
    input_encoder,
    output_decoder,
)
from sluice.engine.sampling_params import SamplingParams
from sluice.engine.sink_router import SinkRouter
from sluice.errors import EngineDeadError, ModelLoadError

logger = logging.getLogger("sluice.engine")

STARTUP_TIMEOUT_S = 600.0


class MultiprocessEngineClient(EngineClient):
    can_restart = True

    def __init__(self, config: EngineConfig):
        self.config = config
        self.info: EngineReady | None = None
        self._router = SinkRouter()
        self._stats = EngineStatsSnapshot()
        self._is_alive = False
        self._last_output_s = 0.0
        # Silence after which the engine is declared hung (a tuning knob tests lower).
        self.heartbeat_timeout_s = config.heartbeat_timeout_s
        self._process: multiprocessing.process.BaseProcess | None = None
        self._reader: asyncio.Task | None = None
        self._heartbeat_watch: asyncio.Task | None = None
        self._socket_dir = Path(tempfile.mkdtemp(prefix="sluice-"))
        # Inputs go out on a plain socket (a NOBLOCK send never leaves a future
        # behind); outputs come in on an asyncio socket read by one task.
        self._sync_context = zmq.Context()
        self._context = zmq.asyncio.Context()
        self._inputs: zmq.Socket | None = None
        self._outputs: zmq.asyncio.Socket | None = None

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self._start_process()
        except BaseException:
            await self._stop_process()
            raise

    async def restart(self) -> None:
        """A fresh engine process in place of a dead (or hung) one."""
        await self._stop_process()
        await self.start()

    def kill(self) -> None:
        """SIGKILL the engine process now (a forced exit); its death is reported as usual."""
        if self._process is not None and self._process.is_alive():
            self._process.kill()

    async def _start_process(self) -> None:
        token = uuid.uuid4().hex[:8]
        input_address = f"ipc://{self._socket_dir}/in-{token}"
        output_address = f"ipc://{self._socket_dir}/out-{token}"
        self._inputs = self._sync_context.socket(zmq.PUSH)
        self._inputs.setsockopt(zmq.SNDHWM, 0)  # never refuse a request for lack of queue
        self._inputs.bind(input_address)
        self._outputs = self._context.socket(zmq.PULL)
        self._outputs.bind(output_address)
        spawn = multiprocessing.get_context("spawn")
        self._process = spawn.Process(
            target=run_engine_process,
            args=(self.config, input_address, output_address),
            name="sluice-engine",
            daemon=True,
        )
        self._process.start()
        self.info = await self._wait_ready()
        self._is_alive = True
        self._last_output_s = time.monotonic()
        loop = asyncio.get_running_loop()
        loop.add_reader(self._process.sentinel, self._on_process_exit)
        self._reader = asyncio.create_task(self._read_outputs(), name="sluice-engine-outputs")
        self._heartbeat_watch = asyncio.create_task(
            self._watch_heartbeat(), name="sluice-engine-heartbeat"
        )

    async def _wait_ready(self) -> EngineReady:
        ready_or_exit = asyncio.ensure_future(self._outputs.recv())
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not ready_or_exit.done():
            if not self._process.is_alive():
                ready_or_exit.cancel()
                raise ModelLoadError(f"engine process exited with code {self._process.exitcode}")
            if time.monotonic() > deadline:
                ready_or_exit.cancel()
                raise ModelLoadError("engine process did not start in time")
            await asyncio.wait([ready_or_exit], timeout=0.2)
        message = output_decoder.decode(ready_or_exit.result())
        if isinstance(message, EngineFailed):
            raise ModelLoadError(message.message)
        assert isinstance(message, EngineReady), f"unexpected first message {message!r}"
        return message

    async def shutdown(self) -> None:
        if self._process is not None and self._process.is_alive():
            asyncio.get_running_loop().remove_reader(self._process.sentinel)
            self._send(Shutdown())
            await asyncio.to_thread(self._process.join, 10)
        await self._stop_process()
        self._context.term()
        self._sync_context.term()

    async def _stop_process(self) -> None:
        """Kill what is left of the engine process, close its sockets, stop the tasks."""
        self._mark_dead("the engine was shut down")
        for task in (self._reader, self._heartbeat_watch):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._reader = self._heartbeat_watch = None
        if self._process is not None and self._process.pid is not None:  # it was started
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self._process.sentinel)
            if self._process.is_alive():
                self._process.kill()
            await asyncio.to_thread(self._process.join, 10)
            with contextlib.suppress(ValueError):
                self._process.close()
        self._process = None
        for socket in (self._inputs, self._outputs):
            if socket is not None:
                socket.close(linger=0)
        self._inputs = self._outputs = None

    # -- requests --------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        sink: DeltaSink,
    ) -> None:
        if not self._is_alive:
            raise EngineDeadError("the engine is not running")
        self._router.register(request_id, sink)
        self._send(AddRequest(request_id, list(prompt_token_ids), params))

    def abort(self, request_ids: list[str]) -> None:
        live = [request_id for request_id in request_ids if request_id in self._router]
        for request_id in live:
            # The consumer is gone: it hears nothing more, the engine frees the blocks.
            self._router.unregister(request_id)
        if live and self._is_alive:
            self._send(AbortRequests(live))

    def reset_prefix_cache(self) -> None:
        if self._is_alive:
            self._send(ResetPrefixCache())

    def _send(self, message: EngineInput) -> None:
        if self._inputs is None:
            return
        try:
            self._inputs.send(input_encoder.encode(message), flags=zmq.NOBLOCK)
        except zmq.Again:
            # Only when the engine end is gone; its death is reported by the sentinel.
            logger.warning("engine input dropped: the engine is not reading")

    # -- state -----------------------------------------------------------------

    @property
    def is_alive(self) -> bool:
        return self._is_alive

    def stats(self) -> EngineStatsSnapshot:
        return self._stats

    @property
    def seconds_since_output(self) -> float:
        return time.monotonic() - self._last_output_s

    # -- outputs ---------------------------------------------------------------

    async def _read_outputs(self) -> None:
        while True:
            message = output_decoder.decode(await self._outputs.recv())
            self._last_output_s = time.monotonic()
            if isinstance(message, StepOutputs):
                self._stats = message.stats
                self._router.dispatch(message.deltas, message.errors)
            elif isinstance(message, EngineFailed):
                self._mark_dead(message.message)
                return

    def _on_process_exit(self) -> None:
        if self._process is None:
            return
        asyncio.get_running_loop().remove_reader(self._process.sentinel)
        self._process.join(0)  # reap it, so its exit code is known
        self._mark_dead(f"the engine process exited (code {self._process.exitcode})")

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

    def _mark_dead(self, message: str) -> None:
        if self._is_alive:
            logger.error("engine down: %s", message)
        self._is_alive = False
        self._router.fail_all(message)
