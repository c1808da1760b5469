"""Disconnects over a real socket abort the engine request within one step.

The real server on the embedded model with the in-process engine, so the test
can watch the engine itself: `EngineLog` wraps the core's `step`,
`add_request` and `abort_requests` (all called on the engine thread) to count
steps and see when each abort is applied. Raw sockets let a client close at an
exact moment: mid-prefill (a long prompt, closed once its first prefill chunk
ran and before any token exists) and mid-decode (closed after a few chunks).
Each closed request must be aborted before the engine's second step after the
close (the step in flight may finish), its KV blocks returned, while two other
streams run on and finish exactly as their non-streamed twins do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable

import aiohttp
import orjson
import pytest

from sluice.config import CacheConfig, EngineConfig, SchedulerConfig
from sluice.engine.core import EngineCore
from sluice.engine.engine_request import EngineRequest
from sluice.engine.inproc_client import InProcessEngineClient
from sluice.engine.request import Request, RequestStatus
from sluice.frontend.output_processor import engine_request_id
from sluice.testing.contract import Expectations, check_stream, read_body
from sluice.testing.live_server import LiveServer

pytestmark = pytest.mark.slow

LONG_PROMPT_TOKENS = 2000
BYSTANDER_MAX_TOKENS = 24
VICTIM_MAX_TOKENS = 200
# The mid-decode victim closes after this many events.
NUM_EVENTS_BEFORE_CLOSE = 3
# How long anything may take before the test gives up waiting for it.
WAIT_S = 120.0
BYSTANDER_PROMPTS = ("The three primary colors are", "A good breakfast includes")
STREAM_EXPECT = Expectations("completion", 1, include_usage=True)
BODY_EXPECT = Expectations("completion", 1)


@dataclasses.dataclass(slots=True)
class AbortRecord:
    # Steps started before the abort was applied.
    num_steps_before: int
    # The aborted request as the engine held it, just before the abort.
    num_computed_tokens: int
    num_output_tokens: int
    # Other requests live in the engine at that moment.
    other_live_ids: set[str]
    # When the abort was applied (time.monotonic), and how many steps started
    # between the client's close and it (set by the test).
    applied_s: float = 0.0
    num_steps_after_close: int = -1


class EngineLog:
    """What the engine thread did: steps started, requests added, aborts applied."""

    def __init__(self, core: EngineCore):
        self.core = core
        self.num_steps = 0
        self.prompts: dict[str, list[int]] = {}
        self.aborts: dict[str, AbortRecord] = {}
        self._lock = threading.Lock()
        step, add, abort = core.step, core.add_request, core.abort_requests
        core.step = lambda: self._count(step)
        core.add_request = lambda request: self._add(add, request)
        core.abort_requests = lambda request_ids: self._abort(abort, request_ids)

    def _count(self, step: Callable[[], list]) -> list:
        self.num_steps += 1
        return step()

    def _add(self, add: Callable, request: EngineRequest) -> None:
        add(request)
        with self._lock:
            self.prompts[request.request_id] = list(request.payload.prompt_token_ids)

    def _abort(self, abort: Callable, request_ids: list[str]) -> list:
        records = {}
        for request_id in request_ids:
            request = self.core.scheduler.get_request(request_id)
            if request is not None:
                records[request_id] = self._record(request)
        deltas = abort(request_ids)
        for record in records.values():
            record.applied_s = time.monotonic()
        # Published only once applied: a reader seeing the record sees the blocks freed.
        with self._lock:
            self.aborts.update(records)
        return deltas

    def _record(self, request: Request) -> AbortRecord:
        live = self.core.scheduler.get_request
        with self._lock:
            others = {i for i in self.prompts if i != request.request_id and live(i)}
        return AbortRecord(
            num_steps_before=self.num_steps,
            num_computed_tokens=request.num_computed_tokens,
            num_output_tokens=request.num_output_tokens,
            other_live_ids=others,
        )

    def request_id_of(self, prompt: list[int]) -> str | None:
        with self._lock:
            return next((i for i, ids in self.prompts.items() if ids == prompt), None)

    def aborted(self, request_id: str) -> AbortRecord | None:
        with self._lock:
            return self.aborts.get(request_id)


@dataclasses.dataclass(slots=True)
class Engine:
    live: LiveServer
    core: EngineCore
    log: EngineLog
    model: str


@pytest.fixture(scope="module")
def engine(embedded_model_config):
    config = EngineConfig(
        model=dataclasses.replace(embedded_model_config, max_model_len=4096),
        cache=CacheConfig(kv_cache_memory_bytes=256 << 20),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16),
        multiprocess=False,
    )
    core = EngineCore(config)
    log = EngineLog(core)
    name = core.loaded.name
    live = LiveServer(
        InProcessEngineClient(core),
        core.loaded.tokenizer,
        model_name=name,
        max_model_len=core.max_model_len,
        startup_timeout_s=60,
    )
    with live:
        yield Engine(live, core, log, name)


async def wait_until(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.005)


async def open_stream(url: str, body: dict) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw HTTP/1.1 POST of `body` to /v1/completions; the response is not read."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = orjson.dumps(body)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    writer.write(head.encode() + payload)
    await writer.drain()
    return reader, writer


async def read_events(reader: asyncio.StreamReader, num_events: int) -> None:
    received = b""
    while received.count(b"data: ") < num_events:
        part = await reader.read(4096)
        assert part, "the server closed the stream early"
        received += part


async def close_and_await_abort(
    engine: Engine, writer: asyncio.StreamWriter, request_id: str
) -> AbortRecord:
    """Close the socket; the abort must come before the engine's second step after it."""
    log = engine.log
    num_steps_at_close = log.num_steps
    closed_s = time.monotonic()
    writer.close()
    await writer.wait_closed()
    await wait_until(
        lambda: log.aborted(request_id) or log.num_steps > num_steps_at_close + 1,
        f"{request_id} is aborted",
    )
    record = log.aborted(request_id)
    assert record is not None, f"{request_id} still ran two steps after its client left"
    # At most the step in flight at the close (or one started just as it closed).
    record.num_steps_after_close = record.num_steps_before - num_steps_at_close
    assert record.num_steps_after_close <= 1
    print(
        f"\n{request_id}: aborted {1000 * (record.applied_s - closed_s):.0f} ms after the close, "
        f"{record.num_steps_after_close} step(s) started in between"
    )
    return record


