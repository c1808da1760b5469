"""The n-gram index: proposals from the longest earlier occurrence of the
text's suffix, nothing when nothing matches, and work per call that depends
on the tokens appended since the last call, never on the text's length."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.engine.indent_tokens import IndentTokens
from sluice.engine.ngram_proposer import NgramIndex, lookup_lengths


class CountingText(Sequence[int]):
    """A token list that counts the positions read through it."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.num_reads = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index):
        part = self.tokens[index]
        self.num_reads += len(part) if isinstance(index, slice) else 1
        return part


def brute_force(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The reference: scan the whole text for the latest earlier occurrence."""
    length = len(tokens)
    for n in sorted(lookup_lengths(min_n, max_n), reverse=True):
        if n > length - 1:
            continue
        suffix = tokens[length - n :]
        for end in range(length - 1, n - 1, -1):
            if tokens[end - n : end] == suffix:
                proposal = tokens[end : end + k]
                while len(proposal) < k:
                    proposal.append(proposal[len(proposal) - (length - end)])
                return proposal
    return []


def test_the_tokens_after_the_earlier_occurrence_are_proposed():
    index = NgramIndex(1, 3)
    assert index.propose([1, 2, 3, 4, 5, 1, 2], 3) == [3, 4, 5]


def test_the_longest_matching_n_gram_wins_over_a_later_shorter_one():
    # "7 8" occurred before 30; "8" alone occurred more recently before 40.
    tokens = [7, 8, 30, 31, 8, 40, 41, 7, 8]
    assert NgramIndex(1, 2).propose(tokens, 2) == [30, 31]
    assert NgramIndex(1, 1).propose(tokens, 2) == [40, 41]


def test_the_most_recent_occurrence_wins_among_equal_lengths():
    assert NgramIndex(2, 2).propose([1, 2, 10, 1, 2, 20, 1, 2], 1) == [20]


def test_nothing_matches_nothing_is_proposed():
    assert NgramIndex(1, 3).propose([1, 2, 3, 4], 4) == []
    assert NgramIndex(2, 3).propose([5, 5], 4) == []  # too short for a 2-gram before it
    assert NgramIndex(1, 3).propose([1], 4) == []
    assert NgramIndex(1, 3).propose([1, 2, 1], 0) == []


def test_lengths_up_to_4_each_then_about_one_and_a_half_apart():
    assert lookup_lengths(1, 16) == (1, 2, 3, 4, 6, 8, 12, 16)
    assert lookup_lengths(2, 4) == (2, 3, 4)
    assert lookup_lengths(5, 7) == (5, 6, 7)
    assert lookup_lengths(3, 3) == (3,)
    assert lookup_lengths(1, 64) == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def test_a_long_match_finds_the_place_being_copied_among_short_ones():
    # A JSON-like text: the short suffix (7, 8) recurs after every record;
    # only the 6-gram says which record is being copied.
    records = [[1, 2, 3, 10 + r, 7, 8, 20 + r] for r in range(4)]
    text = [t for record in records for t in record] + [1, 2, 3, 11, 7, 8]
    assert NgramIndex(1, 16).propose(text, 1) == [21]
    assert NgramIndex(1, 2).propose(text, 1) == [23]  # the most recent (7, 8)


def test_a_loop_is_proposed_round_its_period():
    assert NgramIndex(1, 3).propose([5, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]
    assert NgramIndex(1, 1).propose([9, 7, 7], 3) == [7, 7, 7]


@given(
    tokens=st.lists(st.integers(0, 5), min_size=1, max_size=60),
    k=st.integers(1, 8),
    min_n=st.integers(1, 3),
    extra_n=st.integers(0, 20),
    cuts=st.lists(st.integers(1, 60), max_size=6),
)
def test_an_index_grown_call_by_call_proposes_what_a_full_scan_finds(
    tokens, k, min_n, extra_n, cuts
):
    index = NgramIndex(min_n, min_n + extra_n)
    for cut in [*sorted(c for c in cuts if c < len(tokens)), len(tokens)]:
        text = tokens[:cut]
        assert index.propose(text, k) == brute_force(text, k, min_n, min_n + extra_n)


@pytest.mark.parametrize("length", [200, 20_000])
def test_work_per_call_depends_on_the_new_tokens_not_the_text(length):
    rng = random.Random(0)
    text = CountingText([rng.randrange(1000) for _ in range(length)])
    index = NgramIndex(1, 4)
    index.propose(text, 4)
    reads = []
    for _ in range(20):
        text.tokens.append(rng.randrange(1000))
        text.num_reads = 0
        index.propose(text, 4)
        reads.append(text.num_reads)
    # 4 n-grams indexed and 4 suffixes looked up per new token, plus a proposal.
    assert max(reads) <= 4 * 4 + 4 * 4 + 4


# A vocabulary with indentation tokens: WIDTH[w] is a line break plus w spaces.
WIDTH = {w: 100 + w for w in range(0, 13)}


def indentation_table() -> IndentTokens:
    def token_bytes(token_id: int) -> bytes:
        if 100 <= token_id <= 112:
            return b"\n" + b" " * (token_id - 100)
        return b"t%d" % token_id

    indents = IndentTokens.from_vocabulary(120, token_bytes)
    assert indents is not None
    return indents


def lines(width: int, *rows: list[int]) -> list[int]:
    return [t for row in rows for t in [WIDTH[width], *row]]


def test_a_copy_at_another_depth_is_proposed_at_the_copys_depth():
    document = lines(8, [1, 2], [3, 4], [5, 6])  # a document indented by 8
    copy = lines(4, [1, 2])  # the model repeats it indented by 4
    text = [9, *document, 7, *copy]
    expected = lines(4, [3, 4], [5, 6])
    assert NgramIndex(1, 16, indentation_table()).propose(text, 6) == expected
    # Matched token for token, the lookup stops at the first line break.
    assert NgramIndex(1, 16).propose(text, 6)[0] == WIDTH[8]


def test_the_latest_line_break_of_the_match_sets_the_shift():
    # The copy's first line is at the document's depth, its second 2 deeper.
    document = lines(2, [1, 2], [3, 4], [5, 6])
    text = [*document, 7, *lines(2, [1, 2]), *lines(4, [3, 4])]
    assert NgramIndex(1, 16, indentation_table()).propose(text, 3) == lines(4, [5, 6])


def test_a_shift_no_token_has_cuts_the_proposal():
    indents = indentation_table()
    # Copied 2 deeper: the line at 12 would go to 14, which no token has.
    text = [*lines(8, [1, 2], [3]), *lines(12, [4]), 7, *lines(10, [1, 2])]
    assert NgramIndex(1, 16, indents).propose(text, 6) == lines(10, [3])
    # Copied 2 shallower: the line at 0 would go to -2.
    text = [*lines(4, [1, 2], [3]), *lines(0, [5]), 7, *lines(2, [1, 2])]
    assert NgramIndex(1, 16, indents).propose(text, 6) == lines(2, [3])


@given(
    tokens=st.lists(st.integers(0, 5), min_size=1, max_size=60),
    k=st.integers(1, 8),
    cuts=st.lists(st.integers(1, 60), max_size=6),
)
def test_one_width_per_kind_proposes_what_a_plain_index_does(tokens, k, cuts):
    # Tokens 0 and 1 stand for two indentation tokens of different kinds:
    # the keys are then the tokens renamed, and nothing is shifted.
    def token_bytes(token_id: int) -> bytes:
        return {0: b"\n  ", 1: b"\n\n\t"}.get(token_id, b"t%d" % token_id)

    indents = IndentTokens.from_vocabulary(6, token_bytes)
    plain, indented = NgramIndex(1, 6), NgramIndex(1, 6, indents)
    for cut in [*sorted(c for c in cuts if c < len(tokens)), len(tokens)]:
        text = tokens[:cut]
        assert indented.propose(text, k) == plain.propose(text, k)
