"""The vocabulary's indentation tokens: which tokens are a line break plus
indentation, the key the n-gram index matches them by, and a proposal's
indentation shifted by a width (cut where no token has the shifted width)."""

from __future__ import annotations

from sluice.engine.indent_tokens import IndentShape, IndentTokens

SPACE, TAB = ord(" "), ord("\t")
VOCABULARY = [
    b"\n",  # 0
    b"\n ",  # 1
    b"\n  ",  # 2
    b"\n   ",  # 3
    b"\n    ",  # 4
    b"\n\n  ",  # 5
    b"\n\t",  # 6
    b"\n\t\t",  # 7
    b"    ",  # 8: no line break
    b"\n x",  # 9: text after the indentation
    b"\n \t",  # 10: mixed indentation
    b"x\n",  # 11: the line break is not first
    b"abc",  # 12
    b"\n  ",  # 13: the same shape as 2
]


def table() -> IndentTokens:
    indents = IndentTokens.from_vocabulary(len(VOCABULARY), VOCABULARY.__getitem__)
    assert indents is not None
    return indents


def test_a_line_break_and_one_kind_of_indentation_is_an_indentation_token():
    indents = table()
    assert indents.shape(4) == IndentShape(1, SPACE, 4)
    assert indents.shape(0) == IndentShape(1, SPACE, 0)
    assert indents.shape(5) == IndentShape(2, SPACE, 2)
    assert indents.shape(7) == IndentShape(1, TAB, 2)
    assert [i for i in range(len(VOCABULARY)) if indents.shape(i) is None] == [8, 9, 10, 11, 12]
    assert len(indents) == 9


def test_tokens_of_one_kind_share_a_key_below_every_token_id():
    indents = table()
    assert indents.key(0) == indents.key(2) == indents.key(4) == indents.key(13) < 0
    assert len({indents.key(2), indents.key(5), indents.key(6)}) == 3  # breaks or character differ
    assert indents.key(12) == 12
    assert indents.key(8) == 8


def test_a_proposal_is_shifted_in_its_character_and_cut_where_no_token_fits():
    indents = table()
    assert indents.shifted([2, 12, 4, 12], SPACE, -2) == [0, 12, 2, 12]
    assert indents.shifted([0, 12, 2], SPACE, 2) == [2, 12, 4]
    assert indents.shifted([6, 4], TAB, 1) == [7, 4]  # spaces stay where tabs shift
    assert indents.shifted([12, 2, 4, 12], SPACE, 1) == [12, 3]  # no "\n" + 5 spaces
    assert indents.shifted([12, 1, 12], SPACE, -2) == [12]  # no width -1
    assert indents.shifted([13], SPACE, 0) == [2]  # the lower id stands for a shape


def test_a_vocabulary_without_indentation_has_no_table():
    assert IndentTokens.from_vocabulary(3, [b"a", b"  ", b"b\n"].__getitem__) is None


def test_the_embedded_tokenizers_line_starts_are_indentation_tokens(embedded_tokenizer):
    tokenizer = embedded_tokenizer
    indents = IndentTokens.from_vocabulary(tokenizer.vocab_size, tokenizer.token_bytes)
    assert indents is not None
    ids = tokenizer.encode('{\n    "id": 1,\n    "name": 2\n}')
    line_starts = [i for i in ids if indents.shape(i) is not None]
    # "\n" + 3 spaces (the 4th goes with the key), twice, then "\n" alone.
    assert [tokenizer.decode([i]) for i in line_starts] == ["\n   ", "\n   ", "\n"]
    assert tokenizer.decode(indents.shifted(line_starts, SPACE, 4)) == "\n       " * 2 + "\n    "
