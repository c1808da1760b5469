"""The vocabulary's indentation tokens, so an n-gram lookup can follow a copy
that changed its indentation.

A byte-level BPE vocabulary (Llama 3, Qwen, SmolLM, GPT) holds tokens that
are a line break and the next line's indentation: "\\n", "\\n    ",
"\\n\\t\\t". A model that re-indents what it copies (JSON written at another
depth, code moved into a block) writes such a token at every line start,
and a plain lookup stops matching there. `IndentTokens` names each such
token's shape (line breaks, indent character, width) so that the n-gram
index (`ngram_proposer.py`) can match them by their line breaks and
character alone and shift the widths of what it proposes by the difference
it saw. A shifted proposal is still only a draft: the verifier keeps exactly
what the model samples.

Built once per engine from the tokenizer (`from_vocabulary`); immutable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

INDENT_CHARACTERS = b" \t"


@dataclass(frozen=True, slots=True)
class IndentShape:
    # Line breaks first, then `width` copies of `character` (b" " or b"\t").
    num_line_breaks: int
    character: int
    width: int


class IndentTokens:
    """Which tokens are a line break plus indentation, and each one's shape."""

    def __init__(self, shape_by_id: dict[int, IndentShape]) -> None:
        self._shape_by_id = shape_by_id
        # Where two ids have one shape, the lower id stands for it.
        self._id_by_shape: dict[IndentShape, int] = {}
        for token_id in sorted(shape_by_id):
            self._id_by_shape.setdefault(shape_by_id[token_id], token_id)
        # (line breaks, character) -> a key below every token id: what the
        # index matches instead of the token, whatever its width.
        kinds = sorted({(s.num_line_breaks, s.character) for s in shape_by_id.values()})
        key_by_kind = {kind: -1 - i for i, kind in enumerate(kinds)}
        self._key_by_id = {
            token_id: key_by_kind[(s.num_line_breaks, s.character)]
            for token_id, s in shape_by_id.items()
        }

    @classmethod
    def from_vocabulary(
        cls, vocab_size: int, token_bytes: Callable[[int], bytes]
    ) -> IndentTokens | None:
        """The indentation tokens among ids 0 .. vocab_size - 1 (`token_bytes`:
        the bytes a token adds to decoded text); None if there are none."""
        shapes = {}
        for token_id in range(vocab_size):
            shape = _shape_of(token_bytes(token_id))
            if shape is not None:
                shapes[token_id] = shape
        return cls(shapes) if shapes else None

    def __len__(self) -> int:
        return len(self._shape_by_id)

    def key(self, token_id: int) -> int:
        """What the index matches: the token's kind (negative) if it is an
        indentation token, else the token itself."""
        return self._key_by_id.get(token_id, token_id)

    def shape(self, token_id: int) -> IndentShape | None:
        return self._shape_by_id.get(token_id)

    def shifted(self, tokens: Sequence[int], character: int, delta: int) -> list[int]:
        """`tokens` with each indentation of `character` `delta` wider, cut
        before the first whose shifted width no token has."""
        shifted = []
        for token_id in tokens:
            shape = self._shape_by_id.get(token_id)
            if shape is not None and shape.character == character:
                wider = IndentShape(shape.num_line_breaks, character, shape.width + delta)
                wider_id = self._id_by_shape.get(wider)
                if wider_id is None:
                    break
                token_id = wider_id
            shifted.append(token_id)
        return shifted


def _shape_of(data: bytes) -> IndentShape | None:
    """The shape of b"\\n" * a + c * w (a >= 1, c a space or a tab), else None."""
    body = data.lstrip(b"\n")
    num_line_breaks = len(data) - len(body)
    if num_line_breaks == 0:
        return None
    if not body:
        return IndentShape(num_line_breaks, INDENT_CHARACTERS[0], 0)
    character = body[0]
    if character not in INDENT_CHARACTERS or body.count(character) != len(body):
        return None
    return IndentShape(num_line_breaks, character, len(body))
