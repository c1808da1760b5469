"""Helpers of the invariance tests: a probe request's whole output, alone or
beside a crowd of others, random prompts, and the tiny model in bfloat16."""

from __future__ import annotations

import random
from dataclasses import replace

import torch

from sluice.engine.core import EngineCore
from sluice.engine.engine_request import generation_request
from sluice.engine.sampling_params import SamplingParams
from sluice.loader.choices import ModelChoices
from sluice.loader.loaded_model import LoadedModel
from sluice.models.llama import LlamaForCausalLM

PROBE = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
CROWD = (
    SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, logprobs=1),
    SamplingParams(temperature=0.9, top_p=0.9, seed=5, max_tokens=16, ignore_eos=True),
)


def random_prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(3, 512) for _ in range(length)]


def probe_output(core: EngineCore, probe: list[int], crowd: list[list[int]], rng: random.Random):
    """The probe's (tokens, logprobs, top ids, top logprobs), with the crowd's
    requests added before it, beside it, or a few steps before it."""
    delay = rng.choice([0, 0, 1, 3])
    for i, prompt in enumerate(crowd):
        core.add_request(generation_request(f"c{i}", prompt, CROWD[i % len(CROWD)]))
    for _ in range(delay):
        core.step()
    core.add_request(generation_request("probe", probe, PROBE))
    tokens, logprobs, top_ids, top_logprobs = [], [], [], []
    while core.has_unfinished_requests():
        for delta in core.step():
            if delta.request_id == "probe":
                tokens += delta.new_token_ids
                logprobs += delta.logprobs.logprobs
                top_ids += delta.logprobs.top_token_ids
                top_logprobs += delta.logprobs.top_logprobs
    return tokens, logprobs, top_ids, top_logprobs


def bf16_loaded(tiny_loaded: LoadedModel, tiny_llama, *, batch_invariant: bool) -> LoadedModel:
    model = LlamaForCausalLM(
        tiny_loaded.model_config, torch.bfloat16, torch.device("cpu"), batch_invariant
    )
    model.load_weights(tiny_llama.weights())
    return replace(tiny_loaded, model=model, choices=ModelChoices("bfloat16", None, "as asked"))
