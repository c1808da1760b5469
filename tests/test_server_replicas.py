"""/health and /metrics of an engine with replicas, through the real app.

The engine is the fake engine with a replica list the test sets (the
data-parallel client answers `replicas()` the same way); a single engine
keeps its plain /health.
"""

from __future__ import annotations

import httpx2
import pytest

from sluice.engine.client_base import ReplicaState
from sluice.engine.messages import EngineStatsSnapshot
from sluice.testing.fake_engine import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer


class ReplicatedFakeEngine(FakeEngine):
    """The fake engine, reporting the replicas a test gives it."""

    def __init__(self) -> None:
        super().__init__()
        self.replica_states: list[ReplicaState] = []

    def replicas(self) -> list[ReplicaState]:
        return self.replica_states


def replica(name: str, *, is_healthy: bool = True, routed: int = 0) -> ReplicaState:
    stats = EngineStatsSnapshot(num_running=2, num_waiting=1, kv_cache_usage=0.25)
    return ReplicaState(name, "10.0.0.7", is_healthy, routed, 1, 40, 3, stats)


@pytest.fixture(scope="module")
def live():
    with LiveServer(ReplicatedFakeEngine(), ChatFakeTokenizer()) as server:
        yield server


def test_a_single_engine_keeps_its_plain_health(live):
    live.engine.replica_states = []
    response = httpx2.get(live.url + "/health")
    assert response.status_code == 200 and response.content == b""


def test_all_replicas_healthy_is_ok_with_the_count(live):
    live.engine.replica_states = [replica("0"), replica("1")]
    response = httpx2.get(live.url + "/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "healthy_replicas": 2, "replicas": 2}


def test_one_replica_down_is_degraded_but_still_200(live):
    live.engine.replica_states = [replica("0", is_healthy=False), replica("1"), replica("2")]
    response = httpx2.get(live.url + "/health")
    assert response.status_code == 200
    assert response.json() == {"status": "degraded", "healthy_replicas": 2, "replicas": 3}


def test_no_replica_up_is_503_with_retry_after(live):
    live.engine.replica_states = [replica("0", is_healthy=False), replica("1", is_healthy=False)]
    response = httpx2.get(live.url + "/health")
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert "0 of 2" in response.json()["error"]["message"]


def test_metrics_have_one_series_per_replica(live):
    live.engine.replica_states = [replica("0", routed=5), replica("1", is_healthy=False, routed=9)]
    text = httpx2.get(live.url + "/metrics").text
    for line in (
        'sluice:replica_healthy{node="10.0.0.7",replica="0"} 1.0',
        'sluice:replica_healthy{node="10.0.0.7",replica="1"} 0.0',
        'sluice:replica_requests_routed_total{replica="0"} 5.0',
        'sluice:replica_requests_routed_total{replica="1"} 9.0',
        'sluice:replica_requests_routed_by_prefix_total{replica="1"} 1.0',
        'sluice:replica_outstanding_tokens{replica="0"} 40.0',
        'sluice:replica_num_requests_running{replica="1"} 2.0',
        'sluice:replica_num_requests_waiting{replica="1"} 1.0',
        'sluice:replica_kv_cache_usage_perc{replica="0"} 0.25',
        'sluice:replica_restarts_total{replica="0"} 3.0',
    ):
        assert line in text.splitlines(), line


def test_a_single_engine_has_no_replica_series(live):
    live.engine.replica_states = []
    assert "sluice:replica_" not in httpx2.get(live.url + "/metrics").text
