"""/v1/chat/completions chunks and bodies: role first, no empty content, stream == fold."""

from __future__ import annotations

import orjson
import pytest

from sluice.apis.chat.chunks import ChatChunks
from sluice.engine.sampling_params import SamplingParams
from sluice.frontend.deltas import ChoiceDelta, SampledLogprob
from sluice.frontend.logprob_format import TokenStrings
from sluice.frontend.request import GenerationRequest, PromptInput
from sluice.frontend.serving import delivered_event, delivered_fold
from sluice.frontend.sse import encode_event
from sluice.testing import FakeTokenizer
from sluice.testing.contract import Expectations, check_stream, read_body

TOKENIZER = FakeTokenizer()
T = TOKENIZER.token_id


def make_request(logprobs: int | None = None, **overrides) -> GenerationRequest:
    fields = {
        "kind": "chat",
        "response_id": "chatcmpl-3",
        "created": 5,
        "model_name": "tiny",
        "prompts": (PromptInput((5, 6, 7, 8), "<chat>"),),
        "n": 2,
        "params": SamplingParams(logprobs=logprobs),
        "stream": True,
    }
    return GenerationRequest(**(fields | overrides))


def text_delta(*pieces: str, finish: str | None = None, stop_reason=None) -> ChoiceDelta:
    return ChoiceDelta(
        text="".join(pieces),
        token_ids=[T(piece) for piece in pieces],
        token_texts=list(pieces),
        # Distinct per token, as a model's are (the checker refuses copied logprobs).
        # The alternative is a token no piece is (a token's own entry must be its logprob).
        logprobs=[SampledLogprob(-ord(piece[0]) / 256, (T("c"),), (-0.25,)) for piece in pieces],
        finish_reason=finish,
        stop_reason=stop_reason,
    )


TAKES = [
    [(1, text_delta("a", "b"))],
    [(0, text_delta("x")), (1, text_delta(finish="length"))],
    [(0, text_delta("y", finish="stop", stop_reason="STOP"))],
]


def run(request: GenerationRequest) -> tuple[list[dict], bytes, bytes]:
    streamed, folded = (
        ChatChunks(request, TokenStrings(TOKENIZER)),
        ChatChunks(request, TokenStrings(TOKENIZER)),
    )
    events = list(streamed.opening_events())
    for take in TAKES:
        for index, item in take:
            events.append(delivered_event(streamed, index, item))
            delivered_fold(folded, index, item)
    body = b"".join(events + streamed.closing_events())
    return [orjson.loads(e[6:]) for e in events], body, folded.body()


def expectations(request: GenerationRequest) -> Expectations:
    return Expectations(
        "chat",
        request.num_choices,
        logprobs=request.params.logprobs,
        include_usage=request.include_usage,
        continuous_usage_stats=request.continuous_usage_stats,
    )


def test_each_index_opens_with_one_role_chunk_and_never_repeats_it():
    chunks, body, _ = run(make_request())
    assert [c["choices"][0]["delta"] for c in chunks[:2]] == [
        {"role": "assistant", "content": ""}
    ] * 2
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[2:])
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    check_stream(body, expectations(make_request()))


def test_a_finish_without_text_is_an_empty_delta_with_the_finish_reason():
    chunks, _, _ = run(make_request())
    finish_chunk = chunks[4]["choices"][0]
    assert finish_chunk == {
        "index": 1,
        "delta": {},
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,
    }
    assert chunks[5]["choices"][0]["stop_reason"] == "STOP"


def test_a_content_chunk_without_content_is_refused():
    builder = ChatChunks(make_request(), TokenStrings(TOKENIZER))
    with pytest.raises(AssertionError):
        builder.delta_event(0, ChoiceDelta(token_ids=[T("a")], token_texts=[""]))


def test_the_body_is_a_chat_completion_folded_from_the_same_deltas():
    request = make_request(stream=False, logprobs=1)
    _, body, folded = run(request)
    streamed = check_stream(body, expectations(request))
    whole = read_body(folded, expectations(request))
    for one, other in zip(streamed.choices, whole.choices, strict=True):
        assert (one.text, one.finish_reason, one.stop_reason, one.token_strings) == (
            other.text,
            other.finish_reason,
            other.stop_reason,
            other.token_strings,
        )
    response = orjson.loads(folded)
    assert response["object"] == "chat.completion"
    assert response["choices"][1]["message"] == {"role": "assistant", "content": "ab"}
    assert response["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 4,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    entry = response["choices"][0]["logprobs"]["content"][0]
    assert entry == {
        "token": "x",
        "logprob": -ord("x") / 256,
        "bytes": [ord("x")],
        "top_logprobs": [{"token": "c", "logprob": -0.25, "bytes": [ord("c")]}],
    }


def test_usage_modes_role_chunks_count_zero_and_the_usage_chunk_is_a_chunk():
    request = make_request(include_usage=True, continuous_usage_stats=True, logprobs=0)
    chunks, body, _ = run(request)
    assert chunks[0]["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 0,
        "total_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    result = check_stream(body, expectations(request))
    assert result.usage == {
        "prompt_tokens": 4,
        "completion_tokens": 4,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    usage_chunk = orjson.loads(body.split(b"\n\n")[-3][6:])
    assert (usage_chunk["object"], usage_chunk["choices"]) == ("chat.completion.chunk", [])


def test_without_logprobs_every_chunk_says_null():
    chunks, _, folded = run(make_request())
    assert all(c["choices"][0]["logprobs"] is None for c in chunks)
    assert all(c["logprobs"] is None for c in orjson.loads(folded)["choices"])


def test_a_plain_content_chunk_is_spliced_into_exactly_the_bytes_of_the_whole_chunk():
    chunks = ChatChunks(make_request(), TokenStrings(TOKENIZER))
    for index, text in ((0, 'a "quoted" \\ line\n'), (1, "😀 語\x01</s>")):
        delta = ChoiceDelta(text, [T("a"), T("b")], ["", text])
        choice = {
            "index": index,
            "delta": {"content": text},
            "logprobs": None,
            "finish_reason": None,
            "stop_reason": None,
        }
        envelope = {
            "id": "chatcmpl-3",
            "object": "chat.completion.chunk",
            "created": 5,
            "model": "tiny",
        }
        assert delivered_event(chunks, index, delta) == encode_event(
            envelope | {"choices": [choice]}
        )
    assert chunks.usage.total()["completion_tokens"] == 4
