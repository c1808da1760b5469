"""Small text helpers shared by checks and scenarios: UTF-8 tails, where stop
strings cut a text, and aligning streamed deltas against a reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

Piece = TypeVar("Piece", str, tuple)


def split_partial_utf8(data: bytes) -> tuple[bytes, bytes]:
    """(complete part, incomplete last character) of a byte string."""
    for cut in range(min(3, len(data)) + 1):
        head = data[: len(data) - cut]
        try:
            head.decode("utf-8")
        except UnicodeDecodeError:
            continue
        return head, data[len(head) :]
    return data, b""


def stopped_text(text: str, stops: Sequence[str], include_stop: bool) -> str:
    """What a correct server returns when `stops` cut the greedy `text`.

    Generation stops when the first stop string completes: the one whose first
    occurrence ends earliest (then the one that starts earliest).
    """
    hits = []
    for stop in stops:
        position = text.find(stop) if stop else -1
        if position >= 0:
            hits.append((position + len(stop), position, stop))
    if not hits:
        return text
    _, position, stop = min(hits)
    return text[: position + len(stop)] if include_stop else text[:position]


@dataclass(slots=True)
class DeltaAlignment:
    """How a stream's deltas line up against the reference output."""

    # Chunk numbers whose delta repeats the previous one instead of continuing.
    duplicates: list[int] = field(default_factory=list)
    # (chunk number, how much of the reference was jumped over before it).
    skips: list[tuple[int, int]] = field(default_factory=list)
    # True when the stream left the reference for good: then it is a
    # determinism difference, and duplicates/skips are not claimed.
    has_diverged: bool = False


def align_deltas(reference: Piece, deltas: list[tuple[int, Piece]]) -> DeltaAlignment:
    """Walk the deltas along `reference`, naming repeats and jumps.

    A repeat is a delta equal to the previous one where the reference does not
    repeat; a jump is a delta found later in the reference. Both are claimed
    only if the whole stream then realigns to the end of the reference.
    """
    outcome = DeltaAlignment()
    position, previous = 0, None
    for number, piece in deltas:
        if not piece:
            continue
        if reference[position : position + len(piece)] == piece:
            position, previous = position + len(piece), piece
        elif previous is not None and piece == previous:
            outcome.duplicates.append(number)
        elif (found := find_piece(reference, piece, position + 1)) >= 0:
            outcome.skips.append((number, found - position))
            position, previous = found + len(piece), piece
        else:
            outcome.has_diverged = True
            return outcome
    outcome.has_diverged = position != len(reference)
    return outcome


def find_piece(reference: Piece, piece: Piece, start: int) -> int:
    if isinstance(reference, str):
        return reference.find(piece, start)
    for offset in range(start, len(reference) - len(piece) + 1):
        if reference[offset : offset + len(piece)] == piece:
            return offset
    return -1


def first_difference(left: Sequence, right: Sequence) -> int:
    """The first position where two texts (or lists) differ; the shorter's length if one is a prefix."""
    for offset, (a, b) in enumerate(zip(left, right, strict=False)):
        if a != b:
            return offset
    return min(len(left), len(right))
