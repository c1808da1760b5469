"""Logprob entries of both APIs, with each token's bytes."""

from __future__ import annotations

import math

from sluice.audit.logprob_entries import chat_entries, completion_entries, token_bytes_of


def test_token_bytes_come_from_bytes_escapes_or_utf8():
    assert token_bytes_of("bytes:\\xf0\\x9f") == (b"\xf0\x9f", True)
    assert token_bytes_of("東") == ("東".encode(), True)
    assert token_bytes_of("\ufffd") == ("\ufffd".encode(), False)


def test_chat_bytes_take_precedence_over_the_token_string():
    [entry] = chat_entries(
        {
            "content": [
                {
                    "token": "\ufffd",
                    "logprob": -1.0,
                    "bytes": [240, 159],
                    "top_logprobs": [{"token": "a", "logprob": -2.0}],
                }
            ]
        }
    )
    assert (entry.token_bytes, entry.has_exact_bytes, entry.top) == (b"\xf0\x9f", True, {"a": -2.0})


def test_completion_lists_become_one_entry_per_token_even_when_short():
    entries = completion_entries(
        {
            "tokens": ["a", "b"],
            "token_logprobs": [-0.5],
            "top_logprobs": None,
            "text_offset": [0, 1],
        }
    )
    assert [(e.token, e.logprob, e.text_offset) for e in entries] == [
        ("a", -0.5, 0),
        ("b", None, 1),
    ]
    assert not entries[1].is_finite


def test_nan_infinity_and_strings_are_not_finite():
    def entry(value):
        return completion_entries(
            {"tokens": ["a"], "token_logprobs": [value], "top_logprobs": [{}]}
        )[0]

    assert entry(-9999.0).is_finite
    assert (
        not entry(math.nan).is_finite
        and not entry(-math.inf).is_finite
        and not entry("-inf").is_finite
    )


def test_absent_logprobs_are_none_not_empty():
    assert chat_entries(None) is None and completion_entries({"tokens": None}) is None
    assert chat_entries({"content": []}) == []
