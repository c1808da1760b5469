"""Direct writes (sluice/frontend/direct_write.py): the stream's bytes are the
same whether its delta events are written directly or yielded, in the same
order; a refused write hands the rest back to the generator, lagging readers
still coalesce, the closing events and errors are always the generator's,
and nothing raised in the listener reaches the engine."""

from __future__ import annotations

import asyncio

import pytest

from sluice.engine.sampling_params import SamplingParams
from sluice.frontend import Frontend, GenerationRequest, PromptInput
from sluice.frontend.direct_write import DirectWrite
from sluice.testing import FakeEngine, FakeTokenizer
from sluice.testing.contract import Expectations, check_stream, parse_sse

TOKENIZER = FakeTokenizer()
WORDS = TOKENIZER.encode(" hello world 😀 語 ไทย abc")


def endless_words(request_id, prompt, params):
    while True:
        yield from WORDS


def make_request(**overrides) -> GenerationRequest:
    fields = {
        "kind": "chat",
        "response_id": "chatcmpl-7",
        "created": 1,
        "model_name": "tiny",
        "prompts": (PromptInput((5, 6), "p"),),
        "n": 2,
        "params": SamplingParams(max_tokens=30),
        "stream": True,
        "include_usage": True,
    }
    return GenerationRequest(**(fields | overrides))


class Wire:
    """The connection as the edge sees it: direct writes and yielded events,
    in arrival order. After `pause_after` direct writes the transport pauses:
    write_now refuses until the reader has waited for it to drain."""

    def __init__(self, pause_after: int | None = None) -> None:
        self.events: list[bytes] = []
        self.num_direct = 0
        self.num_yielded = 0
        self.is_paused = False
        self._pause_after = pause_after

    def write_now(self, event: bytes) -> bool:
        if self.num_direct == self._pause_after:
            self.is_paused = True
        if self.is_paused:
            return False
        self.events.append(event)
        self.num_direct += 1
        return True

    async def write(self, event: bytes) -> None:
        if self.is_paused:
            await asyncio.sleep(0.02)  # the client reads slowly; steps go on
            self.is_paused = False
            self._pause_after = None
        self.events.append(event)
        self.num_yielded += 1


async def run_stream(engine: FakeEngine, request: GenerationRequest, wire: Wire) -> bytes:
    """Consume as EventStreamResponse does: first event, then direct writes enabled."""
    direct = DirectWrite()
    stream = Frontend(engine, TOKENIZER).stream(request, direct)
    try:
        await wire.write(await anext(stream))
        direct.write = wire.write_now
        async for event in stream:
            await wire.write(event)
    finally:
        direct.write = None
        await stream.aclose()
    return b"".join(wire.events)


def reference_body(request: GenerationRequest) -> bytes:
    async def scenario() -> bytes:
        engine = FakeEngine(endless_words, step_interval_s=0.0005, seed=3)
        stream = Frontend(engine, TOKENIZER).stream(request)
        return b"".join([event async for event in stream])

    return asyncio.run(scenario())


def text_of(body: bytes, index: int) -> str:
    return "".join(
        choice["delta"].get("content") or ""
        for payload in parse_sse(body)
        if "choices" in payload
        for choice in payload["choices"]
        if choice["index"] == index
    )


@pytest.mark.parametrize("logprobs", [None, 2])
def test_direct_writes_make_the_same_stream_as_yielding(logprobs):
    request = make_request(
        params=SamplingParams(max_tokens=30, logprobs=logprobs),
        logprobs=logprobs,
        continuous_usage_stats=True,
    )
    wire = Wire()
    body = asyncio.run(
        run_stream(FakeEngine(endless_words, step_interval_s=0.0005, seed=3), request, wire)
    )
    check_stream(
        body,
        Expectations(
            "chat",
            2,
            has_logprobs=logprobs is not None,
            include_usage=True,
            continuous_usage_stats=True,
        ),
    )
    assert wire.num_direct > 10  # the delta events really went out directly
    expected = reference_body(request)
    for index in (0, 1):
        assert text_of(body, index) == text_of(expected, index) != ""
    # Closing events (usage, [DONE]) are always the generator's.
    assert wire.events[-1] == b"data: [DONE]\n\n"
    assert "usage" in parse_sse(wire.events[-2] + wire.events[-1])[0]


def test_a_refused_write_hands_the_rest_back_in_order_and_lagging_deltas_coalesce():
    request = make_request(params=SamplingParams(max_tokens=60))
    wire = Wire(pause_after=8)
    body = asyncio.run(
        run_stream(FakeEngine(endless_words, step_interval_s=0.0005, seed=3), request, wire)
    )
    check_stream(body, Expectations("chat", 2, include_usage=True))
    expected = reference_body(request)
    for index in (0, 1):
        assert text_of(body, index) == text_of(expected, index)
    usage = parse_sse(body)[-1]["usage"]
    assert usage["completion_tokens"] == 120
    # While writes were refused the deltas merged: fewer chunks than tokens.
    num_chunks = sum(1 for p in parse_sse(body) if "choices" in p and p["choices"])
    assert num_chunks < 120
    assert wire.num_yielded > 3 and wire.num_direct > 3


def test_an_error_in_the_listener_becomes_an_error_event_not_an_engine_failure(monkeypatch):
    from sluice.frontend.chat_chunks import ChatChunks

    original = ChatChunks.delta_event
    calls = {"n": 0}

    def failing(self, index, delta):
        calls["n"] += 1
        if calls["n"] == 12:
            raise RuntimeError("chunk building broke")
        return original(self, index, delta)

    monkeypatch.setattr(ChatChunks, "delta_event", failing)
    engine = FakeEngine(endless_words, step_interval_s=0.0005, seed=3)
    body = asyncio.run(run_stream(engine, make_request(), Wire()))
    payloads = parse_sse(body)  # ends with [DONE]
    assert payloads[-1]["error"]["message"]
    assert engine.is_alive  # the engine's delivery loop never saw the error


def test_an_engine_death_while_parked_ends_the_stream_with_an_error_event():
    async def scenario() -> bytes:
        engine = FakeEngine(endless_words, step_interval_s=0.0005, seed=3)
        asyncio.get_running_loop().call_later(0.01, engine.die)
        return await run_stream(
            engine, make_request(params=SamplingParams(max_tokens=100_000)), Wire()
        )

    payloads = parse_sse(asyncio.run(scenario()))  # ends with [DONE]
    assert payloads[-1]["error"]["type"] == "service_unavailable"


def test_without_a_writer_set_the_generator_yields_everything():
    async def scenario() -> tuple[bytes, Wire]:
        engine = FakeEngine(endless_words, step_interval_s=0.0005, seed=3)
        stream = Frontend(engine, TOKENIZER).stream(make_request(), DirectWrite())
        wire = Wire()
        async for event in stream:
            await wire.write(event)
        return b"".join(wire.events), wire

    body, wire = asyncio.run(scenario())
    check_stream(body, Expectations("chat", 2, include_usage=True))
    assert wire.num_direct == 0
