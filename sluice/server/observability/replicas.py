"""What /health and /metrics show of an engine's replicas (data parallel, sluice/scaleout).

Both read `EngineClient.replicas()`; a single engine has none, and keeps
its plain /health (200 while alive, else 503).

/health with replicas: 200 while at least one serves, with
`{"status": "ok" | "degraded", "healthy_replicas": k, "replicas": n}`
("degraded" while some are down); 503 with the OpenAI error object when
none is.

/metrics, one series per replica (label `replica`, and `node` on the health
gauge): healthy, requests routed there (and of those, for prefix affinity),
outstanding tokens (the router's load), running and waiting requests, KV
cache use, restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.responses import Response

from sluice.engine.client_base import ReplicaState
from sluice.errors import EngineDeadError
from sluice.server.http.errors import unavailable_response


def replica_health(replicas: list[ReplicaState]) -> Response:
    """/health for an engine with replicas (a non-empty list)."""
    num_healthy = sum(replica.is_healthy for replica in replicas)
    if num_healthy == 0:
        return unavailable_response(
            EngineDeadError(f"no engine replica is running (0 of {len(replicas)})")
        )
    status = "ok" if num_healthy == len(replicas) else "degraded"
    body = {"status": status, "healthy_replicas": num_healthy, "replicas": len(replicas)}
    return Response(orjson.dumps(body), media_type="application/json")


class ReplicaCollector(Collector):
    """Per-replica series, read from the engine when Prometheus scrapes."""

    def __init__(self, replicas: Callable[[], list[ReplicaState]]):
        self._replicas = replicas

    def collect(self) -> Iterator[Metric]:
        replicas = self._replicas()
        if not replicas:
            return
        healthy = GaugeMetricFamily(
            "sluice:replica_healthy", "1 while the engine replica serves.",
            labels=["replica", "node"],
        )  # fmt: skip
        for replica in replicas:
            healthy.add_metric([replica.name, replica.node], float(replica.is_healthy))
        yield healthy
        yield from self._per_replica(replicas)

    def _per_replica(self, replicas: list[ReplicaState]) -> Iterator[Metric]:
        series = (
            (CounterMetricFamily, "sluice:replica_requests_routed",
             "Requests routed to the replica.", lambda r: r.num_requests_routed),
            (CounterMetricFamily, "sluice:replica_requests_routed_by_prefix",
             "Requests routed to the replica for their cached prefix.",
             lambda r: r.num_routed_by_prefix),
            (GaugeMetricFamily, "sluice:replica_outstanding_tokens",
             "Prompt tokens not yet prefilled plus max_tokens left (the router's load).",
             lambda r: r.num_outstanding_tokens),
            (GaugeMetricFamily, "sluice:replica_num_requests_running",
             "Requests in the replica's running batch.", lambda r: r.stats.num_running),
            (GaugeMetricFamily, "sluice:replica_num_requests_waiting",
             "Requests waiting in the replica.", lambda r: r.stats.num_waiting),
            (GaugeMetricFamily, "sluice:replica_kv_cache_usage_perc",
             "The replica's KV cache blocks in use, 0 to 1.", lambda r: r.stats.kv_cache_usage),
            (CounterMetricFamily, "sluice:replica_restarts",
             "Times the replica was replaced after a death or hang.", lambda r: r.num_restarts),
        )  # fmt: skip
        for family_type, name, documentation, value_of in series:
            family = family_type(name, documentation, labels=["replica"])
            for replica in replicas:
                family.add_metric([replica.name], value_of(replica))
            yield family
