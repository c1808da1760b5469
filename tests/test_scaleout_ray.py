"""Data-parallel replicas on a simulated two-node Ray cluster, through the real app.

`ray.cluster_utils.Cluster` starts two Ray nodes on this machine, one CPU
each; each replica asks for one CPU, so each node holds exactly one replica
(the tiny random model, float32, with a byte-level tokenizer). Streams go
over real sockets (LiveServer) and every one is held to the streaming
contract and to its non-streamed twin.

A replica's actor process killed mid-stream (SIGKILL, a crash): its own
streams end with one error event and [DONE], well before the heartbeat
could have noticed (a quarter of it, as in test_reliability_engine_death);
the other replica's streams finish exactly; /health says degraded (still
200) while the replica restarts; requests sent meanwhile all succeed; the
replica comes back and serves again. A frozen replica (SIGSTOP) is the
missing heartbeat's: killed, restarted, its streams ended the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import time

import aiohttp
import httpx2
import pytest

from sluice.config import (
    CacheConfig,
    DataParallelConfig,
    EngineConfig,
    ModelConfig,
)
from sluice.testing.contract import Expectations, check_stream, read_body
from sluice.testing.event_loops import run
from sluice.testing.live_server import LiveServer
from sluice.testing.stream_reader import read_stream
from sluice.tokenizer import Tokenizer

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.slow

HEARTBEAT_TIMEOUT_S = 60.0
HANG_TIMEOUT_S = 3.0
NOTICED_WITHIN_S = HEARTBEAT_TIMEOUT_S / 4
NODE_ARGS = {"num_cpus": 1, "object_store_memory": 80 << 20}
# A random model over a byte-level tokenizer writes random bytes: invalid
# UTF-8 decodes to U+FFFD in the full text too.
STREAM = Expectations(kind="completion", num_choices=1, logprobs=2, allows_replacement_char=True)
CUT_STREAM = dataclasses.replace(STREAM, allows_error=True)
PROMPTS = ["hello world", "the sluice gate", "a river", "streams of tokens",
           "one more prompt", "data parallel"]  # fmt: skip


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(
        initialize_head=True, head_node_args={**NODE_ARGS, "include_dashboard": False}
    )
    cluster.add_node(**NODE_ARGS)
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def live(cluster, tiny_folder):
    from sluice.scaleout.client import DataParallelEngineClient

    model = ModelConfig(model=str(tiny_folder), dtype="float32", quantization=None,
                        cache_dir=tiny_folder.parent / "cache")  # fmt: skip
    engine_config = EngineConfig(
        model=model,
        cache=CacheConfig(kv_cache_memory_bytes=8 << 20),
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
    )
    data_parallel = DataParallelConfig(num_replicas=2, ray_address=cluster.address)
    engine = DataParallelEngineClient(engine_config, data_parallel)
    tokenizer = Tokenizer.from_folder(tiny_folder)
    with LiveServer(engine, tokenizer, model_name=tiny_folder.name, max_model_len=256,
                    startup_timeout_s=300,
                    data_parallel=data_parallel) as server:  # fmt: skip
        yield server


def body(prompt: str, max_tokens: int, *, stream: bool = True) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream, "logprobs": 2}  # fmt: skip


def metric(live, name: str, replica: str) -> float:
    text = httpx2.get(live.url + "/metrics").text
    found = re.search(rf'^{re.escape(name)}{{[^}}]*replica="{replica}"[^}}]*}} (\S+)$', text, re.M)
    assert found, f"no {name} for replica {replica}"
    return float(found.group(1))


def assert_matches_its_twin(live, record, prompt: str, max_tokens: int) -> None:
    """The stream is whole, and equals the same request served alone, unstreamed."""
    streamed = check_stream(record.raw, STREAM)
    response = httpx2.post(live.url + "/v1/completions", json=body(prompt, max_tokens, stream=False),
                           timeout=120)  # fmt: skip
    assert response.status_code == 200
    alone = read_body(response.content, STREAM)
    assert streamed.choices[0].text == alone.choices[0].text
    assert streamed.choices[0].token_logprobs == pytest.approx(alone.choices[0].token_logprobs,
                                                               abs=1e-4)  # fmt: skip


async def open_streams(live, max_tokens: int, fault=None) -> list:
    """Stream every prompt at once; once each has tokens, apply `fault` (if any)."""
    started = [asyncio.Event() for _ in PROMPTS]

    def on_event(index):
        return lambda record: len(record.events) >= 2 and started[index].set()

    async with aiohttp.ClientSession() as session:
        url = live.url + "/v1/completions"
        tasks = [
            asyncio.create_task(
                read_stream(session, url, body(p, max_tokens), on_event=on_event(i))
            )
            for i, p in enumerate(PROMPTS)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 300)
        fault_s = time.monotonic()
        if fault is not None:
            fault()
        records = await asyncio.gather(*tasks)
    return fault_s, records


def test_requests_spread_over_both_nodes_and_every_stream_is_exact(live, cluster):
    addresses = [replica.address for replica in live.engine.replica_clients]
    node_ids = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    assert {address.node_id for address in addresses} == node_ids and len(node_ids) == 2
    _, records = run(open_streams(live, max_tokens=24))
    for prompt, record in zip(PROMPTS, records, strict=True):
        assert record.status == 200
        assert_matches_its_twin(live, record, prompt, 24)
    routed = [metric(live, "sluice:replica_requests_routed_total", r) for r in ("0", "1")]
    assert min(routed) >= 2 and sum(routed) == 2 * len(PROMPTS)  # streams and their twins
    health = httpx2.get(live.url + "/health")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "healthy_replicas": 2, "replicas": 2}
    assert metric(live, "sluice:replica_healthy", "1") == 1.0
    assert metric(live, "sluice:replica_outstanding_tokens", "0") == 0.0


def test_a_killed_replica_ends_only_its_own_streams_then_serves_again(live):
    victim = live.engine.replica_clients[0]
    open_on_victim = []

    def kill_replica_0() -> None:
        open_on_victim.append(victim.num_open_requests)
        os.kill(victim.address.pid, signal.SIGKILL)

    old_pid = victim.address.pid
    fault_s, records = run(open_streams(live, max_tokens=200, fault=kill_replica_0))
    health = httpx2.get(live.url + "/health")  # at once: the restart loads a model
    cut = [record for record in records if record.error is not None]
    whole = [(p, record) for p, record in zip(PROMPTS, records, strict=True) if not record.error]
    assert len(cut) == open_on_victim[0] and 1 <= len(cut) < len(PROMPTS)
    for record in cut:
        assert record.status == 200 and record.is_done
        assert check_stream(record.raw, CUT_STREAM).error["type"] == "service_unavailable"
        assert sum(e.startswith(b'data: {"error"') for e in record.events) == 1
        assert record.ended_s - fault_s < NOTICED_WITHIN_S, record.ended_s - fault_s
    assert health.status_code == 200
    assert health.json() == {"status": "degraded", "healthy_replicas": 1, "replicas": 2}
    # Sent while the replica restarts: every one is served (by the survivor, or by both).
    _, during = run(open_streams(live, max_tokens=8))
    assert all(check_stream(record.raw, STREAM) for record in during)
    for prompt, record in whole:
        assert_matches_its_twin(live, record, prompt, 200)
    assert_serves_again(live, victim, old_pid)


def test_a_frozen_replica_is_killed_by_the_heartbeat_then_serves_again(live):
    wait_until_healthy(live)
    victim = live.engine.replica_clients[1]
    old_pid = victim.address.pid

    def freeze_replica_1() -> None:
        os.kill(old_pid, signal.SIGSTOP)
        victim.heartbeat_timeout_s = HANG_TIMEOUT_S

    try:
        fault_s, records = run(open_streams(live, max_tokens=200, fault=freeze_replica_1))
    finally:
        victim.heartbeat_timeout_s = HEARTBEAT_TIMEOUT_S
        if _exists(old_pid):  # never leave a stopped process behind
            os.kill(old_pid, signal.SIGCONT)
    cut = [record for record in records if record.error is not None]
    assert 1 <= len(cut) < len(PROMPTS)
    for record in cut:
        assert check_stream(record.raw, CUT_STREAM).error["type"] == "service_unavailable"
        assert record.ended_s - fault_s < NOTICED_WITHIN_S, record.ended_s - fault_s
    for record in records:
        if record.error is None:
            check_stream(record.raw, STREAM)
    assert_serves_again(live, victim, old_pid)


def assert_serves_again(live, victim, old_pid: int) -> None:
    wait_until_healthy(live)
    assert victim.address.pid != old_pid
    name = victim.name
    assert metric(live, "sluice:replica_restarts_total", name) >= 1
    routed_before = metric(live, "sluice:replica_requests_routed_total", name)
    _, records = run(open_streams(live, max_tokens=8))
    assert all(check_stream(record.raw, STREAM) for record in records)
    assert metric(live, "sluice:replica_requests_routed_total", name) > routed_before


def wait_until_healthy(live, timeout_s: float = 300.0) -> None:
    """Poll /health until both replicas serve (a safety net, not a bound)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        health = httpx2.get(live.url + "/health")
        if health.status_code == 200 and health.json()["healthy_replicas"] == 2:
            return
        time.sleep(0.2)
    pytest.fail(f"the replicas did not come back: {health.text}")


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
