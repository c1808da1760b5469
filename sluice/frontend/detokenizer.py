"""Incremental detokenization of one choice, on the consumer side (event loop).

`IncrementalDetokenizer.push(token_id)` returns the text that token releases;
`flush()` returns what is left at the end. Invariant: the concatenation of
everything released equals `tokenizer.decode(ids)` of all ids pushed, except
that a dangling partial UTF-8 character at the very end (U+FFFD in a full
decode) is dropped. No U+FFFD is released for an incomplete character: text
ending in one is held until the character completes.

Method (vLLM's prefix/read offsets): decode a short window of the latest ids
twice, with and without the new ones, and release only the difference. The
window starts where earlier released text ended, so tokens that decode
differently alone than in context (SentencePiece's "▁" word starts, whose
space a decode drops at the start; byte pieces of one character) are always
decoded together with their left context. This assumes what every
byte-level-BPE and SentencePiece decoder satisfies: decoding is local, i.e.
the text of a window only depends on the window's own ids.

The non-streamed text is built by the same code, so streamed and non-streamed
outputs agree by construction, the partial character at the end included.
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"


class DecodingTokenizer(Protocol):
    """The part of `sluice.tokenizer.Tokenizer` the output side uses."""

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    def decode(
        self,
        ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> str: ...

    def token_bytes(self, token_id: int) -> bytes: ...


class IncrementalDetokenizer:
    __slots__ = (
        "_tokenizer",
        "_skip_special_tokens",
        "_spaces_between_special_tokens",
        "_ids",
        "_prefix_offset",
        "_read_offset",
    )

    def __init__(
        self,
        tokenizer: DecodingTokenizer,
        *,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._spaces_between_special_tokens = spaces_between_special_tokens
        self._ids: list[int] = []
        # ids[prefix_offset:read_offset] were released last; they are the left
        # context the next window is decoded with.
        self._prefix_offset = 0
        # ids[:read_offset] have been released as text.
        self._read_offset = 0

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text it releases (maybe "")."""
        self._ids.append(token_id)
        return self._release(is_final=False)

    def flush(self) -> str:
        """Release what is held at the end, dropping a dangling partial character."""
        if self._read_offset == len(self._ids):
            return ""
        return self._release(is_final=True)

    def _release(self, *, is_final: bool) -> str:
        window = self._ids[self._prefix_offset :]
        num_context_ids = self._read_offset - self._prefix_offset
        prefix_text = self._decode(window[:num_context_ids])
        new_text = self._decode(window)
        if is_final:
            new_text = new_text.rstrip(REPLACEMENT_CHAR)
        elif new_text.endswith(REPLACEMENT_CHAR):
            return ""  # an incomplete character: wait for the rest of its bytes
        if len(new_text) <= len(prefix_text):
            return ""  # e.g. a skipped special token: nothing visible yet
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(
            ids,
            skip_special_tokens=self._skip_special_tokens,
            spaces_between_special_tokens=self._spaces_between_special_tokens,
        )
