"""One engine replica: an engine core inside a Ray actor, on whichever node Ray chose.

Ray places the actor, restarts it if it dies (its constructor runs again in
a fresh process) and tells the frontend when it is gone (its pending `serve`
call fails). Ray carries nothing per step: `bind` opens the engine's two ZMQ
sockets on the node's address and returns them, and `serve` runs the engine
loop of the engine process (`core_process.serve_engine`) on them until
Shutdown, so the per-step data plane is the engine protocol over TCP.

Unlike the engine process, the replica binds and the frontend connects: the
frontend can reach a node's address, the node need not know the frontend's.
Ray is imported only inside the actor (`ray_cluster`), which wraps the class.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import zmq

from sluice.config import EngineConfig
from sluice.engine.core_process import serve_engine
from sluice.scaleout import ray_cluster


@dataclass(frozen=True, slots=True)
class ReplicaAddress:
    """Where a replica listens; the value `bind` returns through Ray."""

    # tcp://node-ip:port of the engine's PULL socket (requests go here).
    input_address: str
    # tcp://node-ip:port of the engine's PUSH socket (step outputs come from here).
    output_address: str
    node_ip: str
    # Ray's id of the node.
    node_id: str
    # The actor's process (for logs, and for tests that kill it).
    pid: int


class EngineReplica:
    """The actor's class: `bind()` once, then `serve()` until the engine stops."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.node_ip = ray_cluster.node_ip_address()
        self._context = zmq.Context()
        self._inputs: zmq.Socket | None = None
        self._outputs: zmq.Socket | None = None

    def bind(self) -> ReplicaAddress:
        """Open the engine's sockets on free ports of this node."""
        assert self._inputs is None, "a replica binds once per process"
        self._inputs = self._context.socket(zmq.PULL)
        self._outputs = self._context.socket(zmq.PUSH)
        base = f"tcp://{self.node_ip}"
        input_port = self._inputs.bind_to_random_port(base)
        output_port = self._outputs.bind_to_random_port(base)
        return ReplicaAddress(f"{base}:{input_port}", f"{base}:{output_port}",
                              self.node_ip, ray_cluster.node_id(), os.getpid())  # fmt: skip

    def serve(self) -> None:
        """Load the model, say ready, step until Shutdown (blocks the actor meanwhile)."""
        assert self._inputs is not None, "bind before serve"
        try:
            serve_engine(self.config, self._inputs, self._outputs)
        finally:
            self._outputs.close(linger=1000)
            self._inputs.close(linger=0)
