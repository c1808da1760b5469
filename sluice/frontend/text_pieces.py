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


def token_pieces(delta: ChoiceDelta) -> list[TextPiece]:
    """`delta.text` as one piece per token that released text. The text is a
    prefix of the tokens' texts (a stop string may cut the last); a finishing
    delta without text is one empty final piece."""
    text, is_final = delta.text, delta.is_finished
    pieces, position = [], 0
    for token_text in delta.token_texts:
        end = min(position + len(token_text), len(text))
        if end > position:
            pieces.append(text[position:end])
            position = end
    if position < len(text):
        pieces.append(text[position:])
    if not pieces:
        return [TextPiece("", is_final)]
    last = len(pieces) - 1
    return [TextPiece(piece, is_final and i == last) for i, piece in enumerate(pieces)]
