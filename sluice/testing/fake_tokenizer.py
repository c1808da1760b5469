"""A small hand-built tokenizer with the real `Tokenizer`'s decoding surface.

Built to exercise what makes detokenization hard, without a model:
- special tokens (<s>, </s>, <|sep|>), skipped or rendered, with or without
  spaces between them and text (`spaces_between_special_tokens`, slow-HF style);
- byte-fallback tokens <0x00>..<0xFF>: any character spelled byte by byte;
- SentencePiece-style word starts ("▁hello" is " hello"), whose space a decode
  drops when the word is the first thing decoded: prefix-unstable pieces that
  read differently alone than in context;
- multi-byte pieces that are partial UTF-8 (halves of an emoji, of a CJK or a
  Thai character), alone decoding to U+FFFD, and pieces mixing a whole
  character with a partial one.

`units` lists token sequences that each decode to complete text, so
strategies can build valid generations with characters split across tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

WORD_START = "\u2581"  # "▁"
SPECIAL_TOKENS = ("<s>", "</s>", "<|sep|>")
NUM_BYTE_TOKENS = 256
_FIRST_BYTE_ID = len(SPECIAL_TOKENS)
_FIRST_PIECE_ID = _FIRST_BYTE_ID + NUM_BYTE_TOKENS

# Whole-text pieces: "▁" marks a word start (a leading space).
TEXT_PIECES = (
    "▁hello", "▁world", "▁the", "▁a", "▁stop", "▁", "hello", "ing", "s",
    "a", "b", "c", "ab", "abc", "bc", "x", "y", ",", ".", "!", "?", " ", "\n",
    "é", "日本", "語", "😀", "ไทย", "STOP", "END", "</", "end>",
)  # fmt: skip
# Pieces that are partial UTF-8: (name, bytes) — each a head or tail of a character.
_EMOJI = "😀".encode()  # 4 bytes
_CJK = "語".encode()  # 3 bytes
_THAI = "ไ".encode()  # 3 bytes
PARTIAL_PIECES = (
    ("😀[:2]", _EMOJI[:2]),
    ("😀[2:]", _EMOJI[2:]),
    ("語[:1]", _CJK[:1]),
    ("語[1:]", _CJK[1:]),
    ("ไ[:2]", _THAI[:2]),
    ("ไ[2:]", _THAI[2:]),
    ("x😀[:3]", b"x" + _EMOJI[:3]),
    ("😀[3:]y", _EMOJI[3:] + b"y"),
)


class FakeTokenizer:
    """Same decoding surface as `sluice.tokenizer.Tokenizer`; no `backend`."""

    bos_token_id = 0
    eos_token_id = 1
    sep_token_id = 2
    eos_token_ids = frozenset({1})
    all_special_ids = frozenset(range(len(SPECIAL_TOKENS)))
    backend = None
    chat_template_source: str | None = None

    def __init__(self, extra_pieces: Sequence[str] = ()) -> None:
        """`extra_pieces`: more whole-text pieces, e.g. one that spans the end
        of a tool call and the text after it (`"}}.`), as real vocabularies have."""
        names = list(SPECIAL_TOKENS)
        pieces: list[bytes] = [s.encode() for s in SPECIAL_TOKENS]
        for byte in range(NUM_BYTE_TOKENS):
            names.append(f"<0x{byte:02X}>")
            pieces.append(bytes([byte]))
        for piece in (*TEXT_PIECES, *extra_pieces):
            names.append(piece)
            pieces.append(piece.replace(WORD_START, " ").encode())
        for name, raw in PARTIAL_PIECES:
            names.append(name)
            pieces.append(raw)
        self._names = names
        self._pieces = pieces
        self._max_piece_chars = max([8, *map(len, extra_pieces)])
        self._ids_by_name = {name: i for i, name in enumerate(names)}
        self.vocab_size = len(names)

    # -- the Tokenizer surface ----------------------------------------------

    def decode(
        self,
        ids: Sequence[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        # As slow HF tokenizers do: text between special tokens is decoded as
        # one run; runs and special tokens are joined with " " if asked.
        parts: list[str] = []
        run: bytearray | None = None
        is_first_token = True
        for token_id in ids:
            if token_id in self.all_special_ids:
                if skip_special_tokens:
                    continue
                if run is not None:
                    parts.append(run.decode("utf-8", errors="replace"))
                    run = None
                parts.append(self._names[token_id])
            else:
                run = bytearray() if run is None else run
                piece = self._pieces[token_id]
                if is_first_token and self._names[token_id].startswith(WORD_START):
                    piece = piece[1:]  # the start of a decode drops its space
                run += piece
            is_first_token = False
        if run is not None:
            parts.append(run.decode("utf-8", errors="replace"))
        return (" " if spaces_between_special_tokens else "").join(parts)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self._names[i] for i in ids]

    def token_bytes(self, token_id: int) -> bytes:
        return self._pieces[token_id]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Greedy longest-match over the text pieces, bytes for the rest."""
        ids = [self.bos_token_id] if add_special_tokens else []
        position = 0
        while position < len(text):
            token_id, size = self._longest_piece_at(text, position)
            if token_id is None:
                ids.extend(self.byte_ids(text[position]))
                size = 1
            else:
                ids.append(token_id)
            position += size
        return ids

    # -- helpers for tests ----------------------------------------------------

    def token_id(self, name: str) -> int:
        """The id of a piece by its name: "▁hello", "<0xE2>", "😀[:2]", "</s>"."""
        return self._ids_by_name[name]

    def byte_ids(self, char: str) -> list[int]:
        """`char` spelled with byte-fallback tokens."""
        return [_FIRST_BYTE_ID + byte for byte in char.encode()]

    @property
    def units(self) -> tuple[tuple[int, ...], ...]:
        """Token sequences that each decode to complete text (specials included)."""
        text_units = [(self.token_id(piece),) for piece in TEXT_PIECES]
        byte_spelled = [tuple(self.byte_ids(char)) for char in ("é", "😀", "語", "ไ", "a")]
        split_chars = [
            (self.token_id("😀[:2]"), self.token_id("😀[2:]")),
            (self.token_id("語[:1]"), self.token_id("語[1:]")),
            (self.token_id("ไ[:2]"), self.token_id("ไ[2:]")),
            (self.token_id("x😀[:3]"), self.token_id("😀[3:]y")),
            (self.token_id("😀[:2]"), *self.byte_ids("😀")[2:]),
        ]
        specials: list[tuple[int, ...]] = [(self.sep_token_id,), (self.bos_token_id,)]
        return tuple(text_units + byte_spelled + split_chars + specials)

    def _longest_piece_at(self, text: str, position: int) -> tuple[int | None, int]:
        for size in range(min(self._max_piece_chars, len(text) - position), 0, -1):
            candidate = text[position : position + size]
            name = WORD_START + candidate[1:] if candidate.startswith(" ") else candidate
            token_id = self._ids_by_name.get(name)
            if token_id is not None and token_id >= _FIRST_PIECE_ID:
                return token_id, size
        return None, 0


class ChatFakeTokenizer(FakeTokenizer):
    """The fake tokenizer with a minimal chat template: one line per message
    (an assistant turn's tool calls after its content), the tools and the
    template's extra variables first."""

    has_chat_template = True

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        *,
        tools: list | None = None,
        template_kwargs: dict | None = None,
    ) -> str:
        text = "" if tools is None else f"<|sep|>tools: {json.dumps(tools)}\n"
        if template_kwargs:  # a template's variables, shown as one line
            text += f"<|sep|>variables: {json.dumps(template_kwargs, sort_keys=True)}\n"
        for message in messages:
            calls = message.get("tool_calls")
            text += f"<|sep|>{message['role']}: {message['content']}"
            text += f" calls: {json.dumps(calls)}\n" if calls else "\n"
        return text + ("<|sep|>assistant: " if add_generation_prompt else "")
