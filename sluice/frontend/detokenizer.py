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

Speed (this runs for every token), fastest first:
- A tokenizer with context-free texts (`sluice.tokenizer.Tokenizer` with a
  byte-level decoder): while nothing is held, a token with a context-free
  text (whole characters) releases exactly that text, as the method above
  would, without decoding. Other tokens take the method above.
- Else, a tokenizer with a Rust `backend`: `push` runs the method above as one
  `tokenizers.decoders.DecodeStream.step` call (about 10x cheaper than two
  Python `decode` calls), mirroring its offsets here so `flush` can finish in
  Python. It assumes the tokenizer decodes exactly as its backend does. Where
  DecodeStream refuses a window (its text does not extend its context's
  text), that choice continues on the Python method, which releases the same
  pieces everywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from tokenizers.decoders import DecodeStream

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
        "_backend",
        "_stream",
        "_context_free_text",
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
        # token id -> its text in any context, or None (see the module docstring).
        self._context_free_text: Callable[[int], str | None] | None = None
        if getattr(tokenizer, "has_context_free_texts", False):
            self._context_free_text = tokenizer.context_free_text  # type: ignore[attr-defined]
        # The Rust tokenizer and its stream over the same ids, when there is one
        # and no context-free texts (the shortcut would leave the stream behind).
        self._backend: Any = getattr(tokenizer, "backend", None)
        self._stream: DecodeStream | None = None
        if self._backend is not None and self._context_free_text is None:
            self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text it releases (maybe "")."""
        ids = self._ids
        if self._context_free_text is not None and self._read_offset == len(ids):
            text = self._context_free_text(token_id)
            if text is not None:  # what `_release` would return, without decoding
                ids.append(token_id)
                self._prefix_offset = self._read_offset
                self._read_offset = len(ids)
                return text
        ids.append(token_id)
        if self._stream is None:
            return self._release(is_final=False)
        try:
            text = self._stream.step(self._backend, token_id)
        except Exception:  # DecodeStream's InvalidPrefix: see the module docstring
            self._stream = None
            return self._release(is_final=False)
        if text is None:
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return text

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
