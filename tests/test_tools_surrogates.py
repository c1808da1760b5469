"""Lone surrogates a model writes in JSON become U+FFFD; pairs stay; a growing
text's mended prefix is a prefix of the mended whole."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.tools.surrogates import mend_decoded, mend_escapes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r'{"a": "\ud83d"}', r'{"a": "\ufffd"}'),
        (r'{"a": "\udc00x"}', r'{"a": "\ufffdx"}'),
        (r'{"a": "\ud83d\ude00"}', r'{"a": "\ud83d\ude00"}'),
        (r'{"a": "\ud83d\n"}', r'{"a": "\ufffd\n"}'),
        (r'{"a": "\ud83d\ud83d\ude00"}', r'{"a": "\ufffd\ud83d\ude00"}'),
        (r'{"a": "\\ud83d"}', r'{"a": "\\ud83d"}'),  # an escaped backslash, then text
        (r'{"a": "\\\ud83d"}', r'{"a": "\\\ufffd"}'),
        (r'{"a": "\u00e9"}', r'{"a": "\u00e9"}'),
    ],
)
def test_lone_surrogate_escapes_become_u_fffd_and_pairs_stay(text, expected):
    assert mend_escapes(text, True) == expected
    json.loads(expected)["a"].encode()  # decodes to text that UTF-8 takes


def test_an_escape_that_may_still_change_is_held_until_decided():
    assert mend_escapes(r'"ab\ud83d', False) == '"ab'
    assert mend_escapes(r'"ab\ud83d\ud', False) == '"ab'
    assert mend_escapes(r'"ab\u00', False) == '"ab'
    assert mend_escapes(r'"ab\ud83d', True) == r'"ab\ufffd'
    assert mend_escapes(r'"ab\\', False) == r'"ab\\'


def test_a_decoded_lone_surrogate_becomes_u_fffd():
    assert mend_decoded(json.loads(r'"get_weather\ud83d"')) == "get_weather\ufffd"
    assert mend_decoded("😀") == "😀"


PIECES = st.sampled_from(
    ["\\ud83d", "\\ude00", "\\udc00", "\\u", "\\", "\\\\", "\\n", "d8", "a", "é"]
)


@given(st.lists(PIECES, max_size=12).map("".join))
def test_a_prefix_mended_undecided_is_a_prefix_of_the_whole_mended(text):
    whole = mend_escapes(text, True)
    assert len(whole) == len(text), "mending keeps every position"
    for cut in range(len(text) + 1):
        assert whole.startswith(mend_escapes(text[:cut], False)), text[:cut]
