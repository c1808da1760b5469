"""A choice delta's text cut at its tokens' boundaries, for output parsing
that must not depend on how deltas were merged.

A lagging reader gets many engine steps as one merged delta. Pushed to a
tool-call or reasoning parser whole, such a delta would tell it less about
the order of what grew (reasoning, content, a call) than the same text in
steps; pushed token by token, the parser sees the same sequence of pieces
however the deltas were merged, so the items or blocks built from it are the
same for a stream, its lagging twin and the non-streamed response.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.frontend.deltas import ChoiceDelta


@dataclass(frozen=True, slots=True)
class TextPiece:
    text: str
    # The last piece of the choice's last delta: the text is all there is.
    is_final: bool
    # The delta's tokens this piece stands for, in order: the one that released
    # its text and any before it that released none (a partial character);
    # the last piece also takes tokens after the text (a trimmed stop string).
    num_tokens: int


def token_pieces(delta: ChoiceDelta) -> list[TextPiece]:
    """`delta.text` as one piece per token that released text. The text is a
    prefix of the tokens' texts (a stop string may cut the last); a delta
    without text is one empty piece for all its tokens."""
    text = delta.text
    texts: list[str] = []
    counts: list[int] = []
    position, num_waiting = 0, 0
    for token_text in delta.token_texts:
        num_waiting += 1
        end = min(position + len(token_text), len(text))
        if end > position:
            texts.append(text[position:end])
            counts.append(num_waiting)
            position, num_waiting = end, 0
    if position < len(text):
        texts.append(text[position:])
        counts.append(0)
    if not texts:
        return [TextPiece("", delta.is_finished, num_waiting)]
    counts[-1] += num_waiting
    last = len(texts) - 1
    return [
        TextPiece(piece, delta.is_finished and i == last, count)
        for i, (piece, count) in enumerate(zip(texts, counts, strict=True))
    ]


def whole_piece(delta: ChoiceDelta) -> TextPiece:
    """`delta.text` as one piece, for parsing whose result cannot depend on
    where the text is cut (a reasoning split alone)."""
    return TextPiece(delta.text, delta.is_finished, len(delta.token_ids))
