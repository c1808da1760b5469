"""Stop strings over one choice's released text, piece by piece.

A piece is the text one group of tokens released (see `detokenizer`), pushed
with an opaque payload (those tokens and their logprobs). The checker releases
pieces whole: a piece's text, its tokens and their logprob entries leave
together or wait together. Invariants:
- Released text is never retracted: a piece is held while its text overlaps
  the longest suffix of the text that could still begin a stop string, and
  nothing is held when there are no stop strings or when stop strings are
  included in the output (then nothing released can turn out wrong).
- The earliest match wins: the one ending first in the text; on a tie, the
  one starting first (the longest), as a character-by-character stream would.
- A match must end in a piece pushed with `may_match` (the default). Text
  pushed without it (the text of the first `min_tokens` tokens, a finishing
  stop token's text) is held and released like any other, and a match may
  start in it, but none ends in it.
- On a match, every held piece is released, the last one being the piece that
  completed the match; its text is cut at the match's end (stop string
  included) or start (excluded), dropping what followed inside that piece.
- `flush` (generation ended without a match) releases everything held.
- Work per piece is linear in its text plus the longest stop string, whatever
  is held: each stop string is followed by a KMP automaton (its state is the
  length of the longest suffix of the text so far that begins the string),
  and held pieces are released from the front without touching the rest.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class StopRelease(Generic[T]):
    # Text released now, trimmed at a match.
    text: str = ""
    # Payloads of the pieces released now, in push order.
    payloads: list[T] = field(default_factory=list)
    # The stop string that matched; the choice is then finished.
    stop_string: str | None = None


@dataclass(slots=True)
class _HeldPiece(Generic[T]):
    text: str
    payload: T


class _StopMatcher:
    """One stop string, followed character by character (Knuth-Morris-Pratt)."""

    __slots__ = ("stop", "_fallback", "_state")

    def __init__(self, stop: str):
        self.stop = stop
        # _fallback[k]: length of the longest proper prefix of stop[:k] that is
        # also its suffix, where matching resumes when character k does not fit.
        self._fallback = _fallback_table(stop)
        # Length of the longest suffix of the text so far that begins `stop`.
        self._state = 0

    @property
    def num_prefix_chars(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of `stop`."""
        state = self._state
        return self._fallback[state] if state == len(self.stop) else state

    def advance(self, text: str, may_match: bool) -> int:
        """Read `text`; where in it the first match ends (exclusive), or -1.
        Without `may_match`, matches are passed over. Reading stops at a match."""
        stop, fallback, state = self.stop, self._fallback, self._state
        first_char, stop_len = stop[0], len(stop)
        position, text_len = 0, len(text)
        while position < text_len:
            if state == 0:
                # Nothing begun: skip to the next possible start at C speed.
                position = text.find(first_char, position)
                if position < 0:
                    break
            char = text[position]
            while state and (state == stop_len or stop[state] != char):
                state = fallback[state]
            if stop[state] == char:
                state += 1
            position += 1
            if state == stop_len and may_match:
                self._state = state
                return position
        self._state = state
        return -1


# Every choice of a request (up to 1,024) follows the same stop strings, and
# building a table is a Python loop over the string: build it once.
@lru_cache(maxsize=256)
def _fallback_table(stop: str) -> tuple[int, ...]:
    """KMP's failure function, indexed by prefix length (0..len(stop))."""
    table = [0] * (len(stop) + 1)
    state = 0
    for position in range(1, len(stop)):
        char = stop[position]
        while state and stop[state] != char:
            state = table[state]
        if stop[state] == char:
            state += 1
        table[position + 1] = state
    return tuple(table)


class StopChecker(Generic[T]):
    def __init__(self, stop_strings: tuple[str, ...], *, include_stop_str_in_output: bool):
        self._matchers = [_StopMatcher(stop) for stop in stop_strings if stop]
        self._include_stop_str = include_stop_str_in_output
        # Pieces not released yet, oldest first, and the length of their text.
        self._held: deque[_HeldPiece[T]] = deque()
        self._num_held_chars = 0
        self.is_finished = False

    def push(self, text: str, payload: T, *, may_match: bool = True) -> StopRelease[T]:
        """Add one piece; return what can be released now. Without `may_match`
        no match may end in `text` (one may still start in it)."""
        assert not self.is_finished, "no piece after a stop string matched"
        if not self._matchers:
            return StopRelease(text, [payload])
        self._held.append(_HeldPiece(text, payload))
        self._num_held_chars += len(text)
        match = self._earliest_match(text, may_match)
        if match is not None:
            return self._release_match(len(text), *match)
        num_chars_to_hold = 0
        if not self._include_stop_str:
            num_chars_to_hold = max(matcher.num_prefix_chars for matcher in self._matchers)
        return self._release_until(self._num_held_chars - num_chars_to_hold)

    def flush(self) -> StopRelease[T]:
        """Release everything held (generation ended without a match)."""
        return self._release_until(self._num_held_chars)

    def _earliest_match(self, text: str, may_match: bool) -> tuple[int, str] | None:
        """(end in `text`, stop string) of the match ending first in `text`."""
        best: tuple[int, str] | None = None
        for matcher in self._matchers:
            end = matcher.advance(text, may_match)
            if end < 0:
                continue
            stop = matcher.stop
            if best is None or (end, -len(stop)) < (best[0], -len(best[1])):
                best = (end, stop)
        return best

    def _release_match(self, text_len: int, end: int, stop: str) -> StopRelease[T]:
        self.is_finished = True
        # Where the match ends in the held text, whose last piece is the new one.
        held_end = self._num_held_chars - text_len + end
        cut = held_end if self._include_stop_str else held_end - len(stop)
        assert cut >= 0, "a match starting in released text means a retraction"
        held_text = "".join(piece.text for piece in self._held)
        payloads = [piece.payload for piece in self._held]
        self._held.clear()
        self._num_held_chars = 0
        return StopRelease(held_text[:cut], payloads, stop)

    def _release_until(self, limit: int) -> StopRelease[T]:
        """Release the pieces whose text ends at or before `limit` in the held text."""
        held = self._held
        released: list[_HeldPiece[T]] = []
        num_released_chars = 0
        while held and num_released_chars + len(held[0].text) <= limit:
            piece = held.popleft()
            num_released_chars += len(piece.text)
            released.append(piece)
        if not released:
            return StopRelease()
        self._num_held_chars -= num_released_chars
        text = released[0].text if len(released) == 1 else "".join(p.text for p in released)
        return StopRelease(text, [piece.payload for piece in released])
