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

from sluice.engine.outputs import PromptLogprobs
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
    fragment: dict[str, list[Any]] = {
        "tokens": list(delta.token_texts),
        "token_logprobs": [json_logprob(entry.logprob) for entry in delta.logprobs],
        "top_logprobs": [_top_dict(tid, text, entry, strings) for tid, text, entry in entries],
        "text_offset": offsets,
    }
    return fragment, text_offset


def echo_logprobs(
    prompt_token_ids: tuple[int, ...], prompt_logprobs: PromptLogprobs, strings: TokenStrings
) -> tuple[dict[str, list[Any]], int]:
    """Completions `logprobs` of an echoed prompt, and the offset after it.
    The first token has none (null), as in OpenAI's and vLLM's answers."""
    texts = [strings.get(token_id)[0] for token_id in prompt_token_ids]
    offsets, text_offset = [], 0
    for text in texts:
        offsets.append(text_offset)
        text_offset += len(text)
    token_logprobs: list[float | None] = [None]
    top_logprobs: list[dict[str, float] | None] = [None]
    for position, text in enumerate(texts[1:]):
        entry = SampledLogprob(
            prompt_logprobs.logprobs[position],
            prompt_logprobs.top_token_ids[position],
            prompt_logprobs.top_logprobs[position],
        )
        token_logprobs.append(json_logprob(entry.logprob))
        top_logprobs.append(_top_dict(prompt_token_ids[position + 1], text, entry, strings))
    fragment: dict[str, list[Any]] = {
        "tokens": texts,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }
    return fragment, text_offset


def vllm_prompt_logprobs(
    prompt_token_ids: tuple[int, ...], prompt_logprobs: PromptLogprobs, strings: TokenStrings
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs`: per prompt token (null for the first), its id
    and the top alternatives' ids -> logprob, rank and decoded token."""
    entries: list[dict[str, dict[str, Any]] | None] = [None]
    for position, token_id in enumerate(prompt_token_ids[1:]):
        entry = {
            str(token_id): {
                "logprob": json_logprob(prompt_logprobs.logprobs[position]),
                "rank": prompt_logprobs.ranks[position],
                "decoded_token": strings.get(token_id)[0],
            }
        }
        alternatives = zip(
            prompt_logprobs.top_token_ids[position],
            prompt_logprobs.top_logprobs[position],
            strict=True,
        )
        for rank, (alt_id, alt_logprob) in enumerate(alternatives, start=1):
            entry.setdefault(
                str(alt_id),
                {
                    "logprob": json_logprob(alt_logprob),
                    "rank": rank,
                    "decoded_token": strings.get(alt_id)[0],
                },
            )
        entries.append(entry)
    return entries


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
