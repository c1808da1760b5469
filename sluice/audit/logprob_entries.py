"""Logprob entries of both APIs, normalised to one value per token.

Completions carry parallel lists (`tokens`, `token_logprobs`, `top_logprobs`,
`text_offset`); chat carries `content: [{token, logprob, bytes, top_logprobs}]`.
Each becomes a `LogprobEntry` with the token's bytes, taken from (in order)
chat's `bytes`, a `bytes:\\xNN` token string, or the token's UTF-8. A token
string holding U+FFFD with no `bytes` is a partial character whose bytes are
unknown: `has_exact_bytes` is False and byte-level alignment is skipped.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

_HEX_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


@dataclass(slots=True)
class LogprobEntry:
    token: str
    token_bytes: bytes
    has_exact_bytes: bool
    # The raw JSON value: a float, or None/a string when the server sent one.
    logprob: Any
    # Alternative token -> its logprob (raw JSON values).
    top: dict[str, Any] = field(default_factory=dict)
    # Completions only: the token's character offset in the choice text.
    text_offset: int | None = None
    # Chat: alternatives listed, before keying by string (two may share one).
    num_listed: int | None = None

    @property
    def is_ambiguous(self) -> bool:
        """Its strings do not name one token each: "" or U+FFFD (pieces of a
        character), or alternatives sharing a string. Keyed by string, such
        entries lose alternatives and mix their logprobs, so per-token checks
        skip them (the completions format cannot tell them apart at all)."""
        strings = [self.token, *self.top]
        collided = self.num_listed is not None and self.num_listed != len(self.top)
        return collided or any(s == "" or "\ufffd" in s for s in strings)

    @property
    def is_finite(self) -> bool:
        values = [self.logprob, *self.top.values()]
        return all(_is_finite_number(value) for value in values)

    @property
    def signature(self) -> tuple[Any, ...]:
        """What two positions can only share if one was copied from the other."""
        return (self.logprob, tuple(sorted(self.top.items(), key=repr)))


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def token_bytes_of(token: str) -> tuple[bytes, bool]:
    """Bytes of a token string, and whether they are exact."""
    if token.startswith("bytes:"):
        return _unescape(token[len("bytes:") :]), True
    return token.encode("utf-8", "surrogatepass"), "\ufffd" not in token


def _unescape(text: str) -> bytes:
    out = bytearray()
    position = 0
    for match in _HEX_ESCAPE.finditer(text):
        out += text[position : match.start()].encode()
        out.append(int(match.group(1), 16))
        position = match.end()
    out += text[position:].encode()
    return bytes(out)


def chat_entries(logprobs: Any) -> list[LogprobEntry] | None:
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("content"), list):
        return None
    return [_chat_entry(item) for item in logprobs["content"] if isinstance(item, dict)]


def _chat_entry(item: dict[str, Any]) -> LogprobEntry:
    token = item.get("token") if isinstance(item.get("token"), str) else ""
    token_bytes, is_exact = token_bytes_of(token)
    raw_bytes = item.get("bytes")
    if isinstance(raw_bytes, list) and all(isinstance(b, int) and 0 <= b < 256 for b in raw_bytes):
        token_bytes, is_exact = bytes(raw_bytes), True
    listed = [alt for alt in item.get("top_logprobs") or [] if isinstance(alt, dict)]
    top = {str(alt.get("token")): alt.get("logprob") for alt in listed}
    return LogprobEntry(
        token, token_bytes, is_exact, item.get("logprob"), top, num_listed=len(listed)
    )


def completion_entries(logprobs: Any) -> list[LogprobEntry] | None:
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("tokens"), list):
        return None
    tokens = logprobs["tokens"]
    values = _list_of(logprobs.get("token_logprobs"), len(tokens))
    tops = _list_of(logprobs.get("top_logprobs"), len(tokens))
    offsets = _list_of(logprobs.get("text_offset"), len(tokens))
    entries = []
    for token, value, top, offset in zip(tokens, values, tops, offsets, strict=True):
        token = token if isinstance(token, str) else ""
        token_bytes, is_exact = token_bytes_of(token)
        top = top if isinstance(top, dict) else {}
        offset = offset if isinstance(offset, int) else None
        entries.append(LogprobEntry(token, token_bytes, is_exact, value, dict(top), offset))
    return entries


def _list_of(value: Any, length: int) -> list[Any]:
    items = value if isinstance(value, list) else []
    return (items + [None] * length)[:length]
