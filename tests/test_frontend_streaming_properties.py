"""Property: whatever the engine's step schedule and the reader's pace, every
stream meets the contract and equals the non-streamed response and the oracle.

Each example draws a request (completions or chat, n, list prompts, stop
strings taken from the generated text at random offsets, logprobs, usage
modes, echo, special-token options), token scripts built from the fake
tokenizer's units (split characters, byte fallback, "▁" word starts, special
tokens), an engine schedule (tokens per step, random EOS) and reader delays.
The oracle is computed from the engine's raw token ids alone: a full decode,
cut at the earliest stop-string match that ends past the text of the first
`min_tokens` tokens and before a finishing stop token's text.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from sluice.engine.engine_request import generation_request
from sluice.engine.outputs import RequestDelta
from sluice.engine.sampling_params import SamplingParams
from sluice.frontend import Frontend, GenerationRequest, PromptInput
from sluice.frontend.detokenizer import REPLACEMENT_CHAR
from sluice.testing import FakeEngine, FakeTokenizer, fake_logprobs
from sluice.testing.contract import Expectations, ResponseResult, check_stream, read_body
from sluice.testing.openai_chunks import openai_chunks

TOKENIZER = FakeTokenizer()
EOS = TOKENIZER.eos_token_id
PROMPTS = (PromptInput((5, 6, 7), "Once"), PromptInput((8, 9), "Then"))


@dataclass(frozen=True)
class Generated:
    """What the engine produced for one choice, stop strings aside."""

    token_ids: tuple[int, ...]
    finish_reason: str
    stop_token_id: int | None


@dataclass(frozen=True)
class Expected:
    text: str
    finish_reason: str
    stop_reason: str | int | None
    num_tokens: int


class Recorder:
    def __init__(self) -> None:
        self.deltas: list[RequestDelta] = []

    def on_delta(self, delta: RequestDelta) -> None:
        self.deltas.append(delta)

    def on_error(self, error: BaseException) -> None:
        raise AssertionError(f"the oracle engine failed: {error}")


def raw_generation(engine_kwargs: dict, request: GenerationRequest) -> list[Generated]:
    """Every choice's tokens from an engine no frontend touches."""

    async def run() -> list[Generated]:
        engine = FakeEngine(**engine_kwargs)
        recorders = [Recorder() for _ in range(request.num_choices)]
        for index, recorder in enumerate(recorders):
            prompt = request.prompts[index // request.n].token_ids
            engine.add_request(
                generation_request(f"{request.response_id}-{index}", list(prompt), request.params),
                recorder,
            )
        while engine.num_running:
            await asyncio.sleep(0)
        return [
            Generated(
                tuple(t for d in r.deltas for t in d.new_token_ids),
                r.deltas[-1].finish_reason,
                r.deltas[-1].stop_token_id,
            )
            for r in recorders
        ]

    return asyncio.run(run())


def decoded(generated: Generated, request: GenerationRequest) -> str:
    ids = list(generated.token_ids)
    if generated.stop_token_id is not None and not request.include_stop_str_in_output:
        ids = ids[:-1]  # a stop token is counted, not shown (vLLM)
    return decode(ids, request)


def decode(ids: list[int], request: GenerationRequest) -> str:
    return TOKENIZER.decode(
        ids,
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
    )


def expected_output(generated: Generated, request: GenerationRequest) -> Expected:
    full = decoded(generated, request).rstrip(REPLACEMENT_CHAR)
    searched, min_end = searched_text(generated, request)
    match = None
    for stop in request.stop:
        start = searched.find(stop, max(0, min_end - len(stop)))
        if stop and start >= 0 and (match is None or (start + len(stop), start) < match[:2]):
            match = (start + len(stop), start, stop)
    if match is None:
        eos_free = None if generated.stop_token_id == EOS else generated.stop_token_id
        return Expected(full, generated.finish_reason, eos_free, len(generated.token_ids))
    end, start, stop = match
    text = full[: end if request.include_stop_str_in_output else start]
    return Expected(text, "stop", stop, completing_token_count(generated, request, end))


def searched_text(generated: Generated, request: GenerationRequest) -> tuple[str, int]:
    """The text stop strings are searched in (a finishing stop token's text left
    out), and the least end a match in it may have: past the text the first
    `min_tokens` tokens released."""
    ids = list(generated.token_ids)
    if generated.stop_token_id is not None:
        ids = ids[:-1]
    searched = decode(ids, request).rstrip(REPLACEMENT_CHAR)
    min_tokens = request.params.min_tokens
    if min_tokens >= len(ids):
        return searched, len(searched) + 1  # even the final flush belongs to them
    released = ""
    for k in range(1, min_tokens + 1):
        text = decode(ids[:k], request)
        if not text.endswith(REPLACEMENT_CHAR):  # else held with its incomplete character
            released = text
    return searched, len(released) + 1


def completing_token_count(generated: Generated, request: GenerationRequest, end: int) -> int:
    """How many tokens it takes to release text up to `end` (the match's end)."""
    num_ids = len(generated.token_ids)
    for k in range(1, num_ids):
        text = decode(list(generated.token_ids[:k]), request)
        if len(text) >= end and not text.endswith(REPLACEMENT_CHAR):
            return k
    return num_ids  # released only by the final flush


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[GenerationRequest, dict, list[int]]:
    kind = draw(st.sampled_from(["completion", "chat"]))
    num_prompts = 1 if kind == "chat" else draw(st.integers(1, 2))
    n = draw(st.integers(1, 3))
    units = st.lists(st.sampled_from(TOKENIZER.units), max_size=14)
    scripts = [[t for unit in draw(units) for t in unit] for _ in range(num_prompts * n)]
    note(f"token scripts: {scripts}")
    logprobs = draw(st.none() | st.integers(0, 2))
    max_tokens = draw(st.integers(1, 40))
    min_tokens = draw(st.sampled_from([0, 0, 1, 3, 8]).filter(lambda m: m <= max_tokens))
    engine_kwargs = {
        "script": lambda rid, prompt, params: scripts[int(rid.rsplit("-", 1)[1])],
        "tokens_per_step": (1, draw(st.integers(1, 5))),
        "finish_probability": draw(st.sampled_from([0.0, 0.05, 0.2])),
        "eos_token_id": EOS,
        "seed": draw(st.integers(0, 1000)),
    }
    request = GenerationRequest(
        kind=kind,
        response_id="cmpl-p" if kind == "completion" else "chatcmpl-p",
        created=1,
        model_name="fake",
        prompts=PROMPTS[:num_prompts],
        n=n,
        params=SamplingParams(max_tokens=max_tokens, min_tokens=min_tokens, logprobs=logprobs),
        include_stop_str_in_output=draw(st.booleans()),
        skip_special_tokens=draw(st.booleans()),
        spaces_between_special_tokens=draw(st.booleans()),
        stream=True,
        include_usage=(include_usage := draw(st.booleans())),
        continuous_usage_stats=include_usage and draw(st.booleans()),
        echo=kind == "completion" and logprobs is None and draw(st.booleans()),
    )
    texts = [decoded(g, request) for g in raw_generation(engine_kwargs, request)]
    stops = draw(st.lists(stop_strings(texts), max_size=3))
    request = GenerationRequest(**{**_fields(request), "stop": tuple(stops)})
    delays = draw(st.lists(st.integers(0, 6), max_size=30))
    return request, engine_kwargs, delays


def stop_strings(texts: list[str]) -> st.SearchStrategy[str]:
    """A piece of some choice's text at a random offset, or a short random string."""
    pieces = [
        text[start : start + size]
        for text in texts
        for start in range(len(text))
        for size in range(1, 5)
        if start + size <= len(text)
    ]
    random_strings = st.text(alphabet="abc😀 !", min_size=1, max_size=3)
    return st.sampled_from(pieces) | random_strings if pieces else random_strings


def _fields(request: GenerationRequest) -> dict:
    return {name: getattr(request, name) for name in GenerationRequest.__slots__}


async def read_slowly(frontend: Frontend, request: GenerationRequest, delays: list[int]) -> bytes:
    events = []
    async for sse_event in frontend.stream(request, openai_chunks(request, TOKENIZER)):
        events.append(sse_event)
        for _ in range(delays[len(events) % len(delays)] if delays else 0):
            await asyncio.sleep(0)
    return b"".join(events)


def run_both(
    request: GenerationRequest, engine_kwargs: dict, delays: list[int]
) -> tuple[bytes, bytes]:
    async def run() -> tuple[bytes, bytes]:
        streamed = await read_slowly(
            Frontend(FakeEngine(**engine_kwargs), TOKENIZER), request, delays
        )
        chunks = openai_chunks(request, TOKENIZER)
        whole = await Frontend(FakeEngine(**engine_kwargs), TOKENIZER).complete(request, chunks)
        return streamed, whole

    return asyncio.run(run())


def assert_matches_oracle(
    result: ResponseResult, expected: list[Expected], request: GenerationRequest
) -> None:
    for index, (got, want) in enumerate(zip(result.choices, expected, strict=True)):
        echo = request.prompts[index // request.n].text if request.echo else ""
        assert got.text == echo + want.text, f"I1: index {index}: {got.text!r}"
        assert (got.finish_reason, got.stop_reason) == (want.finish_reason, want.stop_reason)
        if request.params.logprobs is not None:
            assert got.token_logprobs == [
                fake_logprobs(p, 0, 0)[0] for p in range(want.num_tokens)
            ], "I2"
            joined = "".join(got.token_strings)
            assert joined.startswith(want.text), "I3: token strings cover the text"
            if not isinstance(want.stop_reason, str):
                assert joined == want.text, "I3: token strings are the text"
    if result.usage is not None:
        assert result.usage["completion_tokens"] == sum(w.num_tokens for w in expected), "I5"
        assert result.usage["prompt_tokens"] == sum(len(p.token_ids) for p in request.prompts)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_streams_meet_the_contract_and_equal_the_non_streamed_response(scenario):
    request, engine_kwargs, delays = scenario
    streamed, whole = run_both(request, engine_kwargs, delays)
    expected = [expected_output(g, request) for g in raw_generation(engine_kwargs, request)]
    # A character cut by a rendered EOS is invalid UTF-8: a full decode shows
    # U+FFFD there, and so does the stream (I1 wins). Never for a split character.
    has_invalid_utf8 = any(REPLACEMENT_CHAR in e.text for e in expected)
    expect = Expectations(
        request.kind,
        request.num_choices,
        logprobs=request.params.logprobs,
        include_usage=request.include_usage,
        continuous_usage_stats=request.continuous_usage_stats,
        echo=request.echo,
        stop=request.stop,
        include_stop_str=request.include_stop_str_in_output,
        min_tokens=request.params.min_tokens,
        allows_replacement_char=has_invalid_utf8,
    )
    stream_result = check_stream(streamed, expect)
    body_result = read_body(whole, expect)
    event(
        "a stop string matched"
        if any(isinstance(e.stop_reason, str) for e in expected)
        else "no stop string matched"
    )
    num_tokens = sum(e.num_tokens for e in expected)
    num_chunks = sum(c.num_chunks for c in stream_result.choices)
    event(
        "chunks coalesced tokens"
        if num_chunks < num_tokens
        else "a chunk per token or fewer tokens"
    )
    assert_matches_oracle(stream_result, expected, request)
    assert_matches_oracle(body_result, expected, request)
    for got in stream_result.choices:
        if request.continuous_usage_stats and request.params.logprobs is not None:
            assert got.num_tokens_by_usage == len(got.token_strings)
    for one, other in zip(stream_result.choices, body_result.choices, strict=True):
        assert (one.token_strings, one.text_offsets) == (other.token_strings, other.text_offsets)