def check_blocks_freed(request: Request) -> None:
    assert request.status is RequestStatus.FINISHED_ABORTED
    assert request.block_ids == [], "an aborted request holds no KV block"


async def abort_mid_prefill(engine: Engine, prompt: list[int]) -> AbortRecord:
    body = {"model": engine.model, "prompt": prompt, "max_tokens": 8, "stream": True}
    _, writer = await open_stream(engine.live.url, body)
    await wait_until(lambda: engine.log.request_id_of(prompt), "the long prompt is added")
    request_id = engine.log.request_id_of(prompt)
    request = engine.core.scheduler.get_request(request_id)
    assert request is not None, "the request is live"
    await wait_until(lambda: request.num_computed_tokens > 0, "its prefill has started")
    record = await close_and_await_abort(engine, writer, request_id)
    check_blocks_freed(request)
    return record


async def abort_mid_decode(engine: Engine, prompt: list[int]) -> AbortRecord:
    body = {"model": engine.model, "prompt": prompt, "max_tokens": VICTIM_MAX_TOKENS,
            "ignore_eos": True, "stream": True}  # fmt: skip
    reader, writer = await open_stream(engine.live.url, body)
    await read_events(reader, NUM_EVENTS_BEFORE_CLOSE)
    request_id = engine.log.request_id_of(prompt)
    request = engine.core.scheduler.get_request(request_id)
    assert request is not None, "the request is still decoding"
    record = await close_and_await_abort(engine, writer, request_id)
    check_blocks_freed(request)
    return record


def bystander_request(model: str, prompt: str, stream: bool) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": BYSTANDER_MAX_TOKENS,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


async def post(session: aiohttp.ClientSession, url: str, body: dict) -> bytes:
    async with session.post(url + "/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        return await response.read()


def test_closed_streams_are_aborted_at_once_and_others_run_on_exactly(engine):
    tokenizer = engine.live.tokenizer
    long_prompt = tokenizer.encode("Tell me everything about rivers. " * 300)[:LONG_PROMPT_TOKENS]
    decode_prompt = tokenizer.encode("Count slowly from one to one hundred: one, two,")
    url, model = engine.live.url, engine.model

    async def scenario() -> tuple[AbortRecord, AbortRecord, list[bytes], list[bytes]]:
        async with aiohttp.ClientSession() as session:
            bystanders = [
                asyncio.create_task(post(session, url, bystander_request(model, p, stream=True)))
                for p in BYSTANDER_PROMPTS
            ]
            await wait_until(lambda: len(engine.log.prompts) == 2, "the bystanders are added")
            prefill = await abort_mid_prefill(engine, long_prompt)
            decode = await abort_mid_decode(engine, decode_prompt)
            streamed = await asyncio.gather(*bystanders)
            references = [
                await post(session, url, bystander_request(model, p, stream=False))
                for p in BYSTANDER_PROMPTS
            ]
        return prefill, decode, streamed, references

    prefill, decode, streamed, references = asyncio.run(asyncio.wait_for(scenario(), 600))
    # Mid-prefill: some of the prompt computed, not all, no token yet.
    assert 0 < prefill.num_computed_tokens < LONG_PROMPT_TOKENS
    assert prefill.num_output_tokens == 0
    # Mid-decode: a few tokens out, far from max_tokens.
    assert 0 < decode.num_output_tokens < VICTIM_MAX_TOKENS
    bystander_ids = set()
    for stream_body, reference_body in zip(streamed, references, strict=True):
        (choice,) = check_stream(stream_body, STREAM_EXPECT).choices
        (expected,) = read_body(reference_body, BODY_EXPECT).choices
        assert choice.text == expected.text and choice.finish_reason == "length"
        response_id = orjson.loads(stream_body[len(b"data: ") : stream_body.index(b"\n")])["id"]
        bystander_ids.add(engine_request_id(response_id, 0))
    # The bystanders were running beside both aborted requests.
    assert bystander_ids <= prefill.other_live_ids and bystander_ids <= decode.other_live_ids
    asyncio.run(wait_until(lambda: not engine.core.has_unfinished_requests(), "the engine idles"))
    # Every block is back in the pool, none lost or owned twice.
    assert engine.core.kv.num_free_blocks == engine.core.kv.num_blocks
    engine.core.kv.check_consistency()
