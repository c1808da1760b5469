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


class PromptLogprobs(msgspec.Struct, frozen=True, array_like=True):
    """Logprobs of prompt tokens 1 .. n-1, each under the model's distribution
    after the tokens before it (token 0 has none: nothing precedes it)."""

    # [num_tokens] logprob of each prompt token (log_softmax of raw logits).
    logprobs: tuple[float, ...]
    # [num_tokens] its rank in that distribution, 1 = most likely.
    ranks: tuple[int, ...]
    # [num_tokens][k] the top-k alternatives, most likely first, and their logprobs.
    top_token_ids: tuple[tuple[int, ...], ...]
    top_logprobs: tuple[tuple[float, ...], ...]

    def __add__(self, later: PromptLogprobs) -> PromptLogprobs:
        return PromptLogprobs(
            self.logprobs + later.logprobs,
            self.ranks + later.ranks,
            self.top_token_ids + later.top_token_ids,
            self.top_logprobs + later.top_logprobs,
        )

    def __len__(self) -> int:
        return len(self.logprobs)


class PooledOutput(msgspec.Struct, frozen=True, array_like=True):
    """What a pooling request computed (sluice/engine/pooling_core.py): one
    vector per input, in the order of its inputs."""

    # [num_inputs, num_dimensions] float32, row-major, native byte order.
    data: bytes
    num_inputs: int


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
    # Only on the request's first delta, iff params.prompt_logprobs was set.
    prompt_logprobs: PromptLogprobs | None = None
    # A pooling request's result, on its one (finishing) delta; None for
    # generation (vLLM's EngineCoreOutput.pooling_output).
    pooled: PooledOutput | None = None

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


class EngineError(msgspec.Struct, frozen=True):
    """Sent on the output channel when a request fails inside the engine."""

    request_id: str
    message: str
