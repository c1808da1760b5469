"""What the sampler hands the scheduler for one request in one step."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.engine.outputs import PromptLogprobs


@dataclass(frozen=True, slots=True)
class SampledToken:
    token_id: int
    # log_softmax of the raw logits at token_id; None when logprobs were not asked.
    logprob: float | None = None
    # The request's top-k alternatives (k = params.logprobs), most likely first.
    top_token_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class PromptLogprobsChunk:
    """The prompt logprobs one step computed for one request (a prefill chunk)."""

    request_id: str
    # Index in the prompt of the first token these are of (>= 1).
    first_token_index: int
    logprobs: PromptLogprobs
