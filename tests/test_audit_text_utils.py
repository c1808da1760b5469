"""UTF-8 tails, stop cuts and delta alignment, including properties over any chunking."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.audit.text_utils import align_deltas, split_partial_utf8, stopped_text


def test_an_incomplete_last_character_is_split_off():
    data = "ab😀".encode()
    assert split_partial_utf8(data[:-1]) == (b"ab", data[2:-1])
    assert split_partial_utf8(data) == (data, b"")


def test_the_stop_that_completes_first_wins_even_if_another_starts_earlier():
    text = "abcdefghij"
    assert stopped_text(text, ["bcdefg", "cde"], include_stop=False) == "ab"
    assert stopped_text(text, ["cdefg", "de"], include_stop=False) == "abc"
    assert stopped_text(text, ["de"], include_stop=True) == "abcde"
    assert stopped_text(text, ["zz"], include_stop=False) == text


def test_a_repeated_delta_is_a_duplicate_and_a_jump_is_a_skip():
    reference = "one two three four five"
    deltas = [(1, "one"), (2, " two"), (3, " two"), (4, " four"), (5, " five")]
    outcome = align_deltas(reference, deltas)
    assert outcome.duplicates == [3]
    assert outcome.skips == [(4, len(" three"))]
    assert not outcome.has_diverged


def test_a_stream_that_leaves_the_reference_is_divergence_not_duplication():
    outcome = align_deltas("one two three", [(1, "one"), (2, " two"), (3, " two"), (4, " cats")])
    assert outcome.has_diverged
    assert align_deltas("one two", [(1, "one")]).has_diverged


def test_alignment_works_on_token_tuples_too():
    reference = (b"a", b"b", b"c", b"d")
    outcome = align_deltas(reference, [(1, (b"a",)), (2, (b"a",)), (3, (b"c", b"d"))])
    assert outcome.duplicates == [2]
    assert outcome.skips == [(3, 1)]


@given(st.text(min_size=1, max_size=60), st.lists(st.integers(1, 8), min_size=1, max_size=30))
def test_any_chunking_of_the_reference_aligns_without_findings(text: str, sizes: list[int]):
    deltas, position = [], 0
    for number, size in enumerate(sizes):
        deltas.append((number, text[position : position + size]))
        position += size
    deltas.append((len(sizes), text[position:]))
    outcome = align_deltas(text, deltas)
    assert (outcome.duplicates, outcome.skips, outcome.has_diverged) == ([], [], False)
