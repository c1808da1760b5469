"""Data-parallel engine replicas on Ray, seen by the app as one EngineClient.

    app ──add_request──▶ DataParallelEngineClient ──route──▶ ReplicaRouter
                              │ (healthy replicas only)
                              ▼
              ReplicaClient 0 .. N-1 ──ZMQ (engine protocol)──▶ Ray actor per replica

Each request goes to one healthy replica (`ReplicaRouter`: load in
outstanding tokens, prefix affinity) and stays there: its deltas come back
on that replica's sockets and are routed to its sink, so the streaming
contract holds across the hop exactly as for one engine process. The
router hears each request's progress through a thin sink wrapper.

Faults stay local: a replica that dies or hangs ends its own open requests
(one EngineDeadError each) and only those; new requests go to the others at
once; its supervisor (one per replica, the app's `EngineSupervisor`) brings
it back with backoff, and the router forgets its cached prefixes. The client
is alive while one replica is, so the app's own supervisor never restarts
the whole set (`can_restart` is False); `/health` reads `replicas()`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from itertools import zip_longest

from sluice.config import DataParallelConfig, EngineConfig
from sluice.engine.client_base import DeltaSink, EngineClient, ReplicaState
from sluice.engine.engine_request import EngineRequest, Generation
from sluice.engine.messages import EngineReady, EngineStatsSnapshot
from sluice.engine.outputs import RequestDelta
from sluice.engine.supervisor import EngineSupervisor
from sluice.errors import EngineDeadError
from sluice.scaleout import ray_cluster
from sluice.scaleout.replica_client import ReplicaClient
from sluice.scaleout.router import ReplicaRouter

logger = logging.getLogger("sluice.scaleout")


class DataParallelEngineClient(EngineClient):
    can_restart = False

    def __init__(self, config: EngineConfig, data_parallel: DataParallelConfig):
        assert data_parallel.num_replicas >= 1, "at least one replica"
        ray_cluster.import_ray()  # no Ray: one clear error now, before anything starts
        self.data_parallel = data_parallel
        replica_config = replica_engine_config(config, data_parallel)
        self.replica_clients = [
            ReplicaClient(str(i), replica_config, data_parallel)
            for i in range(data_parallel.num_replicas)
        ]
        self.router = ReplicaRouter(len(self.replica_clients), config.cache.block_size_tokens)
        self._supervisors = [
            EngineSupervisor(replica, "restart", on_exit=_never) for replica in self.replica_clients
        ]
        # Starts of each replica the router knows of (a restart empties its cache).
        self._num_starts_seen = [0] * len(self.replica_clients)
        self._started_ray = False

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        self._started_ray = await asyncio.to_thread(ray_cluster.connect, self.data_parallel)
        results = await asyncio.gather(
            *(replica.start() for replica in self.replica_clients), return_exceptions=True
        )
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            await self.shutdown()
            raise failures[0]
        for supervisor in self._supervisors:
            supervisor.start()

    async def shutdown(self) -> None:
        for supervisor in self._supervisors:
            await supervisor.stop()
        await asyncio.gather(*(replica.shutdown() for replica in self.replica_clients))
        if self._started_ray:
            self._started_ray = False
            await asyncio.to_thread(ray_cluster.disconnect)

    # -- requests --------------------------------------------------------------

    def add_request(self, request: EngineRequest, sink: DeltaSink) -> None:
        if not isinstance(request.payload, Generation):
            raise NotImplementedError("data-parallel replicas serve no pooling model")
        healthy = self._healthy_replicas()
        if not healthy:
            raise EngineDeadError("no engine replica is running")
        request_id, payload = request.request_id, request.payload
        index = self.router.route(
            request_id, payload.prompt_token_ids, payload.params.max_tokens, healthy
        )
        try:
            self.replica_clients[index].add_request(
                request, _RoutedSink(self.router, request_id, sink)
            )
        except BaseException:
            self.router.finish(request_id)
            raise

    def abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            index = self.router.replica_of(request_id)
            if index is not None:
                self.router.finish(request_id)
                self.replica_clients[index].abort([request_id])

    def reset_prefix_cache(self) -> None:
        for replica in self.replica_clients:
            replica.reset_prefix_cache()

    def _healthy_replicas(self) -> list[int]:
        healthy = []
        for index, replica in enumerate(self.replica_clients):
            if replica.num_starts != self._num_starts_seen[index]:
                self._num_starts_seen[index] = replica.num_starts
                self.router.forget(index)  # it restarted: its cache is empty
            if replica.is_alive:
                healthy.append(index)
        return healthy

    # -- state -----------------------------------------------------------------

    @property
    def info(self) -> EngineReady | None:
        """The first replica's: every replica loads the same model config."""
        return self.replica_clients[0].info

    @property
    def is_alive(self) -> bool:
        return any(replica.is_alive for replica in self.replica_clients)

    def stats(self) -> EngineStatsSnapshot:
        """The healthy replicas' state summed (KV use: their mean)."""
        snapshots = [self._stats_of(replica) for replica in self.replica_clients]
        num_healthy = sum(replica.is_alive for replica in self.replica_clients)
        return EngineStatsSnapshot(
            num_running=sum(s.num_running for s in snapshots),
            num_waiting=sum(s.num_waiting for s in snapshots),
            kv_cache_usage=sum(s.kv_cache_usage for s in snapshots) / max(1, num_healthy),
            kv_cache_written_bytes=sum(s.kv_cache_written_bytes for s in snapshots),
            prefix_cache_queried_tokens=sum(s.prefix_cache_queried_tokens for s in snapshots),
            prefix_cache_hit_tokens=sum(s.prefix_cache_hit_tokens for s in snapshots),
            num_preemptions=sum(s.num_preemptions for s in snapshots),
            spec_decode_num_drafts=sum(s.spec_decode_num_drafts for s in snapshots),
            spec_decode_num_draft_tokens=sum(s.spec_decode_num_draft_tokens for s in snapshots),
            spec_decode_num_accepted_tokens=sum(
                s.spec_decode_num_accepted_tokens for s in snapshots
            ),
            spec_decode_num_accepted_tokens_per_pos=tuple(
                map(
                    sum,
                    zip_longest(
                        *(s.spec_decode_num_accepted_tokens_per_pos for s in snapshots), fillvalue=0
                    ),
                )
            ),
        )

    @staticmethod
    def _stats_of(replica: ReplicaClient) -> EngineStatsSnapshot:
        # A dead replica's last snapshot is stale: it runs nothing now, and its
        # counters start again from zero when it comes back.
        return replica.stats() if replica.is_alive else EngineStatsSnapshot()

    def replicas(self) -> list[ReplicaState]:
        states = []
        for replica, load in zip(self.replica_clients, self.router.loads, strict=True):
            states.append(ReplicaState(
                name=replica.name,
                node="" if replica.address is None else replica.address.node_ip,
                is_healthy=replica.is_alive,
                num_requests_routed=load.num_requests_routed,
                num_routed_by_prefix=load.num_routed_by_prefix,
                num_outstanding_tokens=load.num_outstanding_tokens,
                num_restarts=max(0, replica.num_starts - 1),
                stats=self._stats_of(replica),
            ))  # fmt: skip
        return states


class _RoutedSink:
    """Tells the router of a request's progress, then hands on to the real sink."""

    __slots__ = ("_router", "_request_id", "_sink")

    def __init__(self, router: ReplicaRouter, request_id: str, sink: DeltaSink):
        self._router = router
        self._request_id = request_id
        self._sink = sink

    def on_delta(self, delta: RequestDelta) -> None:
        self._router.on_delta(delta)
        self._sink.on_delta(delta)

    def on_error(self, error: BaseException) -> None:
        self._router.finish(self._request_id)
        self._sink.on_error(error)


def replica_engine_config(config: EngineConfig, data_parallel: DataParallelConfig) -> EngineConfig:
    """Each replica's engine: its own process already (the actor), torch
    threads matching the CPUs Ray gave it unless set."""
    num_threads = config.num_threads
    if num_threads is None:
        num_threads = max(1, math.floor(data_parallel.replica_cpus))
    return dataclasses.replace(config, multiprocess=True, num_threads=num_threads)


def _never() -> None:
    raise AssertionError("replica supervisors restart; they never exit")
