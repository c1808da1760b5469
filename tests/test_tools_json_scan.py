"""The JSON scanner: where a value ends, and answers that agree across prefixes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.tools.json_scan import Scan, Status, ValueScanner, scan_value

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=10,
)
SEPARATORS = st.sampled_from([(", ", ": "), (",", ":"), (" , ", " : ")])
# Pieces that make texts close to JSON: most are broken somewhere.
PIECES = st.sampled_from(
    ['{', '}', '[', ']', '"', '\\', '\\u00', 'e9', ':', ',', ' ', '\n', '1', '-', '.', 'e',
     '+', '0', 'tru', 'e', 'null', 'fals', '"k"', 'é', '😀', '\x01', 'x']
)  # fmt: skip
NEAR_JSON = st.lists(PIECES, max_size=24).map("".join)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1} tail', Scan(Status.COMPLETE, 8)),
        ('{"a": [1, 2.5e-3, "x\\"y"]}', Scan(Status.COMPLETE, 26)),
        ('{"a": 1', Scan(Status.INCOMPLETE, 7)),
        ("12", Scan(Status.INCOMPLETE, 2)),
        ("12 ", Scan(Status.COMPLETE, 2)),
        ("1.", Scan(Status.INCOMPLETE, 2)),
        ("1.x", Scan(Status.INVALID, 2)),
        ("1e+", Scan(Status.INCOMPLETE, 3)),
        ("1ex", Scan(Status.INVALID, 2)),
        ("01", Scan(Status.COMPLETE, 1)),
        ("[01]", Scan(Status.INVALID, 2)),
        ('"a\\u12', Scan(Status.INCOMPLETE, 6)),
        ('"a\\u12g"', Scan(Status.INVALID, 6)),
        ('"a\\a"', Scan(Status.INVALID, 3)),
        ('"a\x01"', Scan(Status.INVALID, 2)),
        ('{"a" 1}', Scan(Status.INVALID, 5)),
        ('{"a": 1,}', Scan(Status.INVALID, 8)),
        ("[1}", Scan(Status.INVALID, 2)),
        ("nul", Scan(Status.INCOMPLETE, 3)),
        ("nulx", Scan(Status.INVALID, 3)),
        ("{}", Scan(Status.COMPLETE, 2)),
        ("[ ]", Scan(Status.COMPLETE, 3)),
    ],
)
def test_scan_value_finds_the_end_or_the_break(text, expected):
    assert scan_value(text, 0) == expected


@given(JSON_VALUES, SEPARATORS, st.booleans())
def test_a_whole_value_is_complete_and_every_proper_prefix_incomplete(value, separators, ascii_):
    text = json.dumps(value, separators=separators, ensure_ascii=ascii_)
    assert scan_value(text + " ", 0) == Scan(Status.COMPLETE, len(text))
    for cut in range(1, len(text)):
        assert scan_value(text[:cut], 0) == Scan(Status.INCOMPLETE, cut)


@given(NEAR_JSON.filter(bool))
def test_answers_agree_with_every_prefix_and_with_json(text):
    whole = scan_value(text, 0)
    if whole.status is Status.COMPLETE:
        json.loads(text[: whole.end])
    for cut in range(1, len(text) + 1):
        prefix = scan_value(text[:cut], 0)
        if whole.status is Status.INVALID and cut > whole.end:
            assert prefix == whole, "past the break, every prefix breaks there"
        elif whole.status is Status.COMPLETE and cut > whole.end:
            assert prefix == whole, "past the end, every prefix ends there"
        elif prefix.status is Status.COMPLETE:
            assert prefix == whole, "a complete prefix is the value"
        else:
            assert prefix == Scan(Status.INCOMPLETE, cut), "before the end or break: open"


@given(NEAR_JSON.filter(bool))
def test_an_invalid_scan_ends_at_the_longest_valid_beginning(text):
    whole = scan_value(text, 0)
    if whole.status is Status.INVALID:
        # The part before the break begins a valid value: some completion parses.
        assert scan_value(text[: whole.end], 0).status is not Status.INVALID


@given(NEAR_JSON.filter(bool) | JSON_VALUES.map(json.dumps), st.data())
def test_a_scan_resumed_as_the_text_grows_answers_as_a_fresh_scan(text, data):
    cuts = sorted(data.draw(st.sets(st.integers(1, len(text)), max_size=8)) | {len(text)})
    scanner = ValueScanner(0)
    for cut in cuts:
        assert scanner.scan(text[:cut]) == scan_value(text[:cut], 0), text[:cut]
