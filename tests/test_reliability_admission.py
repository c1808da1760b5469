"""Admission control under overload: a bounded queue, queue timeouts, draining.

The issue's scenario (500 streams against a queue of 64) is scaled to 200
streams against 8 running + 16 waiting, on the fake engine in its own
process: the overflow gets 503 + Retry-After at once and every accepted
stream completes exactly (contract I1-I5). The gate's own rules are then
checked one by one on a fake engine in this process, in virtual time
(`run_in_virtual_time`): a timeout and an engine step land exactly when
they are due, whatever the machine's load.
"""

from __future__ import annotations

import asyncio
import statistics
import threading

import aiohttp
import httpx2
import orjson
import pytest

from sluice.config import EngineConfig, SchedulerConfig
from sluice.engine.client_base import QueueTimeout
from sluice.engine.engine_request import generation_request
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import EngineDeadError, InvalidRequestError, QueueFullError
from sluice.server.in_flight.admission import (
    QUEUE_TIMEOUT_HEADER,
    AdmissionGate,
    QueueTimeoutError,
    ShuttingDownError,
    queue_timeout_s,
)
from sluice.testing import FakeEngine
from sluice.testing.contract import Expectations, check_stream
from sluice.testing.event_loops import run, run_in_virtual_time
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME, LiveServer
from sluice.testing.recording_sink import RecordingSink
from sluice.testing.server_process import ServerProcess
from sluice.testing.stream_reader import completion_body, read_stream

# The label of the one model the servers here serve.
MODEL = f'model_name="{DEFAULT_MODEL_NAME}"'

NUM_STREAMS = 200
MAX_NUM_SEQS = 8
MAX_WAITING = 16
STREAM_TOKENS = 40
PARAMS = SamplingParams(max_tokens=5)


def test_overflow_gets_503_at_once_and_every_accepted_stream_completes_exactly(tmp_path):
    server = ServerProcess(
        "--max-num-seqs", str(MAX_NUM_SEQS), "--max-waiting-requests", str(MAX_WAITING),
        "--step-interval-s", "0.02", log_path=tmp_path / "server.log",
    )  # fmt: skip

    async def go() -> tuple[str, list]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            url = server.url + "/v1/completions"
            reference = await read_stream(
                session, url, completion_body(STREAM_TOKENS, stream=False)
            )
            expected_text = orjson.loads(reference.body)["choices"][0]["text"]
            body = completion_body(STREAM_TOKENS) | {"stream_options": {"include_usage": True}}
            records = await asyncio.gather(
                *(read_stream(session, url, body) for _ in range(NUM_STREAMS))
            )
            return expected_text, records

    with server:
        expected_text, records = run(go())
        metrics = httpx2.get(server.url + "/metrics").text
    accepted = [r for r in records if r.status == 200]
    refused = [r for r in records if r.status != 200]
    # Every slot was used, and everything beyond them was refused.
    assert len(accepted) >= MAX_NUM_SEQS + MAX_WAITING and refused
    expect = Expectations(kind="completion", num_choices=1, include_usage=True)
    for record in accepted:
        result = check_stream(record.raw, expect)  # wire, I1-I5, [DONE] last
        assert result.error is None
        assert result.choices[0].text == expected_text
        assert result.choices[0].finish_reason == "length"
        assert result.usage["completion_tokens"] == STREAM_TOKENS
    for record in refused:
        assert record.status == 503 and record.headers["Retry-After"] == "1"
        assert "queue is full" in orjson.loads(record.body)["error"]["message"]
    # At once: a refusal waited for no slot. Waiting for one would take at least
    # the shortest accepted stream (40 engine steps of 20 ms: 0.8 s or more,
    # however slow the machine); the median refusal takes a small part of that.
    refusal_s = statistics.median(r.ended_s - r.sent_s for r in refused)
    shortest_accepted_s = min(r.ended_s - r.sent_s for r in accepted)
    assert refusal_s < shortest_accepted_s, (refusal_s, shortest_accepted_s)
    # Nothing stuck: every admitted request was released.
    assert f"sluice:num_requests_in_flight{{{MODEL}}} 0.0" in metrics
    assert (
        f'sluice:requests_refused_total{{{MODEL},reason="queue_full"}} {len(refused)}.0' in metrics
    )


