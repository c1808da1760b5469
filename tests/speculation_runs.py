"""Helpers of the speculation tests: an engine core with or without n-gram
speculation on a loaded model, a run to completion, self-repeating prompts."""

from __future__ import annotations

import contextlib
import random

from sluice.config import SpeculativeConfig
from sluice.engine.core import EngineCore
from sluice.engine.engine_request import generation_request
from sluice.engine.sampling_params import SamplingParams
from sluice.loader.loaded_model import LoadedModel
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
            generation_request(
                f"r{i}", prompt, params if isinstance(params, SamplingParams) else params[i]
            )
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


def without_fused_layers(loaded: LoadedModel):
    """The layers' Python path for every step, until the context ends."""

    @contextlib.contextmanager
    def python_path():
        layers = loaded.model.layers
        fused = [layer.fused_decode for layer in layers]
        try:
            for layer in layers:
                layer.fused_decode = None
            yield
        finally:
            for layer, call in zip(layers, fused, strict=True):
                layer.fused_decode = call

    return python_path()


def assert_fused_gives_python_bits(loaded: LoadedModel, seed: int) -> None:
    """Decode steps of several requests, speculative verification (chunks of
    decode rows) and the prompts' prefill around them: tokens and logprobs
    bitwise the same whether decode steps take the layers' one native call
    (fused_decode.py) or their Python chain of the same kernels."""
    rng = random.Random(seed)
    prompts = [repeating_prompt(rng, rng.randrange(20, 90)) for _ in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=2)

    def outputs():
        plain = run(make_core(loaded, None), prompts, params)
        return plain, run(make_core(loaded, ngram(k=6)), prompts, params)

    fused = outputs()
    with without_fused_layers(loaded):
        python = outputs()
    # Tokens, finish reasons and logprobs; not the number of deltas: which
    # requests draft follows the engine's own step times.
    for fused_run, python_run in zip(fused, python, strict=True):
        for i in fused_run:
            assert fused_run[i][:3] == python_run[i][:3], f"request {i}"
