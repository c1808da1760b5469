"""Logprob entries in the two OpenAI formats, from one choice delta.

Policy (documented in the API notes; the same for streamed and non-streamed):
- A sampled token's string is the text it released (`ChoiceDelta.token_texts`),
  so a chunk's token strings concatenate to its text exactly (I3); a token
  whose character completed in a later token has "" and the completing token
  carries the whole character. Chat `bytes` are that string's UTF-8.
- Alternatives are named by the token's own bytes: its UTF-8 text, or
  "bytes:\\xNN..." when those bytes are not valid UTF-8 alone (a piece of a
  character); chat `bytes` are the raw bytes. The sampled token, when it is
  among the alternatives, keeps its released string there.
- Completions `top_logprobs` holds the top-k alternatives plus the sampled
  token (up to k + 1 entries, as OpenAI documents), so
  `top_logprobs[i][tokens[i]] == token_logprobs[i]` always holds. Chat
  `top_logprobs` holds exactly the top-k.
- `text_offset` is each token's character offset in the choice text (echoed
  prompt included), advanced by each token string.
- Non-finite logprobs (-inf, NaN) become -9999.0: JSON has no infinity.
"""

from __future__ import annotations

import math
from typing import Any

from sluice.frontend.deltas import ChoiceDelta, SampledLogprob
from sluice.frontend.detokenizer import DecodingTokenizer

NON_FINITE_LOGPROB = -9999.0


def json_logprob(value: float) -> float:
    return value if math.isfinite(value) else NON_FINITE_LOGPROB


class TokenStrings:
    """Standalone strings and bytes of vocabulary tokens, cached (vocab-bounded)."""

    __slots__ = ("_tokenizer", "_cache")

    def __init__(self, tokenizer: DecodingTokenizer):
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        cached = self._cache.get(token_id)
        if cached is None:
            raw = self._tokenizer.token_bytes(token_id)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)
            cached = self._cache[token_id] = (text, list(raw))
        return cached


def completion_logprobs(
    delta: ChoiceDelta, text_offset: int, strings: TokenStrings
) -> tuple[dict[str, list[Any]], int]:
    """Completions `logprobs` of `delta`'s tokens, and the offset after them."""
    assert delta.logprobs is not None, "logprobs were asked for"
    offsets: list[int] = []
    for text in delta.token_texts:
        offsets.append(text_offset)
        text_offset += len(text)
    entries = zip(delta.token_ids, delta.token_texts, delta.logprobs, strict=True)
    fragment = {
        "tokens": list(delta.token_texts),
        "token_logprobs": [json_logprob(entry.logprob) for entry in delta.logprobs],
        "top_logprobs": [_top_dict(tid, text, entry, strings) for tid, text, entry in entries],
        "text_offset": offsets,
    }
    return fragment, text_offset


def _top_dict(
    token_id: int, text: str, entry: SampledLogprob, strings: TokenStrings
) -> dict[str, float]:
    top: dict[str, float] = {}
    for alt_id, alt_logprob in zip(entry.top_token_ids, entry.top_logprobs, strict=True):
        key = text if alt_id == token_id else strings.get(alt_id)[0]
        top.setdefault(key, json_logprob(alt_logprob))
    top[text] = json_logprob(entry.logprob)
    return top


def chat_logprobs(delta: ChoiceDelta, strings: TokenStrings) -> list[dict[str, Any]]:
    """Chat `logprobs.content` entries of `delta`'s tokens."""
    assert delta.logprobs is not None, "logprobs were asked for"
    entries = zip(delta.token_ids, delta.token_texts, delta.logprobs, strict=True)
    return [
        {
            "token": text,
            "logprob": json_logprob(entry.logprob),
            "bytes": list(text.encode("utf-8")),
            "top_logprobs": _top_list(token_id, text, entry, strings),
        }
        for token_id, text, entry in entries
    ]


def _top_list(
    token_id: int, text: str, entry: SampledLogprob, strings: TokenStrings
) -> list[dict[str, Any]]:
    top = []
    for alt_id, alt_logprob in zip(entry.top_token_ids, entry.top_logprobs, strict=True):
        if alt_id == token_id:
            alt_text, alt_bytes = text, list(text.encode("utf-8"))
        else:
            alt_text, alt_bytes = strings.get(alt_id)
        top.append({"token": alt_text, "logprob": json_logprob(alt_logprob), "bytes": alt_bytes})
    return top
