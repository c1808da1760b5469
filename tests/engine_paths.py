"""The engine paths every model family must keep exact, one check each, called
by each family's test module on its own tiny model: greedy tokens equal
transformers' generate, chunked prefill equals whole prompts, a prefix-cache
hit equals a cold run (tokens and logprobs), preempted requests resume with
the same tokens, and n-gram speculation never changes a greedy token.

A family whose layers keep per-sequence state (LFM2's convolutions, ...) runs
the same checks: they are what proves its snapshots and roll-backs exact."""

from __future__ import annotations

import random
from dataclasses import replace

import msgspec
import pytest
import torch

from sluice.engine.core import EngineCore
from sluice.loader.loaded_model import LoadedModel
from sluice.models.families.registry import build_model
from tests.model_factory import TinyModel, make_core
from tests.model_runs import (
    GREEDY,
    PagedRunner,
    greedy,
    random_prompts,
    run,
    run_one_by_one,
)
from tests.speculation_runs import ngram, repeating_prompt
from tests.speculation_runs import run as run_speculating

BLOCK_SIZE = 4  # tests.model_factory.make_core's block size


def check_greedy_equals_transformers_generate(
    loaded: LoadedModel, tiny: TinyModel, *, num_prompts: int = 2, num_new: int = 16, seed: int = 9
) -> None:
    for prompt in random_prompts(num_prompts, seed=seed):
        with torch.no_grad():
            out = tiny.hf_model.generate(
                torch.tensor([prompt]), max_new_tokens=num_new, do_sample=False,
                pad_token_id=0, eos_token_id=None,
            )  # fmt: skip
        ours = greedy(PagedRunner(loaded.model), prompt, num_new)
        assert ours == out[0, len(prompt) :].tolist()


def check_chunked_prefill_equals_whole_prompts(
    loaded: LoadedModel, budget: int, *, num_prompts: int = 8, seed: int = 2
) -> None:
    prompts = random_prompts(num_prompts, seed=seed)
    chunked = run(make_core(loaded, budget=budget), prompts)
    assert chunked == run(make_core(loaded, budget=512, chunked=False), prompts)


def check_prefix_cache_hit_equals_cold(loaded: LoadedModel, *, repeats: int = 3) -> None:
    """A prompt again, a shorter one sharing its start, a longer one: each
    hit reuses the whole blocks of what was cached (its last token is always
    recomputed), and gives a cold run's tokens and logprobs."""
    base = random_prompts(1, seed=11)[0] * repeats
    prompts = [base, base, base[:30] + [7, 8, 9], base + [1]]
    params = msgspec.structs.replace(GREEDY, logprobs=2, max_tokens=8)
    cached = run_one_by_one(make_core(loaded), prompts, params)
    plain = run_one_by_one(make_core(loaded, prefix_caching=False), prompts, params)
    whole_blocks = [(len(base) - 1) // BLOCK_SIZE, 30 // BLOCK_SIZE, len(base) // BLOCK_SIZE]
    assert [c for _, _, c in cached][1:] == [n * BLOCK_SIZE for n in whole_blocks]
    for (tokens, logprobs, _), (want_tokens, want_logprobs, _) in zip(cached, plain, strict=True):
        assert tokens == want_tokens
        assert logprobs == pytest.approx(want_logprobs, abs=1e-5)


def check_preemption_resumes_exactly(
    loaded: LoadedModel, *, num_prompts: int = 12, num_blocks: int = 40
) -> EngineCore:
    """Too few blocks for every prompt at once: requests are preempted, resume
    with the same greedy tokens, and leave every block free. Returns the core
    for a family's own checks (its state slots, say)."""
    prompts = random_prompts(num_prompts, seed=3)
    roomy = run(make_core(loaded, num_blocks=512), prompts)
    core = make_core(replace(loaded, max_model_len=128), num_blocks=num_blocks)
    assert run(core, prompts) == roomy
    assert core.scheduler.num_preemptions > 0
    assert core.kv.num_free_blocks == num_blocks
    return core


def check_speculation_keeps_greedy_tokens(
    loaded: LoadedModel, tiny: TinyModel, *, lengths: tuple[int, ...] = (20, 45, 70)
) -> None:
    """On the batch-invariant model, as the engine speculates only there
    (engine/startup.py `speculation_blocker`): drafts from prompt lookup, some
    accepted, some rejected (a stateful layer rolls those back), never change
    a greedy token."""
    model = build_model(loaded.model_config, torch.float32, torch.device("cpu"), True)
    model.load_weights(tiny.weights())
    invariant = replace(loaded, model=model)
    rng = random.Random(5)
    prompts = [repeating_prompt(rng, length) for length in lengths]
    speculating = make_core(invariant, speculative=ngram(k=4))
    assert speculating.speculator is not None
    drafted = run_speculating(speculating, prompts)
    plain = run_speculating(make_core(invariant), prompts)
    assert {i: r[:2] for i, r in drafted.items()} == {i: r[:2] for i, r in plain.items()}
    counters = speculating.speculator.counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens
