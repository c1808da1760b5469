"""StreamOutput: merges while the reader lags, never overwrites, errors last, and
writes directly only when that cannot pass an earlier event.

The first half drives the class alone, with a render that names what it got;
the second drives it through `Frontend.stream` with a connection the test
pauses, as the HTTP edge attaches it.
"""

from __future__ import annotations

import asyncio

import pytest

from sluice.engine.sampling_params import SamplingParams
from sluice.errors import EngineDeadError
from sluice.frontend import Frontend, GenerationRequest, PromptInput
from sluice.frontend.deltas import ChoiceDelta, SampledLogprob
from sluice.frontend.stream_output import StreamOutput
from sluice.testing import FakeEngine, FakeTokenizer
from sluice.testing.contract import Expectations, check_stream, parse_sse
from sluice.testing.openai_chunks import openai_chunks


def step_delta(step: int, *, finish: bool = False) -> ChoiceDelta:
    """The delta one engine step would release: two tokens, text "s{step} "."""
    text = f"s{step} "
    return ChoiceDelta(
        text=text,
        token_ids=[10 * step, 10 * step + 1],
        token_texts=[text[:2], text[2:]],
        logprobs=[SampledLogprob(-step, (step,), (-step,)), SampledLogprob(-step - 0.5, (), ())],
        finish_reason="length" if finish else None,
        num_prompt_tokens=7,
    )


class Rendered:
    """A render recording what each hand-over took; one event per choice: b"index:text"."""

    def __init__(self) -> None:
        self.takes: list[dict[int, ChoiceDelta]] = []

    def __call__(self, taken: list[tuple[int, ChoiceDelta]]) -> list[bytes]:
        self.takes.append(dict(taken))
        return [f"{index}:{delta.text}".encode() for index, delta in taken]


