"""Prompt-lookup (n-gram) proposals: the tokens that followed the same n-gram
earlier in the request's own text (prompt and output so far).

One `NgramIndex` per request, owned by the engine loop like the `Request`
that holds it. It maps every n-gram of the text to the end of its most
recent occurrence, for the lengths n of `lookup_lengths(min_n, max_n)`
(each n up to 4, then about 1.5x apart: 1..16 indexes 8 lengths, not 16;
on the benchmark's tasks it proposed exactly as all 16 did). It is extended
only by the tokens appended since the last call: a step costs O(new tokens
* number of lengths), never O(text). The longest n whose suffix occurred
before wins (a long match finds the place being copied among many short
ones, as in JSON's repeated keys); the
proposal is the k tokens that followed its most recent occurrence (where
they run into the suffix itself, the text is a loop: the proposal goes on
round it). Nothing
matches: nothing is proposed (an empty list, no work for the verifier).

Given the vocabulary's indentation tokens (`indent_tokens.py`), the index
matches a line break plus indentation by its line breaks and indent
character, whatever the width, and shifts the widths of the proposal by
the difference between the latest such token of the suffix and its match:
a copy written at another depth (a model that re-indents the JSON it
repeats) keeps matching across its lines. On the json task of
benchmarks/speculative.py, whose answer sits two spaces shallower than its
document, that halved the steps (39 to 19 for its 83 tokens); the other
tasks were unchanged.

The index depends on the tokens alone, so it stays valid across preemption
(the request keeps its tokens); it never sees a rejected proposal, only the
accepted text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sluice.engine.indent_tokens import IndentTokens


class NgramIndex:
    def __init__(self, min_n: int, max_n: int, indents: IndentTokens | None = None) -> None:
        assert 1 <= min_n <= max_n, f"need 1 <= min_n <= max_n, got {min_n}, {max_n}"
        self.lengths = lookup_lengths(min_n, max_n)
        self._indents = indents
        # The text as the index matches it (each token, or its indentation
        # kind), as long as the text was at the last call: the occurrences
        # ending before its last index are in the map.
        self._keys: list[int] = []
        # n-gram -> index just past its most recent occurrence (an end < the
        # indexed length, so the text's own suffix never finds itself).
        self._end_by_ngram: dict[tuple[int, ...], int] = {}

    def propose(self, token_ids: Sequence[int], num_tokens: int) -> list[int]:
        """Up to `num_tokens` tokens that followed the longest earlier
        occurrence of the text's suffix; [] when none occurred."""
        length = len(token_ids)
        keys = self._keys
        num_keyed = len(keys)
        assert length >= num_keyed, "the text only grows"
        # 1. Key the new tokens; index the n-grams that end before the suffix
        # (its own end excluded).
        new_tokens = token_ids[num_keyed:length]
        indents = self._indents
        keys.extend(new_tokens if indents is None else map(indents.key, new_tokens))
        self._index_ends(num_keyed, length - 1)
        if num_tokens <= 0:
            return []
        # 2. The longest suffix seen before.
        for n in reversed(self.lengths):
            if n > length:
                continue
            end = self._end_by_ngram.get(tuple(keys[length - n :]))
            if end is not None:
                proposal = _continuation(token_ids, end, num_tokens)
                return self._reindented(proposal, token_ids, end, n)
        return []

    def _index_ends(self, first_end: int, last_end: int) -> None:
        """Record every n-gram ending at indices [first_end, last_end]."""
        end_by_ngram, keys = self._end_by_ngram, self._keys
        for end in range(first_end, last_end + 1):
            for n in self.lengths:
                if n > end:
                    break
                end_by_ngram[tuple(keys[end - n : end])] = end

    def _reindented(
        self, proposal: list[int], token_ids: Sequence[int], end: int, n: int
    ) -> list[int]:
        """The proposal with its indentation shifted by what the latest
        indentation token of the matched n-gram differs from its match by."""
        indents = self._indents
        if indents is None:
            return proposal
        length = len(token_ids)
        for back in range(1, n + 1):
            shape = indents.shape(token_ids[length - back])
            if shape is not None:
                source = indents.shape(token_ids[end - back])
                assert source is not None, "matched keys: both are indentation"
                delta = shape.width - source.width
                if delta == 0:
                    return proposal
                return indents.shifted(proposal, shape.character, delta)
        return proposal


def lookup_lengths(min_n: int, max_n: int) -> tuple[int, ...]:
    """The n-gram lengths indexed: min_n, max_n, and those of 1, 2, 3, 4, 6,
    8, 12, 16, 24, 32, 48 between them."""
    steps = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)
    return tuple(sorted({n for n in steps if min_n < n < max_n} | {min_n, max_n}))


def _continuation(token_ids: Sequence[int], end: int, num_tokens: int) -> list[int]:
    """The tokens after `end`, as if the text went on repeating its period
    (length - end) once they run out: a loop keeps proposing whole drafts."""
    proposal = list(token_ids[end : end + num_tokens])
    period = len(token_ids) - end
    while len(proposal) < num_tokens:
        proposal.append(proposal[len(proposal) - period])
    return proposal
