"""Byte shapes of llama.cpp's `llama-server` and vLLM's streams, written by hand
from what those servers put on the wire (read in their sources and seen in
their answers), for unit tests of the audit's checks. Nothing is copied from
a capture: each builder writes the fields in the server's order and style.

llama-server (its OpenAI-compatible endpoints):
- every chunk's `created` is the time it was built (it moves across a second);
- completions logprobs in chat's shape (`content: [{id, token, bytes, logprob,
  top_logprobs}]`), one entry per character where a character took several
  tokens (the entries merge them);
- usage on the finish chunk, whatever the request asked (no `choices: []` chunk);
- `data: null` opening a multi-prompt completions stream;
- errors `{"error": {"code", "message", "type"}}` (no `param`).

vLLM: `usage: null` on content chunks unless continuous usage is asked,
`stop_reason` beside `finish_reason`, errors with `param`, a 400 for n > 1
under greedy sampling.
"""

from __future__ import annotations

import json
from typing import Any

LLAMA_MODEL = "gpt-3.5-turbo"
LLAMA_CREATED = 1764650000


def _event(payload: Any) -> bytes:
    return (
        b"data: "
        + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        + b"\n\n"
    )


def llama_logprob_entry(token: str, logprob: float, top: list[tuple[str, float]]) -> dict[str, Any]:
    data = token.encode()
    return {
        "id": sum(data) % 32000,
        "token": token,
        "bytes": list(data),
        "logprob": logprob,
        "top_logprobs": [
            {"id": sum(t.encode()) % 32000, "token": t, "bytes": list(t.encode()), "logprob": lp}
            for t, lp in top
        ],
    }


def llama_completion_chunk(
    text: str,
    finish: str | None = None,
    *,
    created: int = LLAMA_CREATED,
    logprobs: list[dict[str, Any]] | None = None,
    usage: dict[str, int] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "text": text,
        "index": index,
        "logprobs": None,
        "finish_reason": finish,
    }
    if logprobs is not None:
        choice["logprobs"] = {"content": logprobs}
    payload: dict[str, Any] = {
        "choices": [choice],
        "created": created,
        "model": LLAMA_MODEL,
        "system_fingerprint": "b6000-0a1b2c3d",
        "object": "text_completion",
        "id": "cmpl-Qx7Lr2",
    }
    if usage is not None:
        payload["usage"] = usage
        payload["timings"] = {"prompt_n": usage["prompt_tokens"], "predicted_n": 0}
    return payload


def llama_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "completion_tokens": completion_tokens,
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def llama_chat_chunk(
    index: int,
    delta: dict[str, Any],
    finish: str | None = None,
    *,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A chat chunk; with `usage`, the `choices: []` chunk llama-server sends after
    each choice's finish chunk (one per choice when n > 1)."""
    choices = [{"finish_reason": finish, "index": index, "delta": delta}]
    payload: dict[str, Any] = {
        "choices": [] if usage is not None else choices,
        "created": LLAMA_CREATED,
        "id": "chatcmpl-C6mBCf07uQMw",
        "model": LLAMA_MODEL,
        "system_fingerprint": "b1-0c1e570",
        "object": "chat.completion.chunk",
    }
    if usage is not None:
        payload["usage"] = usage
    return payload


def llama_stream(*payloads: dict[str, Any] | None) -> bytes:
    """`None` payloads are written as llama-server writes them: `data: null`."""
    return b"".join(_event(payload) for payload in payloads) + b"data: [DONE]\n\n"


LLAMA_ERROR_400 = b'{"error":{"code":400,"message":"\\"prompt\\" must be a string","type":"invalid_request_error"}}'


def vllm_completion_chunk(
    text: str,
    finish: str | None = None,
    *,
    usage: dict[str, int] | None = None,
    logprobs: dict[str, Any] | None = None,
    stop_reason: Any = None,
) -> dict[str, Any]:
    return {
        "id": "cmpl-5d1c0f2a9b",
        "object": "text_completion",
        "created": 1764650000,
        "model": "vllm-model",
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish,
                "stop_reason": stop_reason,
            }
        ],
        "usage": usage,
    }


def vllm_stream(*payloads: dict[str, Any]) -> bytes:
    return b"".join(_event(payload) for payload in payloads) + b"data: [DONE]\n\n"


VLLM_GREEDY_N_400 = (
    b'{"error":{"message":"n must be 1 when using greedy sampling, got 2.",'
    b'"type":"BadRequestError","param":null,"code":400}}'
)