# -- queue timeouts over HTTP ------------------------------------------------


@pytest.fixture(scope="module")
def slow_prefill():
    """A fake engine whose first token takes 100 steps of 10 ms."""
    engine = LoopFakeEngine(step_interval_s=0.01, prefill_steps=100)
    with LiveServer(engine, ChatFakeTokenizer()) as server:
        yield server


def test_a_stream_that_waits_past_its_queue_timeout_gets_a_503_naming_it(slow_prefill):
    async def go():
        async with aiohttp.ClientSession() as session:
            return await read_stream(
                session,
                slow_prefill.url + "/v1/completions",
                completion_body(5),
                headers={QUEUE_TIMEOUT_HEADER: "0.2"},
            )

    record = run(go())
    assert record.status == 503 and record.headers["Retry-After"] == "1"
    assert "queue timeout" in orjson.loads(record.body)["error"]["message"]
    # Not before its timeout; and before its first token (100 steps of at least
    # 10 ms each), which the engine never produced: the timeout cut it.
    assert record.ended_s - record.sent_s >= 0.2
    request_id = slow_prefill.engine.added_request_ids[-1]
    assert slow_prefill.engine.outputs[request_id] == []
    # The engine request was aborted, not left to run for nobody.
    assert request_id in slow_prefill.engine.aborted_request_ids


def test_a_chat_stream_past_its_queue_timeout_gets_a_503_too(slow_prefill):
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 5}

    async def go():
        async with aiohttp.ClientSession() as session:
            url = slow_prefill.url + "/v1/chat/completions"
            return await read_stream(session, url, body, headers={QUEUE_TIMEOUT_HEADER: "0.2"})

    record = run(go())
    # The role chunk waits for the first token (as vLLM's does), so nothing was sent.
    assert record.status == 503 and record.headers["Retry-After"] == "1"
    assert "queue timeout" in orjson.loads(record.body)["error"]["message"]


def test_a_request_within_its_queue_timeout_is_served_and_a_bad_one_is_a_400(slow_prefill):
    with httpx2.Client(base_url=slow_prefill.url, timeout=10) as http:
        body = completion_body(3, stream=False)
        served = http.post("/v1/completions", json=body, headers={QUEUE_TIMEOUT_HEADER: "5"})
        refused = http.post("/v1/completions", json=body, headers={QUEUE_TIMEOUT_HEADER: "soon"})
    assert served.status_code == 200
    assert served.json()["choices"][0]["finish_reason"] == "length"
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == QUEUE_TIMEOUT_HEADER


@pytest.mark.parametrize("value", ["5", "0.25", ".5", "86399.9"])
def test_a_queue_timeout_header_is_ascii_decimal_seconds(value):
    assert queue_timeout_s(value, None) == float(value)


@pytest.mark.parametrize(
    "value",
    [
        "soon", "", "0", "-1", "86400", "nan", "inf", "1e3", "+1", "1_000", "0x10", "5.",
        " 5", "\u00b2", "\u0661\u0662", "\uff15",  # "²", Arabic-Indic "١٢", fullwidth "５"
    ],
)  # fmt: skip
def test_any_other_queue_timeout_header_is_a_400_naming_it(value):
    with pytest.raises(InvalidRequestError) as error:
        queue_timeout_s(value, 5.0)
    assert error.value.param == QUEUE_TIMEOUT_HEADER


# -- the gate's rules, one by one ------------------------------------------------------


def test_the_gate_refuses_beyond_its_capacity_and_admits_again_once_one_ends():
    async def go() -> None:
        engine = FakeEngine(step_interval_s=0.01)
        gate = AdmissionGate(engine, capacity=2)
        sinks = [RecordingSink() for _ in range(3)]
        gate.add_request(generation_request("a", [5, 6], PARAMS), sinks[0])
        gate.add_request(generation_request("b", [5, 6], PARAMS), sinks[1])
        with pytest.raises(QueueFullError):
            gate.add_request(generation_request("c", [5, 6], PARAMS), sinks[2])
        assert "c" not in engine.added_request_ids and gate.num_in_flight == 2
        await sinks[0].done.wait()
        gate.add_request(generation_request("c", [5, 6], PARAMS), sinks[2])
        await asyncio.wait_for(asyncio.gather(sinks[1].done.wait(), sinks[2].done.wait()), 5)
        assert gate.num_in_flight == 0 and gate.num_refused["queue_full"] == 1

    run_in_virtual_time(go())


