"""Sampling parameters of one engine request: a frozen value that crosses the
process boundary as msgpack.

One engine request is one sequence. The frontend fans an API request with
`n > 1` or a list of prompts out into several engine requests, one per choice.
Stop strings are not here: they are text, and the frontend's detokenizer owns
them (it aborts the engine request with reason "stop" when one matches).
"""

from __future__ import annotations

import msgspec

from sluice.structured.spec import StructuredOutputSpec

# A temperature below this is greedy (vLLM's rule): dividing the logits by it
# would overflow float32 to infinities, whose softmax is NaN.
GREEDY_TEMPERATURE_EPS = 1e-5


class ThinkingBudget(msgspec.Struct, frozen=True):
    """The most tokens a request may reason before the engine forces the end
    of its reasoning (`sluice/engine/sampling/thinking_budget.py`)."""

    # Reasoning tokens allowed: between the opening marker (or the output's
    # start) and the forced end marker.
    max_tokens: int
    # The reasoning opens with these at the output's start (Qwen3's `<think>`);
    # an output that opens otherwise has no reasoning to budget. Empty: the
    # output starts inside the reasoning (the prompt opened it: DeepSeek-R1).
    start_token_ids: tuple[int, ...]
    # What ends the reasoning (`</think>`), forced token by token at the budget.
    end_token_ids: tuple[int, ...]


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    # Below GREEDY_TEMPERATURE_EPS (0.0 included) means greedy (argmax); any
    # other value divides the logits.
    temperature: float = 1.0
    # Nucleus: keep the smallest set of tokens whose probability sum >= top_p.
    top_p: float = 1.0
    # Keep the k most likely tokens; 0 or -1 disables.
    top_k: int = 0
    # Drop tokens whose probability is below min_p * max probability.
    min_p: float = 0.0
    # OpenAI penalties, over generated tokens only.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # HF/vLLM multiplicative penalty over prompt and generated tokens; 1.0 disables.
    repetition_penalty: float = 1.0
    # token id -> bias added to the logit before sampling.
    logit_bias: dict[int, float] = msgspec.field(default_factory=dict)
    # Per-request RNG seed: the sampled output does not depend on the batch.
    seed: int | None = None
    # Most tokens to generate (the engine also stops at the model's context length).
    max_tokens: int = 16
    # EOS and stop_token_ids are masked until this many tokens were generated.
    min_tokens: int = 0
    # Extra token ids that finish the request with reason "stop".
    stop_token_ids: tuple[int, ...] = ()
    # Keep generating past EOS (stop_token_ids still apply).
    ignore_eos: bool = False
    # None: no logprobs. k >= 0: the sampled token's logprob plus the top-k
    # alternatives (k <= 20), from log_softmax of the raw logits.
    logprobs: int | None = None
    # vLLM's prompt_logprobs. None: none. k >= 0: each prompt token's logprob
    # (from the second on) plus the top-k alternatives at its position. Such a
    # request never starts from the prefix cache: every position is computed.
    prompt_logprobs: int | None = None
    # Output constrained to a JSON schema, regex, choice or grammar (the
    # logits are masked before sampling; logprobs stay the raw ones). None: free.
    structured_output: StructuredOutputSpec | None = None
    # vLLM's request priority: lower runs sooner, under --scheduling-policy
    # priority only (sluice/engine/priority.py); fcfs ignores it.
    priority: int = 0
    # Reasoning cut at a token budget by forcing its end marker; None: unbounded.
    thinking_budget: ThinkingBudget | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS
