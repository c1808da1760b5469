"""Graceful shutdown of a real server process (fake engine): SIGTERM drains, SIGINT x2 exits.

SIGTERM during 20 running streams: new requests and /health get 503 at once;
the streams that can finish within the drain timeout finish normally; the
others get one error event and [DONE] when it expires, not before; then the
process exits 0. A second SIGINT exits at once, with the forced status: the
drain is not waited for. The drain's own rules run in virtual time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time

import aiohttp
import orjson
import pytest

from sluice.engine.engine_request import generation_request
from sluice.engine.sampling_params import SamplingParams
from sluice.server.http.shutdown import EXIT_FORCED, GracefulShutdown
from sluice.server.in_flight.admission import AdmissionGate
from sluice.testing import FakeEngine
from sluice.testing.contract import Expectations, check_stream
from sluice.testing.event_loops import run, run_in_virtual_time
from sluice.testing.recording_sink import RecordingSink
from sluice.testing.server_process import ServerProcess
from sluice.testing.stream_reader import completion_body, read_stream

DRAIN_TIMEOUT_S = 3.0
STEP_S = 0.02
SHORT_TOKENS = 40  # ~0.8 s: finishes inside the drain
LONG_TOKENS = 2000  # ~40 s: cut when the drain times out
NUM_EACH = 10


def start_server(tmp_path) -> ServerProcess:
    return ServerProcess(
        "--step-interval-s", str(STEP_S), "--drain-timeout-s", str(DRAIN_TIMEOUT_S),
        log_path=tmp_path / "server.log",
    )  # fmt: skip


async def open_streams(session, url: str, max_tokens: list[int]):
    """Start one stream per entry; return once each has its first token, with their tasks."""
    started = [asyncio.Event() for _ in max_tokens]
    tasks = [
        asyncio.create_task(
            read_stream(
                session,
                url + "/v1/completions",
                completion_body(n),
                on_event=lambda record, event=event: event.set(),
            )  # fmt: skip
        )
        for n, event in zip(max_tokens, started, strict=True)
    ]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
    return tasks


def test_sigterm_lets_running_streams_finish_cuts_the_rest_and_exits_0(tmp_path):
    server = start_server(tmp_path)

    async def go():
        async with aiohttp.ClientSession() as session:
            tasks = await open_streams(
                session, server.url, [SHORT_TOKENS] * NUM_EACH + [LONG_TOKENS] * NUM_EACH
            )
            signal_s = time.monotonic()
            server.signal(signal.SIGTERM)
            health_status = await health_once_draining(session, server.url)
            refused = await read_stream(session, server.url + "/v1/completions",
                                        completion_body(5))  # fmt: skip
            records = await asyncio.gather(*tasks)
        return signal_s, health_status, refused, records

    with server:
        signal_s, health_status, refused, records = run(go())
        exit_code = server.process.wait(DRAIN_TIMEOUT_S + 10)
        exited_s = time.monotonic()
    assert exit_code == 0, server.log()
    assert health_status == 503
    assert refused.status == 503 and refused.headers["Retry-After"] == "1"
    assert "shutting down" in orjson.loads(refused.body)["error"]["message"]
    expect = Expectations(kind="completion", num_choices=1)
    short, long = records[:NUM_EACH], records[NUM_EACH:]
    for record in short:
        result = check_stream(record.raw, expect)
        assert result.error is None and result.choices[0].finish_reason == "length"
    for record in long:
        # One error event, then [DONE]: when the drain timed out (not before),
        # and before the process exited.
        result = check_stream(record.raw, dataclasses.replace(expect, allows_error=True))
        assert "shutting down" in result.error["message"]
        assert signal_s + DRAIN_TIMEOUT_S <= record.ended_s <= exited_s


def test_a_second_sigint_exits_at_once(tmp_path):
    server = start_server(tmp_path)

    async def go() -> list:
        async with aiohttp.ClientSession() as session:
            tasks = await open_streams(session, server.url, [LONG_TOKENS] * 2)
            server.signal(signal.SIGINT)
            assert await health_once_draining(session, server.url) == 503
            server.signal(signal.SIGINT)
            return await asyncio.gather(*tasks)

    with server:
        records = run(go())
        exit_code = server.process.wait(10)
    # Forced: the exit did not wait for the drain (that would exit 0, and cut
    # the streams with an error event at the drain timeout).
    assert exit_code == EXIT_FORCED, server.log()
    for record in records:
        assert not record.is_done and record.error is None


async def health_once_draining(session: aiohttp.ClientSession, url: str) -> int:
    """/health's status once the server has started draining (it is 200 until then)."""
    while True:
        async with session.get(url + "/health") as health:
            if health.status != 200:
                return health.status
        await asyncio.sleep(0.01)


def test_a_drain_with_nothing_running_stops_the_server_at_once():
    async def go() -> None:
        loop = asyncio.get_running_loop()
        gate = AdmissionGate(FakeEngine(), capacity=4)
        stops = []
        shutdown = GracefulShutdown(gate, drain_timeout_s=30)
        shutdown.bind(stops.append)
        await shutdown.drain()
        assert stops == [False] and loop.time() == 0.0  # no wait at all
        assert gate.is_draining and shutdown.exit_code == 0 and shutdown.num_cut == 0

    run_in_virtual_time(go())


def test_a_drain_waits_for_a_request_that_finishes_in_time():
    async def go() -> None:
        gate = AdmissionGate(FakeEngine(step_interval_s=0.01), capacity=4)
        sink = RecordingSink()
        gate.add_request(generation_request("r", [5], SamplingParams(max_tokens=20)), sink)
        stops = []
        shutdown = GracefulShutdown(gate, drain_timeout_s=5)
        shutdown.bind(stops.append)
        await shutdown.drain()
        assert sink.deltas[-1].finish_reason == "length" and not sink.errors
        assert stops == [False] and shutdown.num_cut == 0
        assert asyncio.get_running_loop().time() == pytest.approx(0.2)  # 20 steps, no more

    run_in_virtual_time(go())


def test_exit_stops_the_server_at_once_with_the_status_given():
    async def go() -> None:
        gate = AdmissionGate(FakeEngine(), capacity=4)
        stops = []
        shutdown = GracefulShutdown(gate, drain_timeout_s=30)
        shutdown.bind(stops.append)
        shutdown.exit(1)
        assert stops == [False] and shutdown.exit_code == 1 and gate.is_draining

    run_in_virtual_time(go())