def test_an_aborted_request_frees_its_slot_and_its_sink_hears_nothing_more():
    async def go() -> None:
        engine = FakeEngine(step_interval_s=0.01)
        gate = AdmissionGate(engine, capacity=1)
        sink = RecordingSink()
        gate.add_request(generation_request("a", [5], SamplingParams(max_tokens=1000)), sink)
        await asyncio.sleep(0.05)
        gate.abort(["a"])
        assert gate.num_in_flight == 0
        num_heard = len(sink.deltas)
        await asyncio.sleep(0.05)  # the engine's final "abort" delta arrives now
        assert len(sink.deltas) == num_heard and not sink.errors
        assert "a" in engine.aborted_request_ids

    run_in_virtual_time(go())


def test_a_queue_timeout_fires_only_while_nothing_was_produced():
    async def go() -> None:
        loop = asyncio.get_running_loop()
        engine = FakeEngine(step_interval_s=0.01, prefill_steps=30)
        gate = AdmissionGate(engine, capacity=4)
        waiting, served = RecordingSink(), RecordingSink()
        gate.with_deadline(QueueTimeout(0.1)).add_request(
            generation_request("waiting", [5], PARAMS), waiting
        )
        await waiting.done.wait()
        # Cut at its timeout, long before its first token (30 steps: 0.3 s).
        assert loop.time() == pytest.approx(0.1)
        assert [type(e) for e in waiting.errors] == [QueueTimeoutError]
        assert "waiting" in engine.aborted_request_ids
        quick = FakeEngine(step_interval_s=0.05)
        gate = AdmissionGate(quick, capacity=4)
        added_s = loop.time()
        gate.with_deadline(QueueTimeout(0.08)).add_request(
            generation_request("served", [5], PARAMS), served
        )
        await served.done.wait()
        # Its first token came at 50 ms, in time; the other four took until
        # 250 ms, long past the 80 ms timeout: no error.
        assert loop.time() - added_s == pytest.approx(0.25)
        assert not served.errors and served.deltas[-1].finish_reason == "length"

    run_in_virtual_time(go())


def test_the_choices_of_one_api_request_share_their_queue_timeout_and_count_once():
    async def go() -> None:
        engine = FakeEngine(step_interval_s=0.01, prefill_steps=30)
        gate = AdmissionGate(engine, capacity=4)
        queue_timeout = QueueTimeout(0.1)
        sinks = [RecordingSink(), RecordingSink()]
        for request_id, sink in zip("ab", sinks, strict=True):
            gate.with_deadline(queue_timeout).add_request(
                generation_request(request_id, [5], PARAMS), sink
            )
        assert gate.num_in_flight == 2
        await asyncio.gather(*(sink.done.wait() for sink in sinks))
        assert all([type(e) for e in sink.errors] == [QueueTimeoutError] for sink in sinks)
        assert gate.num_refused["queue_timeout"] == 1 and gate.num_in_flight == 0
        assert queue_timeout.has_expired

    run_in_virtual_time(go())


def test_draining_refuses_new_requests_and_fail_all_tells_every_open_one_once():
    async def go() -> None:
        engine = FakeEngine(step_interval_s=0.01)
        gate = AdmissionGate(engine, capacity=8)
        sinks = [RecordingSink() for _ in range(3)]
        for index, sink in enumerate(sinks):
            gate.add_request(
                generation_request(f"r{index}", [5], SamplingParams(max_tokens=1000)), sink
            )
        gate.start_draining()
        with pytest.raises(ShuttingDownError):
            gate.add_request(generation_request("late", [5], PARAMS), RecordingSink())
        assert not await gate.wait_idle(0.05)
        assert gate.fail_all(ShuttingDownError("bye")) == 3
        await asyncio.sleep(0.05)
        assert all(len(s.errors) == 1 for s in sinks)
        assert await gate.wait_idle(0.01)
        assert set(engine.aborted_request_ids) == {"r0", "r1", "r2"}

    run_in_virtual_time(go())


