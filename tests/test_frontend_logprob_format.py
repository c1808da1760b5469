"""Logprob entries in both formats: aligned strings, offsets, alternatives, no infinities."""

from __future__ import annotations

import math

from sluice.frontend.deltas import ChoiceDelta, SampledLogprob
from sluice.frontend.logprob_format import (
    NON_FINITE_LOGPROB,
    TokenStrings,
    chat_logprobs,
    completion_logprobs,
    json_logprob,
)
from sluice.testing import FakeTokenizer

TOKENIZER = FakeTokenizer()
T = TOKENIZER.token_id
STRINGS = TokenStrings(TOKENIZER)
HEAD, TAIL = T("😀[:2]"), T("😀[2:]")


def emoji_delta() -> ChoiceDelta:
    """ "a😀": the emoji split over two tokens; alternatives include a partial piece."""
    return ChoiceDelta(
        text="a😀",
        token_ids=[T("a"), HEAD, TAIL],
        token_texts=["a", "", "😀"],
        logprobs=[
            SampledLogprob(-0.5, (T("a"), T("b")), (-0.5, -1.0)),
            SampledLogprob(-math.inf, (T("x"), HEAD), (-0.1, -math.inf)),
            SampledLogprob(math.nan, (), ()),
        ],
    )


def test_non_finite_logprobs_become_minus_9999():
    values = [json_logprob(v) for v in (-1.5, -math.inf, math.nan)]
    assert values == [-1.5, NON_FINITE_LOGPROB, NON_FINITE_LOGPROB]


def test_alternatives_are_named_by_their_bytes_or_an_escape_when_partial():
    assert STRINGS.get(T("▁hello")) == (" hello", list(b" hello"))
    assert STRINGS.get(HEAD) == ("bytes:\\xf0\\x9f", [0xF0, 0x9F])


def test_completion_entries_align_with_the_text_and_continue_the_offset():
    fragment, offset = completion_logprobs(emoji_delta(), 10, STRINGS)
    assert fragment["tokens"] == ["a", "", "😀"]
    assert fragment["text_offset"] == [10, 11, 11]
    assert offset == 12
    assert fragment["token_logprobs"] == [-0.5, NON_FINITE_LOGPROB, NON_FINITE_LOGPROB]


def test_completion_top_logprobs_hold_the_alternatives_plus_the_sampled_token():
    fragment, _ = completion_logprobs(emoji_delta(), 0, STRINGS)
    first, second, third = fragment["top_logprobs"]
    assert first == {"a": -0.5, "b": -1.0}
    assert second == {"x": -0.1, "": NON_FINITE_LOGPROB}
    assert third == {"😀": NON_FINITE_LOGPROB}
    for token, value, top in zip(
        fragment["tokens"], fragment["token_logprobs"], fragment["top_logprobs"], strict=True
    ):
        assert top[token] == value


def test_chat_entries_carry_their_text_bytes_and_exactly_the_top_k():
    entries = chat_logprobs(emoji_delta(), STRINGS)
    assert [e["token"] for e in entries] == ["a", "", "😀"]
    assert b"".join(bytes(e["bytes"]) for e in entries) == "a😀".encode()
    assert [len(e["top_logprobs"]) for e in entries] == [2, 2, 0]
    assert entries[1]["top_logprobs"][0] == {"token": "x", "logprob": -0.1, "bytes": [ord("x")]}
    assert entries[1]["top_logprobs"][1]["token"] == ""  # the sampled token keeps its text
    assert entries[1]["logprob"] == NON_FINITE_LOGPROB
