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
- On a match, every held piece is released, the last one being the piece that
  completed the match; its text is cut at the match's end (stop string
  included) or start (excluded), dropping what followed inside that piece.
- `flush` (generation ended without a match) releases everything held.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    # Where this piece's text ends in the held text.
    end: int
    payload: T


class StopChecker(Generic[T]):
    def __init__(self, stop_strings: tuple[str, ...], *, include_stop_str_in_output: bool):
        self._stop_strings = tuple(s for s in stop_strings if s)
        self._include_stop_str = include_stop_str_in_output
        # Released text a match may still start in (only when stop strings are
        # included; otherwise every possible match start is held).
        self._tail_len = max((len(s) for s in self._stop_strings), default=1) - 1
        self._tail = ""
        self._held_text = ""
        self._held: list[_HeldPiece[T]] = []
        self.is_finished = False

    def push(self, text: str, payload: T) -> StopRelease[T]:
        """Add one piece; return what can be released now."""
        assert not self.is_finished, "no piece after a stop string matched"
        if not self._stop_strings:
            return StopRelease(text, [payload])
        num_searched = len(self._tail) + len(self._held_text)
        self._held_text += text
        self._held.append(_HeldPiece(len(self._held_text), payload))
        match = self._find_match(num_searched)
        if match is not None:
            return self._release_match(*match)
        num_held_chars = 0 if self._include_stop_str else self._num_chars_to_hold()
        return self._release_until(len(self._held_text) - num_held_chars)

    def flush(self) -> StopRelease[T]:
        """Release everything held (generation ended without a match)."""
        return self._release_until(len(self._held_text))

    def _find_match(self, num_searched: int) -> tuple[int, int, str] | None:
        """(start, end, stop string) of the earliest match ending in new text."""
        text = self._tail + self._held_text
        best: tuple[int, int, str] | None = None
        for stop in self._stop_strings:
            start = text.find(stop, max(0, num_searched - len(stop) + 1))
            if start < 0:
                continue
            end = start + len(stop)
            if best is None or (end, start) < (best[1], best[0]):
                best = (start, end, stop)
        return best

    def _release_match(self, start: int, end: int, stop: str) -> StopRelease[T]:
        self.is_finished = True
        cut = (end if self._include_stop_str else start) - len(self._tail)
        assert cut >= 0, "a match starting in released text means a retraction"
        payloads = [piece.payload for piece in self._held]
        text = self._held_text[:cut]
        self._held, self._held_text = [], ""
        return StopRelease(text, payloads, stop)

    def _num_chars_to_hold(self) -> int:
        """Length of the longest suffix of the held text that begins a stop string."""
        text = self._held_text
        longest = 0
        for stop in self._stop_strings:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _release_until(self, limit: int) -> StopRelease[T]:
        """Release the pieces whose text ends at or before `limit`."""
        num_pieces = 0
        while num_pieces < len(self._held) and self._held[num_pieces].end <= limit:
            num_pieces += 1
        if num_pieces == 0:
            return StopRelease()
        released_len = self._held[num_pieces - 1].end
        text = self._held_text[:released_len]
        payloads = [piece.payload for piece in self._held[:num_pieces]]
        del self._held[:num_pieces]
        for piece in self._held:
            piece.end -= released_len
        self._held_text = self._held_text[released_len:]
        if self._include_stop_str and self._tail_len:
            self._tail = (self._tail + text)[-self._tail_len :]
        return StopRelease(text, payloads)
