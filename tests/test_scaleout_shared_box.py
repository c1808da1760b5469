"""The shared box on `--data-parallel 2`, built from `sluice serve`'s flags as
the CLI builds it: a local Ray instance (no --ray-address), two replica
actors of the tiny model, one seat each (--max-num-seqs 1), priority
scheduling, a key file with per-key limits and traces to an OTLP receiver.

- Priority: the `priority` field and the policy reach the replicas'
  schedulers. A high-priority request routed behind a crowd of low-priority
  ones finishes before any of the crowd on its replica (one seat: under fcfs
  it would wait for them all).
- Keys: the limits are the frontend's, whole-server: a key with
  max_concurrent 2 with one request in flight on each replica gets 429 for a
  third; its requests per minute count over both replicas; other keys are
  served; the key names (never the keys) label the request metrics.

The tiny model finishes a request faster than a test can react, so requests
are routed while the replica actors are stopped (SIGSTOP, then SIGCONT): the
router has placed them and they are in flight, in a known order.
- Traces: requests on both replicas each make one connected trace, the
  engine's spans (from the replica actors) inside the server's request span.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import signal
from collections.abc import Iterator

import aiohttp
import httpx2
import orjson
import pytest

from sluice.cli import build_parser, server_config_from
from sluice.config import ServerConfig
from sluice.frontend.output_processor import engine_request_id
from sluice.server.http.launch import build_data_parallel_engine
from sluice.testing.contract import Expectations, check_stream
from sluice.testing.live_server import LiveServer
from sluice.testing.otlp_receiver import OtlpReceiver
from sluice.testing.stream_reader import StreamRecord, read_stream

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

SECRETS = {"chat": "sk-dp-chat-1111", "batch": "sk-dp-batch-2222", "capped": "sk-dp-cap-3333"}
LONG, SHORT = 120, 8
STREAM = Expectations(kind="completion", num_choices=1, allows_replacement_char=True)
PHASES = {"receive", "queue", "prefill", "decode", "stream"}


class Clock:
    """The keys' rate windows: seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@dataclasses.dataclass
class Box:
    live: LiveServer
    clock: Clock
    receiver: OtlpReceiver
    # Engine request id -> the replica the router sent it to, in routing order.
    routes: dict[str, int]


@pytest.fixture(scope="module")
def box(tiny_folder, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"{SECRETS['chat']} name=chat\n{SECRETS['batch']} name=batch\n"
                        f"{SECRETS['capped']} name=capped max_concurrent=2 rpm=3\n")  # fmt: skip
    receiver = OtlpReceiver()
    argv = ["serve", "--model", str(tiny_folder), "--dtype", "float32", "--quantization", "none",
            "--activation-quantization", "none", "--max-model-len", "256",
            "--kv-cache-memory", str(8 << 20), "--max-num-seqs", "1",
            "--data-parallel", "2", "--scheduling-policy", "priority",
            "--api-key-file", str(key_file), "--otlp-traces-endpoint", receiver.url]  # fmt: skip
    config = server_config_from(build_parser().parse_args(argv))
    assembly = build_data_parallel_engine(config)
    routes = record_routes(assembly.engine)
    clock = Clock()
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(ServerConfig)
              if f.name not in ("host", "port")}  # fmt: skip
    try:
        with LiveServer(assembly.engine, assembly.model.tokenizer, model_name=assembly.model.name,
                        max_model_len=256, startup_timeout_s=300, clock=clock,
                        **fields) as live:  # fmt: skip
            yield Box(live, clock, receiver, routes)
    finally:
        receiver.close()


def record_routes(engine) -> dict[str, int]:
    """Where the router sends each request (a wrapper the test puts on it)."""
    routes: dict[str, int] = {}
    route = engine.router.route

    def recording(request_id, *args, **kwargs) -> int:
        routes[request_id] = index = route(request_id, *args, **kwargs)
        return index

    engine.router.route = recording
    return routes


def body(prompt: str, max_tokens: int, **fields) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, **fields}  # fmt: skip


def auth(key: str, **headers) -> dict:
    return {"Authorization": f"Bearer {SECRETS[key]}", **headers}


def engine_id_of(record: StreamRecord) -> str:
    return engine_request_id(orjson.loads(record.events[0][6:])["id"], 0)


# -- priority --------------------------------------------------------------------------


@contextlib.contextmanager
def replicas_frozen(box: Box) -> Iterator[None]:
    """Both replica actors stopped (SIGSTOP) meanwhile: whatever runs stays
    running, whatever is sent waits on their sockets."""
    pids = [replica.address.pid for replica in box.live.engine.replica_clients]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


async def when_routed(box: Box, num_routes: int) -> None:
    """Until the router has placed `num_routes` requests in all."""
    while len(box.routes) < num_routes:
        await asyncio.sleep(0.01)


def streams(session, url: str, bodies: list[tuple[dict, str]]) -> list[asyncio.Task]:
    return [asyncio.create_task(read_stream(session, url, fields, auth(key)))
            for fields, key in bodies]  # fmt: skip


async def crowd_then_chat(box: Box) -> tuple[list[StreamRecord], StreamRecord]:
    """Six low-priority streams, then a high-priority chat, all routed while
    the replicas are frozen: on each replica the chat comes behind its crowd."""
    url = box.live.url + "/v1/completions"
    async with aiohttp.ClientSession() as session:
        with replicas_frozen(box):
            num_routed = len(box.routes)
            crowd = [(body(f"batch job {i}", LONG, priority=5), "batch") for i in range(6)]
            crowd_tasks = streams(session, url, crowd)
            await when_routed(box, num_routed + len(crowd))
            (chat,) = streams(session, url, [(body("chat", SHORT, priority=-5), "chat")])
            await when_routed(box, num_routed + len(crowd) + 1)
        return list(await asyncio.gather(*crowd_tasks)), await chat


def test_a_high_priority_request_overtakes_the_crowd_on_its_replica(box):
    num_routed_before = len(box.routes)
    crowd, chat = asyncio.run(crowd_then_chat(box))
    for record in [*crowd, chat]:
        assert record.status == 200 and check_stream(record.raw, STREAM)
    order = list(box.routes)[num_routed_before:]
    assert set(order[:-1]) == set(map(engine_id_of, crowd)) and order[-1] == engine_id_of(chat)
    assert {box.routes[engine_id_of(record)] for record in crowd} == {0, 1}
    replica = box.routes[engine_id_of(chat)]
    on_its_replica = [r for r in crowd if box.routes[engine_id_of(r)] == replica]
    assert len(on_its_replica) == 3, "the router balances equal requests"
    # One seat: under fcfs the chat would wait for all three to finish. Under
    # priority it goes first (or preempts one that started as it came).
    assert all(chat.ended_s < record.ended_s for record in on_its_replica)


# -- keys and limits ---------------------------------------------------------------------


async def capped_pair_then_more(box: Box) -> tuple[list[StreamRecord], list[httpx2.Response]]:
    """Two streams on the capped key, then a third capped request and a chat
    one, all while the replicas are frozen (the pair is in flight)."""
    url = box.live.url + "/v1/completions"
    plain = {**body("more", 4), "stream": False}
    async with (
        aiohttp.ClientSession() as session,
        httpx2.AsyncClient(base_url=box.live.url, timeout=300) as client,
    ):
        with replicas_frozen(box):
            num_routed = len(box.routes)
            pair = streams(session, url, [(body(f"capped {i}", LONG), "capped") for i in range(2)])
            await when_routed(box, num_routed + 2)
            third = await client.post("/v1/completions", json=plain, headers=auth("capped"))
            other = asyncio.create_task(
                client.post("/v1/completions", json=plain, headers=auth("chat"))
            )
            await when_routed(box, num_routed + 3)  # admitted past its key's limits
        return list(await asyncio.gather(*pair)), [third, await other]


def assert_rate_limited(response: httpx2.Response, retry_after_s: int, says: str) -> None:
    assert response.status_code == 429, response.text
    assert response.headers["retry-after"] == str(retry_after_s)
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error" and says in error["message"]


def test_a_keys_limits_hold_across_both_replicas(box):
    pair, (third, other) = asyncio.run(capped_pair_then_more(box))
    assert {box.routes[engine_id_of(record)] for record in pair} == {0, 1}
    assert_rate_limited(third, retry_after_s=1, says="max_concurrent 2")
    assert other.status_code == 200
    for record in pair:
        assert record.status == 200 and check_stream(record.raw, STREAM)
    # Both slots are free again; the two streams and this one fill rpm=3.
    plain = {**body("again", 4), "stream": False}
    with httpx2.Client(base_url=box.live.url, timeout=300) as client:
        assert client.post("/v1/completions", json=plain, headers=auth("capped")).status_code == 200
        refused = client.post("/v1/completions", json=plain, headers=auth("capped"))
        assert_rate_limited(refused, retry_after_s=60, says="3 requests per minute")
        box.clock.now_s += 60
        assert client.post("/v1/completions", json=plain, headers=auth("capped")).status_code == 200
        metrics = client.get("/metrics").text
    for name in ("capped", "chat"):
        assert re.search(rf'^sluice:request_success_total{{[^}}]*key="{name}"', metrics, re.M)
    assert re.search(r'^vllm:prompt_tokens_total{key="capped"', metrics, re.M)
    for secret in SECRETS.values():
        assert secret not in metrics


# -- traces ------------------------------------------------------------------------------


async def traced_pair(box: Box, trace_ids: list[str]) -> list[StreamRecord]:
    url = box.live.url + "/v1/completions"
    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*(
            read_stream(session, url, body(f"traced {i}", 16, stream_options={"include_usage": True}),
                        auth("chat", traceparent=f"00-{trace_id}-00f067aa0ba902b7-01"))
            for i, trace_id in enumerate(trace_ids)
        )))  # fmt: skip


def test_requests_on_both_replicas_each_make_one_connected_trace(box):
    trace_ids = [f"{0xD0 + i:032x}" for i in range(2)]
    records = asyncio.run(traced_pair(box, trace_ids))
    assert {box.routes[engine_id_of(record)] for record in records} == {0, 1}
    expected = len(PHASES) + 1

    def spans_of(trace_id: str) -> list[tuple[str, object]]:
        return [(service, span) for service, span in box.receiver.spans
                if span.trace_id.hex() == trace_id]  # fmt: skip

    with box.receiver.received:
        assert box.receiver.received.wait_for(
            lambda: all(len(spans_of(t)) >= expected for t in trace_ids), 120
        ), [len(spans_of(t)) for t in trace_ids]
    for trace_id in trace_ids:
        spans = {span.name: (service, span) for service, span in spans_of(trace_id)}
        assert set(spans) == PHASES | {"POST /v1/completions"}
        assert len(spans_of(trace_id)) == expected  # each phase once
        request = spans["POST /v1/completions"][1]
        assert request.parent_span_id.hex() == "00f067aa0ba902b7"
        for phase in PHASES:
            service, span = spans[phase]
            assert span.parent_span_id == request.span_id, phase
            assert service == ("sluice-engine" if phase in ("queue", "prefill", "decode")
                               else "sluice-server")  # fmt: skip
        decode = {a.key: a.value for a in spans["decode"][1].attributes}
        assert decode["gen_ai.usage.output_tokens"].int_value == 16
