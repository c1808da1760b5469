"""The fake tokenizer has the hard pieces it promises."""

from __future__ import annotations

from sluice.testing import FakeTokenizer

TOKENIZER = FakeTokenizer()
T = TOKENIZER.token_id


def test_every_unit_decodes_to_complete_text():
    for unit in TOKENIZER.units:
        text = TOKENIZER.decode(list(unit), skip_special_tokens=False)
        assert "\ufffd" not in text


def test_partial_pieces_decode_to_a_replacement_char_alone_and_a_character_together():
    assert TOKENIZER.decode([T("😀[:2]")]) == "\ufffd"
    assert TOKENIZER.decode([T("😀[:2]"), T("😀[2:]")]) == "😀"
    assert TOKENIZER.decode(TOKENIZER.byte_ids("語")) == "語"


def test_a_word_start_drops_its_space_only_at_the_start_of_a_decode():
    hello = T("▁hello")
    assert TOKENIZER.decode([hello]) == "hello"
    assert TOKENIZER.decode([hello, hello]) == "hello hello"
    assert TOKENIZER.token_bytes(hello) == b" hello"


def test_special_tokens_are_skipped_or_joined_with_spaces():
    ids = [T("a"), TOKENIZER.eos_token_id, T("b")]
    assert TOKENIZER.decode(ids) == "ab"
    assert TOKENIZER.decode(ids, skip_special_tokens=False) == "a </s> b"
    assert TOKENIZER.decode(ids, False, spaces_between_special_tokens=False) == "a</s>b"
    assert TOKENIZER.convert_ids_to_tokens(ids) == ["a", "</s>", "b"]


def test_encode_round_trips_through_decode():
    text = "hello world 😀 語 ไทย, abc! Ω"
    assert TOKENIZER.decode(TOKENIZER.encode(text)) == text
