"""/v1/completions chunks and bodies: shape, echo, offsets, usage; stream == fold."""

from __future__ import annotations

import orjson

from sluice.apis.completions.chunks import CompletionChunks
from sluice.engine.outputs import PromptLogprobs
from sluice.engine.sampling_params import SamplingParams
from sluice.frontend.deltas import ChoiceDelta, SampledLogprob
from sluice.frontend.logprob_format import TokenStrings
from sluice.frontend.request import GenerationRequest, PromptInput
from sluice.frontend.serving import delivered_event, delivered_fold
from sluice.frontend.sse import DONE_EVENT, encode_event
from sluice.testing import FakeTokenizer
from sluice.testing.contract import Expectations, check_stream, read_body

TOKENIZER = FakeTokenizer()
T = TOKENIZER.token_id


def prompt_input(text: str) -> PromptInput:
    return PromptInput(tuple(TOKENIZER.encode(text)), text)


def make_request(logprobs: int | None = None, **overrides) -> GenerationRequest:
    fields = {
        "kind": "completion",
        "response_id": "cmpl-7",
        "created": 123,
        "model_name": "tiny",
        # Token ids that spell the prompt texts (echoed logprob entries cover the text).
        "prompts": (prompt_input("Say:"), prompt_input("Hi")),
        "n": 2,
        "params": SamplingParams(logprobs=logprobs),
        "stream": True,
    }
    return GenerationRequest(**(fields | overrides))


def text_delta(*pieces: str, finish: str | None = None, logprobs: bool = False) -> ChoiceDelta:
    return ChoiceDelta(
        text="".join(pieces),
        token_ids=[T(piece) for piece in pieces],
        token_texts=list(pieces),
        logprobs=[SampledLogprob(-1.0, (), ()) for _ in pieces] if logprobs else None,
        finish_reason=finish,
        stop_reason=None,
    )


def script(logprobs: bool = False) -> list[list[tuple[int, ChoiceDelta]]]:
    """Takes from the slot for four choices (two prompts, n=2)."""
    return [
        [(0, text_delta("a", "b", logprobs=logprobs)), (3, text_delta("x", logprobs=logprobs))],
        [(0, text_delta("c", finish="length", logprobs=logprobs)), (1, text_delta("y", finish="stop", logprobs=logprobs))],
        [(2, text_delta(finish="length", logprobs=logprobs)), (3, text_delta("!", finish="stop", logprobs=logprobs))],
    ]  # fmt: skip


