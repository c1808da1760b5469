"""One engine replica seen from the event loop: a Ray actor behind the engine protocol.

Start: ask the actor to `bind` (Ray returns its node's two addresses),
connect to them, call `serve` (which loads the model and answers
EngineReady over ZMQ, as the engine process does). From then on Ray carries
nothing but the pending `serve` call, which is how the replica's death is
told: it fails when the actor's process dies. A dropped TCP connection ends
the replica at once too: a message lost with it would break a stream, so
the replica is replaced instead. A hang is the missing heartbeat, as for the
engine process; the actor is then killed for Ray to restart.

`restart()` reconnects to the actor Ray restarted (or, once Ray has given up
on it, to a new actor), on fresh sockets. Every death ends the replica's open
requests once with EngineDeadError (zmq_client), and only those.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import zmq

from sluice.config import DataParallelConfig, EngineConfig
from sluice.engine.messages import Shutdown
from sluice.engine.zmq_client import STARTUP_TIMEOUT_S, ZmqEngineClient
from sluice.errors import ModelLoadError
from sluice.scaleout import ray_cluster
from sluice.scaleout.replica_actor import EngineReplica, ReplicaAddress

logger = logging.getLogger("sluice.scaleout")

SHUTDOWN_WAIT_S = 10.0
# How long a replica's death may take to reach us through Ray.
DEATH_REPORT_S = 5.0
BIND_RETRY_S = 0.2


class ReplicaClient(ZmqEngineClient):
    def __init__(self, name: str, config: EngineConfig, data_parallel: DataParallelConfig):
        super().__init__(config.heartbeat_timeout_s)
        self.name = name
        self.config = config
        self.data_parallel = data_parallel
        self.address: ReplicaAddress | None = None
        self._actor: Any = None
        # The actor's pending `serve` call: done means the replica is gone.
        self._serving: asyncio.Future | None = None
        self._is_shutting_down = False
        # Times the replica came up (its first start, then each restart).
        self.num_starts = 0

    # -- ZmqEngineClient ---------------------------------------------------------

    async def _launch(self) -> None:
        self.address = await self._bind()
        self._open_sockets(self.address.input_address, self.address.output_address, bind=False)
        self._serving = asyncio.ensure_future(_result(self._actor.serve.remote()))
        logger.info("replica %s on %s (pid %d) is loading the model", self.name,
                    self.address.node_ip, self.address.pid)  # fmt: skip

    def _exit_reason(self) -> str | None:
        if not self._serving.done():
            return None
        return f"replica {self.name} stopped while starting: {_outcome(self._serving)}"

    def _on_running(self) -> None:
        self.num_starts += 1
        self._serving.add_done_callback(self._on_serve_end)
        self._tasks.append(
            asyncio.create_task(self._watch_connection(), name=f"sluice-replica-{self.name}")
        )

    def kill(self) -> None:
        """Kill the actor's process; Ray restarts it (a crash, as far as Ray knows)."""
        if self._actor is not None:
            ray_cluster.kill(self._actor, restart=not self._is_shutting_down)

    async def _dispose(self) -> None:
        serving, self._serving = self._serving, None
        if serving is None:
            return
        if not serving.done() and not self._is_shutting_down:
            # Ray reports a dead actor within about a second; one that is still
            # serving then is alive but cut off, and a restart needs a fresh process.
            await asyncio.wait([serving], timeout=DEATH_REPORT_S)
        if not serving.done():
            self.kill()
        with contextlib.suppress(BaseException):
            await serving

    async def shutdown(self) -> None:
        self._is_shutting_down = True
        if self._serving is not None and self.is_alive:
            self._send(Shutdown())
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(self._serving), SHUTDOWN_WAIT_S)
        await super().shutdown()
        if self._actor is not None:
            ray_cluster.kill(self._actor, restart=False)
            self._actor = None

    async def _bind(self) -> ReplicaAddress:
        """The replica's addresses: from its actor once Ray has it running,
        from a new actor when Ray has given up on the old one."""
        if self._actor is None:
            self._actor = ray_cluster.new_replica(EngineReplica, self.config, self.data_parallel)
        deadline_s = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                return await asyncio.wait_for(
                    _result(self._actor.bind.remote()), deadline_s - time.monotonic()
                )
            except TimeoutError as error:
                raise ModelLoadError(
                    f"replica {self.name} was not placed in {STARTUP_TIMEOUT_S:g} s: does the "
                    "cluster have the CPUs and GPUs it asks for (--replica-cpus, --replica-gpus)?"
                ) from error
            except ray_cluster.actor_unavailable_error() as error:
                # Ray is restarting it (its process died): ask again.
                if time.monotonic() > deadline_s:
                    raise ModelLoadError(f"replica {self.name} did not come back") from error
                await asyncio.sleep(BIND_RETRY_S)
            except ray_cluster.ray_errors() as error:
                # Ray gave up on this actor (its restarts are spent): the next try makes a new one.
                ray_cluster.kill(self._actor, restart=False)
                self._actor = None
                raise ModelLoadError(f"replica {self.name} did not start: {error}") from error

    # -- death -----------------------------------------------------------------

    def _on_serve_end(self, serving: asyncio.Future) -> None:
        if serving is self._serving and not self._is_shutting_down:
            self._mark_dead(f"replica {self.name} stopped: {_outcome(serving)}")

    async def _watch_connection(self) -> None:
        """End the replica when the TCP connection its outputs come on drops."""
        monitor = self._outputs.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            await monitor.recv_multipart()
            if not self._is_shutting_down:
                self._mark_dead(f"replica {self.name}: the connection to it was lost")
        finally:
            if self._outputs is not None:
                with contextlib.suppress(zmq.ZMQError):
                    self._outputs.disable_monitor()
            monitor.close(linger=0)


async def _result(object_ref: Any) -> Any:
    return await object_ref


def _outcome(serving: asyncio.Future) -> str:
    if serving.cancelled():
        return "cancelled"
    error = serving.exception()
    return "the engine loop ended" if error is None else f"{type(error).__name__}: {error}"
