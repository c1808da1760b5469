"""The engine core on a tiny random model: parity with transformers through the
whole engine, batch invariance, chunked prefill, preemption and aborts."""

from __future__ import annotations

import random
from dataclasses import replace

import msgspec
import pytest
import torch

from sluice.config import CacheConfig, EngineConfig, SchedulerConfig
from sluice.engine.core import EngineCore
from sluice.engine.sampling_params import SamplingParams
from sluice.loader import LoadedModel
from sluice.loader.choices import ModelChoices
from sluice.models.attention import kv_cache_bytes_per_block
from sluice.models.config import LlamaConfig
from sluice.models.llama import LlamaForCausalLM
from tests.model_factory import build_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model("llama_tied", tmp_path_factory.mktemp("tiny-engine"))


@pytest.fixture(scope="module")
def loaded(tiny) -> LoadedModel:
    model_config = LlamaConfig.from_hf_dict(tiny.config_dict)
    model = LlamaForCausalLM(model_config, torch.float32, torch.device("cpu"))
    model.load_weights(tiny.weights())
    return LoadedModel(
        model=model,
        tokenizer=None,
        model_config=model_config,
        max_model_len=model_config.max_position_embeddings,
        name="tiny",
        eos_token_ids=frozenset({2}),
        folder=tiny.path,
        choices=ModelChoices("float32", None, "as asked"),
    )


def make_core(loaded, *, num_blocks=512, block_size=4, budget=64, max_seqs=32, chunked=True):
    bytes_per_block = kv_cache_bytes_per_block(loaded.model_config, block_size, torch.float32)
    config = EngineConfig(
        cache=CacheConfig(
            block_size_tokens=block_size, kv_cache_memory_bytes=num_blocks * bytes_per_block
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=budget, max_num_seqs=max_seqs, enable_chunked_prefill=chunked
        ),
        multiprocess=False,
    )
    return EngineCore(config, loaded=loaded)


def random_prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(rng.randrange(3, 60))] for _ in range(count)]


def run(core: EngineCore, prompts, params=GREEDY, abort_at: dict[int, int] | None = None):
    """Run prompts to completion; returns request index -> (token ids, finish reason)."""
    for i, prompt in enumerate(prompts):
        core.add_request(
            f"r{i}", prompt, params if isinstance(params, SamplingParams) else params[i]
        )
    tokens = {i: [] for i in range(len(prompts))}
    finish: dict[int, str] = {}
    step = 0
    while core.has_unfinished_requests():
        for index, at_step in (abort_at or {}).items():
            if at_step == step:
                for delta in core.abort_requests([f"r{index}"]):
                    finish[int(delta.request_id[1:])] = delta.finish_reason
        for delta in core.step():
            index = int(delta.request_id[1:])
            assert index not in finish, "a delta arrived after the request finished"
            tokens[index].extend(delta.new_token_ids)
            if delta.finish_reason is not None:
                finish[index] = delta.finish_reason
        step += 1
    return {i: (tokens[i], finish.get(i)) for i in tokens}


def test_greedy_output_matches_transformers_generate(loaded, tiny):
    prompt = random_prompts(1, seed=7)[0]
    ((ours, finish),) = run(make_core(loaded), [prompt]).values()
    expected = tiny.hf_model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=24,
        min_new_tokens=24,
        pad_token_id=0,
    )[0, len(prompt) :].tolist()
    assert ours == expected
    assert finish == "length"


def test_greedy_output_is_the_same_alone_and_in_a_batch_of_16(loaded):
    prompts = random_prompts(16, seed=1)
    batched = run(make_core(loaded), prompts)
    for i in (0, 5, 15):
        alone = run(make_core(loaded), [prompts[i]])[0]
        assert alone == batched[i]


def test_chunked_prefill_gives_the_same_tokens_as_whole_prompts(loaded):
    prompts = random_prompts(8, seed=2)
    chunked = run(make_core(loaded, budget=16), prompts)
    whole = run(make_core(loaded, budget=512, chunked=False), prompts)
    assert chunked == whole


def test_preempted_requests_resume_with_the_same_greedy_tokens(loaded):
    prompts = random_prompts(12, seed=3)
    roomy = run(make_core(loaded, num_blocks=512), prompts)
    short = replace(loaded, max_model_len=128)
    core = make_core(short, num_blocks=40)  # 160 token slots for 12 requests: forces preemption
    tight = run(core, prompts)
    assert tight == roomy
    assert core.kv.num_free_blocks == 40


def test_seeded_sampling_does_not_depend_on_the_batch(loaded):
    prompts = random_prompts(6, seed=4)
    seeded = [
        SamplingParams(temperature=1.0, top_p=0.9, seed=100 + i, max_tokens=16, ignore_eos=True)
        for i in range(6)
    ]
    batched = run(make_core(loaded), prompts, seeded)
    for i in (0, 3):
        assert run(make_core(loaded), [prompts[i]], seeded[i])[0] == batched[i]
    assert len({tuple(tokens) for tokens, _ in batched.values()}) > 1


def test_aborts_free_every_block_and_end_with_abort(loaded):
    prompts = random_prompts(6, seed=5)
    core = make_core(loaded, num_blocks=128, budget=16)
    results = run(core, prompts, abort_at={0: 0, 1: 2, 2: 10})
    assert [results[i][1] for i in range(3)] == ["abort"] * 3
    assert all(results[i][1] == "length" for i in range(3, 6))
    assert core.kv.num_free_blocks == 128
    core.scheduler.check_consistency()


def test_logprobs_come_one_per_token_and_are_normalised(loaded):
    params = msgspec.structs.replace(GREEDY, logprobs=5, max_tokens=6)
    core = make_core(loaded)
    core.add_request("r0", random_prompts(1, seed=6)[0], params)
    entries = []
    while core.has_unfinished_requests():
        for delta in core.step():
            assert delta.logprobs is not None
            assert len(delta.logprobs.logprobs) == len(delta.new_token_ids)
            entries.extend(
                zip(
                    delta.new_token_ids,
                    delta.logprobs.logprobs,
                    delta.logprobs.top_token_ids,
                    strict=True,
                )
            )
    assert len(entries) == 6
    for token_id, logprob, top_ids in entries:
        assert top_ids[0] == token_id  # greedy picks the most likely token
        assert logprob <= 0.0