def with_prompt_logprobs(request: GenerationRequest, takes):
    """`takes` with the engine's prompt logprobs on each choice's first delta."""
    seen: set[int] = set()
    for take in takes:
        for index, item in take:
            if index not in seen:
                seen.add(index)
                num = len(request.prompts[index // request.n].token_ids) - 1
                # logprobs=0: no alternatives, as for the sampled tokens.
                item.prompt_logprobs = PromptLogprobs(
                    (-0.5,) * num, (1,) * num, ((),) * num, ((),) * num
                )
    return takes


def stream_and_body(request: GenerationRequest, logprobs: bool = False) -> tuple[bytes, bytes]:
    streamed, folded = (
        CompletionChunks(request, TokenStrings(TOKENIZER)),
        CompletionChunks(request, TokenStrings(TOKENIZER)),
    )
    events = list(streamed.opening_events())
    for take in with_prompt_logprobs(request, script(logprobs)):
        for index, item in take:
            events.append(delivered_event(streamed, index, item))
    for take in with_prompt_logprobs(request, script(logprobs)):
        for index, item in take:
            delivered_fold(folded, index, item)
    return b"".join(events + streamed.closing_events()), folded.body()


def expectations(request: GenerationRequest) -> Expectations:
    return Expectations(
        "completion",
        request.num_choices,
        logprobs=request.params.logprobs,
        include_usage=request.include_usage,
        continuous_usage_stats=request.continuous_usage_stats,
        echo=request.echo,
        prompts=tuple(prompt.text for prompt in request.prompts),
    )


def test_every_chunk_is_a_text_completion_with_one_choice_and_a_null_finish_until_the_last():
    request = make_request()
    body, _ = stream_and_body(request)
    result = check_stream(body, expectations(request))
    assert [c.text for c in result.choices] == ["abc", "y", "", "x!"]
    assert [c.finish_reason for c in result.choices] == ["length", "stop", "length", "stop"]
    first = orjson.loads(body.split(b"\n\n")[0][6:])
    assert first["choices"] == [
        {"index": 0, "text": "ab", "logprobs": None, "finish_reason": None, "stop_reason": None}
    ]
    assert (first["id"], first["created"], first["model"]) == ("cmpl-7", 123, "tiny")
    assert "usage" not in first
    assert body.endswith(b"}\n\n" + DONE_EVENT)


def test_the_non_streamed_body_is_the_fold_of_the_same_chunks():
    request = make_request(logprobs=0, stream=False)
    body, folded = stream_and_body(request, logprobs=True)
    streamed = check_stream(body, expectations(request))
    whole = read_body(folded, expectations(request))
    for one, other in zip(streamed.choices, whole.choices, strict=True):
        assert (one.text, one.finish_reason, one.token_strings, one.text_offsets) == (
            other.text,
            other.finish_reason,
            other.token_strings,
            other.text_offsets,
        )
    assert whole.usage == {
        "prompt_tokens": 6,
        "completion_tokens": 6,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_include_usage_adds_one_text_completion_chunk_with_no_choices_before_done():
    request = make_request(include_usage=True)
    body, _ = stream_and_body(request)
    result = check_stream(body, expectations(request))
    # Prompt tokens count once per prompt (3 + 1), not once per choice.
    assert result.usage == {
        "prompt_tokens": 6,
        "completion_tokens": 6,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    usage_chunk = orjson.loads(body.split(b"\n\n")[-3][6:])
    assert (usage_chunk["object"], usage_chunk["choices"]) == ("text_completion", [])


def test_continuous_usage_counts_each_index_cumulatively_with_its_own_prompt():
    request = make_request(continuous_usage_stats=True, include_usage=True, logprobs=0)
    body, _ = stream_and_body(request, logprobs=True)
    chunks = [orjson.loads(e[6:]) for e in body.split(b"\n\n")[:-2]]
    usages = [(c["choices"][0]["index"], c["usage"]["completion_tokens"], c["usage"]["prompt_tokens"]) for c in chunks[:-1]]  # fmt: skip
    assert usages == [(0, 2, 4), (3, 1, 2), (0, 3, 4), (1, 1, 4), (2, 0, 2), (3, 2, 2)]
    check_stream(body, expectations(request))


def test_echo_prepends_each_prompt_to_its_choices_first_chunk():
    request = make_request(echo=True)
    body, folded = stream_and_body(request)
    result = check_stream(body, expectations(request))
    assert [c.text for c in result.choices] == ["Say:abc", "Say:y", "Hi", "Hix!"]
    assert [c.text for c in read_body(folded, expectations(request)).choices] == [
        "Say:abc", "Say:y", "Hi", "Hix!"
    ]  # fmt: skip


def test_echo_with_logprobs_puts_the_prompts_entries_first_the_first_one_null():
    """As OpenAI and vLLM answer; streamed and folded both meet the contract."""
    request = make_request(echo=True, logprobs=0)
    body, folded = stream_and_body(request, logprobs=True)
    streamed = check_stream(body, expectations(request))
    whole = read_body(folded, expectations(request))
    for got, want in zip(streamed.choices, whole.choices, strict=True):
        assert (got.text, got.token_strings, got.token_logprobs, got.text_offsets) == (
            want.text, want.token_strings, want.token_logprobs, want.text_offsets
        )  # fmt: skip
    choices = orjson.loads(folded)["choices"]
    strings = TokenStrings(TOKENIZER)
    prompt_strings = [strings.get(token_id)[0] for token_id in request.prompts[0].token_ids]
    logprobs = choices[0]["logprobs"]
    assert logprobs["tokens"] == prompt_strings + ["a", "b", "c"]
    assert prompt_strings == ["S", "a", "y", ":"], "the prompt text, token by token"
    assert logprobs["token_logprobs"] == [None, -0.5, -0.5, -0.5, -1.0, -1.0, -1.0]
    assert logprobs["top_logprobs"][0] is None
    assert logprobs["top_logprobs"][1] == {prompt_strings[1]: -0.5}
    # Offsets: the prompt's tokens from 0, the completion's from the prompt text's end.
    assert logprobs["text_offset"] == [0, 1, 2, 3] + [4, 5, 6]
    assert choices[3]["logprobs"]["text_offset"] == [0, 1] + [2, 3]  # "Hi", then "x!"


def test_a_plain_text_chunk_is_spliced_into_exactly_the_bytes_of_the_whole_chunk():
    chunks = CompletionChunks(make_request(), TokenStrings(TOKENIZER))
    for index, text in ((0, 'a "quoted" \\ line\n'), (3, "😀 語\x01</s>"), (1, "\x00text\x00")):
        delta = ChoiceDelta(text, [T("a")], [text])
        choice = {
            "index": index,
            "text": text,
            "logprobs": None,
            "finish_reason": None,
            "stop_reason": None,
        }
        envelope = {"id": "cmpl-7", "object": "text_completion", "created": 123, "model": "tiny"}
        assert delivered_event(chunks, index, delta) == encode_event(
            envelope | {"choices": [choice]}
        )
    assert chunks.usage.total()["completion_tokens"] == 3
