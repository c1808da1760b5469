"""The engine client for an engine core in its own process (the default).

The event loop and the model never compete for the GIL: the engine process
steps the model, this client lives on the event loop and speaks the engine
protocol over ZMQ on ipc sockets it binds (`zmq_client.ZmqEngineClient`).
If the engine process dies, the loop learns it at once through the process
sentinel (no polling) and every open request gets EngineDeadError. If it
hangs, the missing heartbeat gets it killed, which is then the same case.
`restart()` replaces a dead engine with a fresh process on fresh sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import tempfile
import uuid
from pathlib import Path

from sluice.config import EngineConfig
from sluice.engine.core_process import run_engine_process
from sluice.engine.messages import Shutdown
from sluice.engine.zmq_client import ZmqEngineClient


class MultiprocessEngineClient(ZmqEngineClient):
    def __init__(self, config: EngineConfig):
        super().__init__(config.heartbeat_timeout_s)
        self.config = config
        self._process: multiprocessing.process.BaseProcess | None = None
        self._socket_dir = Path(tempfile.mkdtemp(prefix="sluice-"))

    async def _launch(self) -> None:
        token = uuid.uuid4().hex[:8]
        input_address = f"ipc://{self._socket_dir}/in-{token}"
        output_address = f"ipc://{self._socket_dir}/out-{token}"
        self._open_sockets(input_address, output_address, bind=True)
        spawn = multiprocessing.get_context("spawn")
        self._process = spawn.Process(
            target=run_engine_process,
            args=(self.config, input_address, output_address),
            name="sluice-engine",
            daemon=True,
        )
        self._process.start()

    def _exit_reason(self) -> str | None:
        if self._process.is_alive():
            return None
        return f"engine process exited with code {self._process.exitcode}"

    def _on_running(self) -> None:
        asyncio.get_running_loop().add_reader(self._process.sentinel, self._on_process_exit)

    def kill(self) -> None:
        """SIGKILL the engine process now (a forced exit); its death is reported as usual."""
        if self._process is not None and self._process.is_alive():
            self._process.kill()

    async def shutdown(self) -> None:
        if self._process is not None and self._process.is_alive():
            asyncio.get_running_loop().remove_reader(self._process.sentinel)
            self._send(Shutdown())
            await asyncio.to_thread(self._process.join, 10)
        await super().shutdown()

    async def _dispose(self) -> None:
        if self._process is not None and self._process.pid is not None:  # it was started
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self._process.sentinel)
            if self._process.is_alive():
                self._process.kill()
            await asyncio.to_thread(self._process.join, 10)
            with contextlib.suppress(ValueError):
                self._process.close()
        self._process = None

    def _on_process_exit(self) -> None:
        if self._process is None:
            return
        asyncio.get_running_loop().remove_reader(self._process.sentinel)
        self._process.join(0)  # reap it, so its exit code is known
        self._mark_dead(f"the engine process exited (code {self._process.exitcode})")
