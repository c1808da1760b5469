"""Helpers of the speculation tests: an engine core with or without n-gram
speculation on a loaded model, a run to completion, self-repeating prompts."""

from __future__ import annotations

import random

from sluice.config import SpeculativeConfig
from sluice.engine.core import EngineCore
from sluice.engine.sampling_params import SamplingParams
from tests.model_factory import make_core as factory_core

GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def make_core(
    loaded,
    speculative: SpeculativeConfig | None,
    *,
    num_blocks: int = 512,
    block_size: int = 4,
    budget: int = 64,
    prefix_caching: bool = True,
) -> EngineCore:
    """An in-process engine core on the tiny model, float32 KV cache."""
    return factory_core(
        loaded, num_blocks=num_blocks, block_size=block_size, budget=budget,
        prefix_caching=prefix_caching, speculative=speculative,
    )  # fmt: skip


def ngram(k: int = 4, min_n: int = 1, max_n: int = 3) -> SpeculativeConfig:
    return SpeculativeConfig(
        num_speculative_tokens=k, prompt_lookup_min=min_n, prompt_lookup_max=max_n
    )


def run(core: EngineCore, prompts, params=GREEDY):
    """Run to completion, checking the pool after every step; request index ->
    (token ids, finish reason, logprobs, number of deltas)."""
    for i, prompt in enumerate(prompts):
        core.add_request(
            f"r{i}", prompt, params if isinstance(params, SamplingParams) else params[i]
        )
    results = {i: ([], None, [], 0) for i in range(len(prompts))}
    while core.has_unfinished_requests():
        for delta in core.step():
            index = int(delta.request_id[1:])
            tokens, finish, logprobs, num_deltas = results[index]
            assert finish is None, "a delta after the finish"
            tokens.extend(delta.new_token_ids)
            if delta.logprobs is not None:
                logprobs.extend(delta.logprobs.logprobs)
            results[index] = (tokens, delta.finish_reason, logprobs, num_deltas + 1)
        core.scheduler.check_consistency()
    return results


def repeating_prompt(rng: random.Random, length: int) -> list[int]:
    """A text that repeats itself with one change: what prompt lookup is for."""
    base = [rng.randrange(3, 512) for _ in range(rng.randrange(4, 16))]
    prompt = (base * (length // len(base) + 1))[:length]
    prompt[rng.randrange(len(prompt))] = rng.randrange(3, 512)
    return prompt