def test_a_request_the_engine_refuses_takes_no_slot():
    async def go() -> None:
        engine = FakeEngine()
        engine.die()
        gate = AdmissionGate(engine, capacity=1)
        with pytest.raises(EngineDeadError):
            gate.add_request(generation_request("a", [5], PARAMS), RecordingSink())
        assert gate.num_in_flight == 0

    run_in_virtual_time(go())


# -- what one API request asks of the gate, over HTTP ----------------------------------


def _engine_config(max_num_seqs: int, max_waiting_requests: int) -> EngineConfig:
    scheduler = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_waiting_requests=max_waiting_requests
    )
    return EngineConfig(scheduler=scheduler)


def test_n_beyond_the_admission_capacity_is_a_400_naming_n_even_on_an_idle_server():
    engine = LoopFakeEngine()
    with (
        LiveServer(engine, ChatFakeTokenizer(), engine=_engine_config(4, 0)) as server,
        httpx2.Client(base_url=server.url, timeout=10) as http,
    ):
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        responses = [
            http.post("/v1/completions", json=completion_body(2, stream=False) | {"n": 5}),
            http.post("/v1/chat/completions", json=chat | {"n": 5, "stream": True}),
            # Two prompts of n=3 need six engine requests at once: never admissible.
            http.post(
                "/v1/completions",
                json=completion_body(2, stream=False) | {"prompt": ["a", "b"], "n": 3},
            ),
        ]
        fits = http.post("/v1/completions", json=completion_body(2, stream=False) | {"n": 4})
        metrics = http.get("/metrics").text
    for response in responses:
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "n" and "4" in error["message"]
    assert engine.added_request_ids == [f"{fits.json()['id']}-{i}" for i in range(4)]
    assert fits.status_code == 200 and len(fits.json()["choices"]) == 4
    # A request that can never be served is the client's error, not a refusal for load.
    assert f'sluice:requests_refused_total{{{MODEL},reason="queue_full"}} 0.0' in metrics


def test_refusals_count_once_per_api_request_whatever_its_n(slow_prefill):
    def refused(reason: str) -> float:
        metrics = httpx2.get(slow_prefill.url + "/metrics").text
        line = f'sluice:requests_refused_total{{{MODEL},reason="{reason}"}} '
        return float(metrics.split(line)[1].split()[0])

    before = refused("queue_timeout")
    with httpx2.Client(base_url=slow_prefill.url, timeout=10) as http:
        body = completion_body(3, stream=False) | {"n": 3}
        headers = {QUEUE_TIMEOUT_HEADER: "0.1"}
        responses = [http.post("/v1/completions", json=body, headers=headers) for _ in range(2)]
    assert [r.status_code for r in responses] == [503, 503]
    assert refused("queue_timeout") - before == 2


def test_a_full_queue_refuses_an_api_request_once_whatever_its_n():
    engine = LoopFakeEngine(step_interval_s=0.01, prefill_steps=1000)
    with (
        LiveServer(engine, ChatFakeTokenizer(), engine=_engine_config(2, 2)) as server,
        httpx2.Client(base_url=server.url, timeout=10) as http,
    ):
        # Three of four slots taken by a request that waits for its first token.
        holder = threading.Thread(
            target=http.post,
            args=("/v1/completions",),
            kwargs={"json": completion_body(2, stream=False) | {"n": 3}},
        )
        holder.start()
        engine.wait_until(lambda: len(engine.added_request_ids) == 3)
        refused = http.post("/v1/completions", json=completion_body(2) | {"n": 3})
        metrics = http.get("/metrics").text
        engine.die_threadsafe()
        holder.join(10)
    assert refused.status_code == 503 and "queue is full" in refused.json()["error"]["message"]
    # It was refused before any of its choices reached the engine.
    assert len(engine.added_request_ids) == 3
    assert f'sluice:requests_refused_total{{{MODEL},reason="queue_full"}} 1.0' in metrics