class Connection:
    """`write_now` that refuses while paused; what went out, in order."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.is_paused = False

    def write_now(self, event: bytes) -> bool:
        if self.is_paused:
            return False
        self.written.append(event)
        return True


# -- the class alone --------------------------------------------------------------


def test_a_reader_stalled_for_k_steps_gets_one_merged_delta_with_everything():
    async def scenario() -> Rendered:
        rendered = Rendered()
        output = StreamOutput(1, rendered)
        for step in range(5):
            output.put(0, step_delta(step, finish=step == 4))
        assert await output.next_events() == [b"0:s0 s1 s2 s3 s4 "]
        assert await output.next_events() == []  # the choice finished
        return rendered

    (taken,) = asyncio.run(scenario()).takes
    merged = taken[0]
    assert merged.token_ids == [0, 1, 10, 11, 20, 21, 30, 31, 40, 41]
    assert "".join(merged.token_texts) == merged.text
    assert merged.logprobs is not None
    assert [entry.logprob for entry in merged.logprobs] == [
        v for step in range(5) for v in (-step, -step - 0.5)
    ]
    assert merged.logprobs[2].top_token_ids == (1,)
    assert merged.finish_reason == "length"
    assert merged.num_prompt_tokens == 7


def test_choices_merge_separately_never_overwrite_and_render_in_index_order():
    async def scenario() -> list[bytes]:
        output = StreamOutput(3, Rendered())
        for step in range(3):
            for index in (2, 0, 1):
                output.put(index, step_delta(10 * index + step))
        return await output.next_events()

    expected = [
        f"{index}:s{10 * index} s{10 * index + 1} s{10 * index + 2} " for index in (0, 1, 2)
    ]
    assert asyncio.run(scenario()) == [event.encode() for event in expected]


def test_a_waiting_reader_wakes_on_put_and_a_cancelled_wait_breaks_nothing():
    async def scenario() -> list[bytes]:
        output = StreamOutput(1, Rendered())
        reader = asyncio.ensure_future(output.next_events())
        await asyncio.sleep(0)
        reader.cancel()
        output.put(0, step_delta(2))
        reader = asyncio.ensure_future(output.next_events())
        return await asyncio.wait_for(reader, 10)

    assert asyncio.run(scenario()) == [b"0:s2 "]


def test_an_error_comes_after_everything_accepted_before_it_and_nothing_after_it():
    async def scenario() -> tuple[list[bytes], BaseException]:
        output = StreamOutput(1, Rendered())
        output.put(0, step_delta(1))
        output.put_error(EngineDeadError("gone"))
        output.put_error(EngineDeadError("a second error is ignored"))
        output.put(0, step_delta(2))  # after the error: dropped
        delivered = await output.next_events()
        with pytest.raises(EngineDeadError) as raised:
            await output.next_events()
        return delivered, raised.value

    delivered, error = asyncio.run(scenario())
    assert delivered == [b"0:s1 "]
    assert str(error) == "gone"


def test_an_error_wakes_a_waiting_reader():
    async def scenario() -> None:
        output = StreamOutput(1, Rendered())
        reader = asyncio.ensure_future(output.next_events())
        await asyncio.sleep(0)
        output.put_error(EngineDeadError("gone"))
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(reader, 10)

    asyncio.run(scenario())


def test_merging_a_delta_into_a_finished_one_is_refused():
    finished = step_delta(1, finish=True)
    with pytest.raises(AssertionError):
        finished.merge(step_delta(2))


def test_a_parked_reader_with_a_connection_attached_is_not_woken_per_put():
    async def scenario() -> tuple[Connection, asyncio.Future]:
        output = StreamOutput(1, Rendered())
        connection = Connection()
        output.attach(connection.write_now)
        reader = asyncio.ensure_future(output.next_events())
        await asyncio.sleep(0)
        for step in range(3):
            output.put(0, step_delta(step))
        await asyncio.sleep(0)
        assert not reader.done()
        output.put(0, step_delta(3, finish=True))
        return connection, await asyncio.wait_for(reader, 10)

    connection, events = asyncio.run(scenario())
    assert connection.written == [b"0:s0 ", b"0:s1 ", b"0:s2 ", b"0:s3 "]
    assert events == []  # finished: the reader only closes the stream


def test_a_refused_write_and_later_puts_keep_their_order():
    """Sequence 1 of issue 11 at the class: a written, b refused, c and d
    accepted before the reader runs again, x after the connection resumes."""

    async def scenario() -> list[bytes]:
        output = StreamOutput(1, Rendered())
        connection = Connection()
        output.attach(connection.write_now)
        wire = connection.written
        reader = asyncio.ensure_future(output.next_events())
        await asyncio.sleep(0)
        output.put(0, step_delta(1))  # written at once
        connection.is_paused = True
        output.put(0, step_delta(2))  # refused: the backlog, the reader woken
        output.put(0, step_delta(3))  # same pass: waits in the slot
        output.put(0, step_delta(4))  # merges with it
        wire += await reader  # the reader writes the backlog, waiting as needed
        connection.is_paused = False
        wire += await output.next_events()  # then the slot
        reader = asyncio.ensure_future(output.next_events())
        await asyncio.sleep(0)
        output.put(0, step_delta(5, finish=True))  # written at once again
        assert await reader == []
        return wire

    assert asyncio.run(scenario()) == [b"0:s1 ", b"0:s2 ", b"0:s3 s4 ", b"0:s5 "]


def test_an_error_behind_a_refused_write_comes_after_it():
    """Sequence 2 of issue 11 at the class."""

    async def scenario() -> tuple[list[bytes], list[bytes]]:
        output = StreamOutput(1, Rendered())
        connection = Connection()
        output.attach(connection.write_now)
        reader = asyncio.ensure_future(output.next_events())
        await asyncio.sleep(0)
        output.put(0, step_delta(1))
        connection.is_paused = True
        output.put(0, step_delta(2))
        output.put_error(EngineDeadError("gone"))
        handed_out = await reader
        with pytest.raises(EngineDeadError):
            await output.next_events()
        return connection.written, handed_out

    assert asyncio.run(scenario()) == ([b"0:s1 "], [b"0:s2 "])


def test_a_render_that_raises_in_a_direct_write_becomes_the_stream_error():
    def broken(taken: list[tuple[int, ChoiceDelta]]) -> list[bytes]:
        raise RuntimeError("chunk building broke")

    async def scenario() -> None:
        output = StreamOutput(1, broken)
        output.attach(Connection().write_now)
        reader = asyncio.ensure_future(output.next_events())
        await asyncio.sleep(0)
        output.put(0, step_delta(1))  # must not raise into the engine's delivery
        with pytest.raises(RuntimeError, match="chunk building broke"):
            await asyncio.wait_for(reader, 10)

    asyncio.run(scenario())


# -- through Frontend.stream -----------------------------------------------------------

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
    """The connection as the edge sees it. Every `pause_after` direct writes
    the transport pauses: write_now refuses until the edge's waiting write,
    which lets some engine steps go by first (a slow reader)."""

    def __init__(self, pause_after: int | None = None) -> None:
        self.events: list[bytes] = []
        self.num_direct = 0
        self.num_waited = 0
        self.is_paused = False
        self._pause_after = pause_after
        self._num_since_resumed = 0

    def write_now(self, event: bytes) -> bool:
        if self._num_since_resumed == self._pause_after:
            self.is_paused = True
        if self.is_paused:
            return False
        self.events.append(event)
        self.num_direct += 1
        self._num_since_resumed += 1
        return True

    async def write(self, event: bytes) -> None:
        if self.is_paused:
            await asyncio.sleep(0.01)  # the client reads slowly; steps go on
            self.is_paused = False
            self._num_since_resumed = 0
        self.events.append(event)
        self.num_waited += 1


async def run_stream(engine: FakeEngine, request: GenerationRequest, wire: Wire) -> bytes:
    """Consume as EventStreamResponse does: the first event, then the connection attached."""
    stream = Frontend(engine, TOKENIZER).stream(request, openai_chunks(request, TOKENIZER))
    try:
        await wire.write(await anext(stream))
        stream.attach(wire.write_now)
        async for event in stream:
            if not wire.write_now(event):
                await wire.write(event)
    finally:
        stream.detach()
        await stream.aclose()
    return b"".join(wire.events)


def reference_body(request: GenerationRequest) -> bytes:
    async def scenario() -> bytes:
        engine = FakeEngine(endless_words, step_interval_s=0.0005, seed=3)
        stream = Frontend(engine, TOKENIZER).stream(request, openai_chunks(request, TOKENIZER))
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
        continuous_usage_stats=True,
    )
    wire = Wire()
    engine = FakeEngine(endless_words, step_interval_s=0.0005, seed=3)
    body = asyncio.run(run_stream(engine, request, wire))
    expect = Expectations(
        "chat",
        2,
        logprobs=logprobs,
        include_usage=True,
        continuous_usage_stats=True,
    )
    check_stream(body, expect)
    assert wire.num_direct > 10  # the delta events really went out directly
    expected = reference_body(request)
    for index in (0, 1):
        assert text_of(body, index) == text_of(expected, index) != ""
    assert wire.events[-1] == b"data: [DONE]\n\n"
    assert "usage" in parse_sse(wire.events[-2] + wire.events[-1])[0]


@pytest.mark.parametrize("tokens_per_step", [1, (1, 4)])
def test_a_paused_connection_coalesces_and_keeps_every_token_in_order(tokens_per_step):
    request = make_request(params=SamplingParams(max_tokens=60), continuous_usage_stats=True)
    wire = Wire(pause_after=8)
    engine = FakeEngine(
        endless_words, step_interval_s=0.0005, seed=3, tokens_per_step=tokens_per_step
    )
    body = asyncio.run(run_stream(engine, request, wire))
    check_stream(body, Expectations("chat", 2, include_usage=True, continuous_usage_stats=True))
    for index in (0, 1):
        assert text_of(body, index) == TOKENIZER.decode((WORDS * 20)[:60])
    usage = parse_sse(body)[-1]["usage"]
    assert usage["completion_tokens"] == 120
    num_chunks = sum(1 for p in parse_sse(body) if "choices" in p and p["choices"])
    assert num_chunks < 120, "while writes were refused the deltas merged"
    assert wire.num_waited >= 2 and wire.num_direct > 3, "both paths wrote"


def test_an_engine_death_while_parked_ends_the_stream_with_an_error_event():
    async def scenario() -> bytes:
        engine = FakeEngine(endless_words, step_interval_s=0.0005, seed=3)
        asyncio.get_running_loop().call_later(0.01, engine.die)
        request = make_request(params=SamplingParams(max_tokens=100_000))
        return await run_stream(engine, request, Wire())

    payloads = parse_sse(asyncio.run(scenario()))  # ends with [DONE]
    assert payloads[-1]["error"]["type"] == "service_unavailable"


def test_without_a_connection_attached_the_generator_yields_everything():
    async def scenario() -> bytes:
        engine = FakeEngine(endless_words, step_interval_s=0.0005, seed=3)
        request = make_request()
        stream = Frontend(engine, TOKENIZER).stream(request, openai_chunks(request, TOKENIZER))
        return b"".join([event async for event in stream])

    check_stream(asyncio.run(scenario()), Expectations("chat", 2, include_usage=True))
