"""JSON in pieces: the same value as one `orjson.loads`, never a long call into C."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.server.body import json_pieces
from sluice.server.body.json_pieces import JSONPiecesError, loads

PIECE_SIZES = (1, 2, 3, 5, 8, 16, 64)
# Strings with what makes cutting them hard: escapes, multi-byte characters,
# pairs of surrogates when written ASCII-only, backslashes and quotes.
TEXT = st.text(
    st.sampled_from(list('ab"\\/\n\t\x01 é語😀,]}:')) | st.characters(codec="utf-8"),
    max_size=40,
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda children: st.lists(children, max_size=6)
    | st.dictionaries(TEXT, children, max_size=6),
    max_leaves=40,
)  # fmt: skip
STYLES = (
    orjson.dumps,
    lambda value: json.dumps(value).encode(),  # ASCII only: escapes, surrogate pairs
    lambda value: json.dumps(value, indent=2, ensure_ascii=False).encode(),
    lambda value: json.dumps(value, separators=(" ,  ", " :\t")).encode(),
)


def same_as_orjson(document: bytes, piece_bytes: int) -> None:
    try:
        expected = orjson.loads(document)
    except orjson.JSONDecodeError:
        with pytest.raises(JSONPiecesError):
            loads(document, piece_bytes)
        return
    assert loads(document, piece_bytes) == expected


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.sampled_from(STYLES), st.sampled_from(PIECE_SIZES))
def test_any_document_parses_to_what_orjson_gives(value, style, piece_bytes):
    same_as_orjson(style(value), piece_bytes)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.sampled_from(STYLES), st.sampled_from(PIECE_SIZES), st.data())
def test_a_damaged_document_is_refused_exactly_when_orjson_refuses_it(
    value, style, piece_bytes, data
):
    document = bytearray(style(value))
    position = data.draw(st.integers(0, len(document)))
    kind = data.draw(st.sampled_from(["delete", "insert", "replace"]))
    byte = data.draw(st.sampled_from(list(b'[]{},:" \\x0e\x80')))
    if kind == "delete" and position < len(document):
        del document[position]
    elif kind == "insert":
        document.insert(position, byte)
    elif position < len(document):
        document[position] = byte
    same_as_orjson(bytes(document), piece_bytes)


@pytest.mark.parametrize(
    "document",
    [
        b"", b"   ", b"[1,2,]", b'{"a":1,}', b"[1 2]", b'{"a" 1}', b'{"a":1 "b":2}',
        b"[1,2]x", b'["abc', b"[[1,2],[3,4]", b'{"a":[1,2}}', b"[1,,2]", b"[01]",
        b'["\\ud83d"]', b'["\\ude00\\ud83d"]', b'"\x01"', b"[\"\xff\"]",
    ],
)  # fmt: skip
@pytest.mark.parametrize("piece_bytes", PIECE_SIZES)
def test_invalid_documents_are_refused(document, piece_bytes):
    with pytest.raises(JSONPiecesError):
        loads(document, piece_bytes)


@pytest.mark.parametrize("piece_bytes", PIECE_SIZES)
def test_long_strings_are_cut_between_characters_and_escapes(piece_bytes):
    text = ('é語😀\\"\n\t\x01 plain ' * 20) + "\\" * 33 + "😀" * 9
    for document in (orjson.dumps([text, {text: text}]), json.dumps([text]).encode()):
        assert loads(document, piece_bytes) == orjson.loads(document)


def test_whitespace_runs_longer_than_a_scan_window(monkeypatch):
    monkeypatch.setattr(json_pieces, "SCAN_WINDOW_BYTES", 16)
    document = b" " * 100 + b"[" + b"\n" * 100 + b'1,\t"a"' + b" " * 70 + b"]" + b"\r" * 50
    assert loads(document, piece_bytes=4) == [1, "a"]


def test_nesting_deeper_than_the_limit_is_refused():
    deep = b"[" * (json_pieces.MAX_DEPTH + 1) + b"1" + b"]" * (json_pieces.MAX_DEPTH + 1)
    with pytest.raises(JSONPiecesError, match="nested"):
        loads(deep, piece_bytes=1)
    assert loads(deep[1:-1], piece_bytes=1) == orjson.loads(deep[1:-1])


def largest_orjson_input(monkeypatch, document: bytes, piece_bytes: int) -> int:
    sizes = []
    real_loads = orjson.loads
    expected = real_loads(document)

    def recording_loads(data):
        sizes.append(len(data))
        return real_loads(data)

    monkeypatch.setattr(json_pieces.orjson, "loads", recording_loads)
    assert loads(document, piece_bytes) == expected
    return max(sizes)


@pytest.mark.parametrize(
    "document",
    [
        orjson.dumps({"prompt": list(range(100_000)), "max_tokens": 5}),
        orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "a, b"}] * 20_000}),
        orjson.dumps({"prompt": 'x\\"y é 😀, ' * 50_000, "n": 1}),
        orjson.dumps({"logit_bias": {str(i): 1.5 for i in range(30_000)}}),
        orjson.dumps({"prompt": [[1, 2, 3]] * 30_000, "messages": [{"content": [{}] * 9}] * 3000}),
    ],
    ids=["token ids", "messages", "long string", "large object", "nested"],
)
def test_no_orjson_call_parses_more_than_two_pieces(monkeypatch, document):
    piece_bytes = 4096
    assert len(document) > 50 * piece_bytes
    assert largest_orjson_input(monkeypatch, document, piece_bytes) <= 2 * piece_bytes + 2
