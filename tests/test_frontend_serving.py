"""The Frontend against the fake engine: cancellation, errors, seeds, observer, lag."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import orjson
import pytest

from sluice.engine.sampling_params import SamplingParams
from sluice.errors import EngineDeadError
from sluice.frontend import Frontend, GenerationRequest, PromptInput
from sluice.testing import FakeEngine, FakeTokenizer
from sluice.testing.contract import Expectations, check_stream, parse_sse, read_body
from sluice.testing.loop_stall import LoopStaller
from sluice.testing.manual_engine import ManualEngine
from sluice.testing.openai_chunks import openai_chunks

TOKENIZER = FakeTokenizer()
WORDS = TOKENIZER.encode(" hello world 😀 語 ไทย abc")


def endless_words(request_id, prompt, params):
    while True:
        yield from WORDS


def make_request(**overrides) -> GenerationRequest:
    fields = {
        "kind": "completion",
        "response_id": "cmpl-9" if overrides.get("kind") != "chat" else "chatcmpl-9",
        "created": 1,
        "model_name": "tiny",
        "prompts": (PromptInput((5, 6), "p"),),
        "n": 2,
        "params": SamplingParams(max_tokens=40),
        "stream": True,
    }
    return GenerationRequest(**(fields | overrides))


async def collect(frontend: Frontend, request: GenerationRequest, pause_s: float = 0.0) -> bytes:
    """The stream's bytes; with `pause_s`, the reader waits that long before each read."""
    events = []
    async for event in frontend.stream(request, openai_chunks(request, TOKENIZER)):
        events.append(event)
        if pause_s:
            await asyncio.sleep(pause_s)
    return b"".join(events)


@dataclass
class RecordingObserver:
    calls: list[tuple] = field(default_factory=list)

    def on_first_token(self, ttft_s: float, num_tokens: int) -> None:
        assert ttft_s >= 0
        self.calls.append(("first_token", num_tokens))

    def on_chunks(self, num_tokens, gaps_s) -> None:
        assert len(num_tokens) == len(gaps_s) and all(gap_s >= 0 for gap_s in gaps_s)
        self.calls.extend(("chunk", n) for n in num_tokens)

    def on_finish(self, num_prompt_tokens, num_generation_tokens, e2e_s, finish_reason) -> None:
        self.calls.append(("finish", num_prompt_tokens, num_generation_tokens, finish_reason))

    def on_abort(self) -> None:
        self.calls.append(("abort",))

    def on_end(self, num_delivered_tokens) -> None:
        self.calls.append(("end", num_delivered_tokens))


@pytest.mark.parametrize("phase", ["mid-prefill", "mid-decode"])
def test_closing_the_stream_midway_aborts_every_running_engine_request_at_once(phase):
    async def scenario() -> FakeEngine:
        prefill_steps = 10_000 if phase == "mid-prefill" else 0
        engine = FakeEngine(endless_words, step_interval_s=0.001, prefill_steps=prefill_steps)
        frontend = Frontend(engine, TOKENIZER)
        request = make_request(
            kind="chat",
            params=SamplingParams(max_tokens=10_000, logprobs=2),
            stop=("never",),
        )
        stream = frontend.stream(request, openai_chunks(request, TOKENIZER))
        if phase == "mid-prefill":
            # Nothing is sent before the first token: the client gives up on its first read.
            first = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0.01)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
        else:
            for _ in range(6):
                await anext(stream)
        await stream.aclose()
        assert engine.aborted_request_ids == ["chatcmpl-9-0", "chatcmpl-9-1"]
        await asyncio.sleep(0.01)  # the engine's next step ends them
        return engine

    engine = asyncio.run(scenario())
    assert engine.num_running == 0


