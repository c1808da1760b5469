"""What leaves the engine: one immutable `RequestDelta` per request per step.

Invariant: a delta is created once, where the request's cursor advances, and
never changed afterwards. It carries exactly the tokens produced for that
request since its previous delta, with one logprob entry per token. Nothing
else the engine owns is ever visible outside it.
"""

from __future__ import annotations

from typing import Literal

import msgspec

# "stop": EOS, a stop token, or (set by the frontend) a stop string.
# "length": max_tokens or the model's context length. "abort": cancelled.
FinishReason = Literal["stop", "length", "abort"]


class TokenLogprobs(msgspec.Struct, frozen=True, array_like=True):
    """Logprobs of the tokens of one delta, position by position."""

    # [num_new_tokens] logprob of each sampled token (log_softmax of raw logits).
    logprobs: tuple[float, ...]
    # [num_new_tokens][k] ids of the top-k alternatives, most likely first.
    top_token_ids: tuple[tuple[int, ...], ...]
    # [num_new_tokens][k] their logprobs, matching top_token_ids.
    top_logprobs: tuple[tuple[float, ...], ...]


class RequestDelta(msgspec.Struct, frozen=True, array_like=True):
    request_id: str
    # Tokens generated since this request's previous delta, in order. May be
    # empty only on a delta that finishes the request (e.g. an abort).
    new_token_ids: tuple[int, ...]
    # Present iff the request asked for logprobs; one entry per new token.
    logprobs: TokenLogprobs | None
    # Set on the request's last delta only.
    finish_reason: FinishReason | None
    # The token that finished the request with "stop" (EOS or a stop token id);
    # None for any other ending. Reported as vLLM's `stop_reason`.
    stop_token_id: int | None
    num_prompt_tokens: int
    # Prompt tokens whose KV came from the prefix cache (usage's cached_tokens).
    num_cached_tokens: int = 0

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


class EngineError(msgspec.Struct, frozen=True):
    """Sent on the output channel when a request fails inside the engine."""

    request_id: str
    message: str