def test_cancelling_complete_aborts_its_engine_requests_and_reports_an_abort():
    async def scenario() -> tuple[FakeEngine, RecordingObserver]:
        engine = FakeEngine(endless_words, step_interval_s=0.001)
        observer = RecordingObserver()
        frontend = Frontend(engine, TOKENIZER, observer=observer)
        request = make_request(params=SamplingParams(max_tokens=10_000))
        task = asyncio.ensure_future(frontend.complete(request, openai_chunks(request, TOKENIZER)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return engine, observer

    engine, observer = asyncio.run(scenario())
    assert sorted(engine.aborted_request_ids) == ["cmpl-9-0", "cmpl-9-1"]
    assert observer.calls[-2] == ("abort",)
    assert observer.calls[-1][0] == "end"  # last, with what was folded before the cancel


def test_an_engine_death_midstream_becomes_one_error_event_then_done():
    async def scenario() -> bytes:
        engine = FakeEngine(endless_words, step_interval_s=0.001)
        request = make_request(kind="chat", params=SamplingParams(max_tokens=10_000))
        stream = Frontend(engine, TOKENIZER).stream(request, openai_chunks(request, TOKENIZER))
        events = [await anext(stream) for _ in range(3)]
        engine.die()
        return b"".join(events + [event async for event in stream])

    body = asyncio.run(scenario())
    payloads = parse_sse(body)
    assert payloads[-1]["error"]["type"] == "service_unavailable"
    assert all("error" not in p for p in payloads[:-1])
    check_stream(body, Expectations("chat", 2, allows_error=True))


def test_complete_lets_an_engine_death_propagate():
    async def scenario() -> None:
        engine = FakeEngine(endless_words, step_interval_s=0.001)
        request = make_request()
        chunks = openai_chunks(request, TOKENIZER)
        task = asyncio.ensure_future(Frontend(engine, TOKENIZER).complete(request, chunks))
        await asyncio.sleep(0.005)
        engine.die()
        with pytest.raises(EngineDeadError):
            await task

    asyncio.run(scenario())


def test_errors_before_the_first_event_propagate_from_the_first_read():
    async def scenario() -> None:
        engine = FakeEngine()
        engine.die()
        with pytest.raises(EngineDeadError):
            request = make_request(kind="chat")
            await anext(
                Frontend(engine, TOKENIZER).stream(request, openai_chunks(request, TOKENIZER))
            )

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_an_engine_failure_before_the_first_token_propagates_instead_of_an_error_event(kind):
    request = make_request(kind=kind)

    async def scenario() -> tuple[FakeEngine, RecordingObserver]:
        engine = FakeEngine(endless_words, step_interval_s=0.001, prefill_steps=1_000)
        observer = RecordingObserver()
        chunks = openai_chunks(request, TOKENIZER)
        stream = Frontend(engine, TOKENIZER, observer=observer).stream(request, chunks)
        first = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.01)  # both choices are in the engine, nothing produced
        engine.die()
        with pytest.raises(EngineDeadError):
            await first
        return engine, observer

    engine, observer = asyncio.run(scenario())
    assert engine.added_request_ids == [f"{request.response_id}-{i}" for i in range(2)]
    assert ("abort",) not in observer.calls  # an error, not a client that left


def test_a_chat_stream_sends_its_role_chunk_with_its_first_tokens():
    # As vLLM does: a client that times its first chunk (vllm bench serve's
    # openai-chat backend) measures the time to first token.
    async def scenario() -> tuple[bool, list[bytes]]:
        engine = ManualEngine()
        request = make_request(kind="chat", n=1)
        stream = Frontend(engine, TOKENIZER).stream(request, openai_chunks(request, TOKENIZER))
        first = asyncio.ensure_future(anext(stream))
        await engine.request_added.wait()
        for _ in range(3):
            await asyncio.sleep(0)  # let the stream run as far as it can
        is_sent_before_tokens = first.done()
        engine.deliver("chatcmpl-9-0", WORDS[:2])
        events = [await first, await anext(stream)]
        await stream.aclose()
        return is_sent_before_tokens, events

    is_sent_before_tokens, events = asyncio.run(scenario())
    assert not is_sent_before_tokens
    role, content = (
        orjson.loads(event.removeprefix(b"data: "))["choices"][0]["delta"] for event in events
    )
    assert role == {"role": "assistant", "content": ""}
    assert content["content"] == TOKENIZER.decode(WORDS[:2])


def test_each_choice_gets_its_own_seed_and_engine_request_id():
    seen: dict[str, int | None] = {}

    def record(request_id, prompt, params):
        seen[request_id] = params.seed
        return WORDS

    request = make_request(
        prompts=(PromptInput((1,), "a"), PromptInput((2,), "b")),
        params=SamplingParams(max_tokens=3, seed=100),
    )
    asyncio.run(
        Frontend(FakeEngine(record), TOKENIZER).complete(request, openai_chunks(request, TOKENIZER))
    )
    assert seen == {"cmpl-9-0": 100, "cmpl-9-1": 101, "cmpl-9-2": 102, "cmpl-9-3": 103}


def test_the_observer_sees_a_first_token_chunks_and_a_finish_per_choice():
    observer = RecordingObserver()
    engine = FakeEngine(endless_words, tokens_per_step=3)
    request = make_request(params=SamplingParams(max_tokens=7))
    body = asyncio.run(collect(Frontend(engine, TOKENIZER, observer=observer), request))
    assert observer.calls[0][0] == "first_token"
    assert [call[0] for call in observer.calls].count("first_token") == 2
    finishes = [call for call in observer.calls if call[0] == "finish"]
    assert finishes == [("finish", 2, 7, "length")] * 2
    chunks = [call for call in observer.calls if call[0] in ("first_token", "chunk")]
    assert sum(call[1] for call in chunks) == 14
    assert ("abort",) not in observer.calls
    assert observer.calls[-1] == ("end", 14)  # once, last: the usage's count
    check_stream(body, Expectations("completion", 2))


def test_the_end_is_told_the_count_the_body_usage_says():
    observer = RecordingObserver()
    engine = FakeEngine(endless_words, tokens_per_step=3)
    request = make_request(params=SamplingParams(max_tokens=5))
    frontend = Frontend(engine, TOKENIZER, observer=observer)
    body = asyncio.run(frontend.complete(request, openai_chunks(request, TOKENIZER)))
    ends = [call for call in observer.calls if call[0] == "end"]
    assert ends == [("end", orjson.loads(body)["usage"]["completion_tokens"])] == [("end", 10)]


def test_a_slow_reader_gets_merged_deltas_and_an_exact_stream():
    request = make_request(
        params=SamplingParams(max_tokens=120, logprobs=1),
        stop=("ไทย a",),
        continuous_usage_stats=True,
        include_usage=True,
    )
    expect = Expectations(
        "completion", 2, logprobs=1, include_usage=True, continuous_usage_stats=True,
        stop=("ไทย a",),
    )  # fmt: skip

    async def scenario() -> tuple[bytes, bytes, int]:
        engine = FakeEngine(endless_words)
        streamed = await collect(Frontend(engine, TOKENIZER), request, pause_s=0.002)
        steps = engine.num_steps
        chunks = openai_chunks(request, TOKENIZER)
        whole = await Frontend(FakeEngine(endless_words), TOKENIZER).complete(request, chunks)
        return streamed, whole, steps

    streamed, whole, num_steps = asyncio.run(scenario())
    result = check_stream(streamed, expect)
    assert [c.text for c in result.choices] == [c.text for c in read_body(whole, expect).choices]
    assert result.choices[0].text == TOKENIZER.decode(WORDS).split("ไทย a")[0]
    assert result.choices[0].stop_reason == "ไทย a"
    num_chunks = sum(c.num_chunks for c in result.choices)
    assert num_chunks < num_steps, "a slow reader gets fewer chunks than engine steps"


def test_a_stalled_event_loop_still_gives_an_exact_stream():
    request = make_request(kind="chat", params=SamplingParams(max_tokens=60))
    staller = LoopStaller(every_s=0.001, for_s=0.003)

    async def scenario() -> bytes:
        frontend = Frontend(FakeEngine(endless_words, step_interval_s=0.0005), TOKENIZER)
        staller.start(asyncio.get_running_loop())
        try:
            return await collect(frontend, request)
        finally:
            staller.stop()

    result = check_stream(asyncio.run(scenario()), Expectations("chat", 2))
    assert staller.num_stalls > 0
    expected = TOKENIZER.decode((WORDS * 10)[:60])
    assert [c.text for c in result.choices] == [expected, expected]


def test_a_stream_ends_with_the_done_event_and_the_body_is_json():
    async def scenario() -> tuple[bytes, bytes]:
        frontend = Frontend(FakeEngine(endless_words), TOKENIZER)
        request = make_request()
        whole = await frontend.complete(request, openai_chunks(request, TOKENIZER))
        return await collect(frontend, make_request()), whole

    streamed, whole = asyncio.run(scenario())
    assert streamed.endswith(b"data: [DONE]\n\n")
    assert orjson.loads(whole)["object"] == "text_completion"
