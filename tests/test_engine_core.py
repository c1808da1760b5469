"""The engine core on a tiny random model: parity with transformers through the
whole engine, batch invariance, chunked prefill, preemption and aborts."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest
import torch

from sluice.engine.engine_request import generation_request
from sluice.engine.sampling_params import SamplingParams
from sluice.models.attention import kv_cache_bytes_per_block
from tests.model_factory import make_core
from tests.model_runs import GREEDY, random_prompts, run, run_one_by_one


def test_greedy_output_matches_transformers_generate(tiny_loaded, tiny_llama):
    prompt = random_prompts(1, seed=7)[0]
    ((ours, finish),) = run(make_core(tiny_loaded), [prompt]).values()
    expected = tiny_llama.hf_model.generate(
        torch.tensor([prompt]),
        do_sample=False,
        max_new_tokens=24,
        min_new_tokens=24,
        pad_token_id=0,
    )[0, len(prompt) :].tolist()
    assert ours == expected
    assert finish == "length"


def test_greedy_output_is_the_same_alone_and_in_a_batch_of_16(tiny_loaded):
    prompts = random_prompts(16, seed=1)
    batched = run(make_core(tiny_loaded), prompts)
    for i in (0, 5, 15):
        alone = run(make_core(tiny_loaded), [prompts[i]])[0]
        assert alone == batched[i]


def test_a_temperature_below_1e_5_gives_the_greedy_tokens(tiny_loaded):
    prompts = random_prompts(3, seed=4)
    tiny = msgspec.structs.replace(GREEDY, temperature=1e-38, logprobs=0)
    assert run(make_core(tiny_loaded), prompts, tiny) == run(make_core(tiny_loaded), prompts)


def test_chunked_prefill_gives_the_same_tokens_as_whole_prompts(tiny_loaded):
    prompts = random_prompts(8, seed=2)
    chunked = run(make_core(tiny_loaded, budget=16), prompts)
    whole = run(make_core(tiny_loaded, budget=512, chunked=False), prompts)
    assert chunked == whole


def test_preempted_requests_resume_with_the_same_greedy_tokens(tiny_loaded):
    prompts = random_prompts(12, seed=3)
    roomy = run(make_core(tiny_loaded, num_blocks=512), prompts)
    short = replace(tiny_loaded, max_model_len=128)
    core = make_core(short, num_blocks=40)  # 160 token slots for 12 requests: forces preemption
    tight = run(core, prompts)
    assert tight == roomy
    assert core.kv.num_free_blocks == 40


def test_seeded_sampling_does_not_depend_on_the_batch(tiny_loaded):
    prompts = random_prompts(6, seed=4)
    seeded = [
        SamplingParams(temperature=1.0, top_p=0.9, seed=100 + i, max_tokens=16, ignore_eos=True)
        for i in range(6)
    ]
    batched = run(make_core(tiny_loaded), prompts, seeded)
    for i in (0, 3):
        assert run(make_core(tiny_loaded), [prompts[i]], seeded[i])[0] == batched[i]
    assert len({tuple(tokens) for tokens, _ in batched.values()}) > 1


def test_aborts_free_every_block_and_end_with_abort(tiny_loaded):
    prompts = random_prompts(6, seed=5)
    core = make_core(tiny_loaded, num_blocks=128, budget=16)
    results = run(core, prompts, abort_at={0: 0, 1: 2, 2: 10})
    assert [results[i][1] for i in range(3)] == ["abort"] * 3
    assert all(results[i][1] == "length" for i in range(3, 6))
    assert core.kv.num_free_blocks == 128
    core.scheduler.check_consistency()


def test_the_written_bytes_are_the_blocks_ever_handed_out_times_a_blocks_bytes(tiny_loaded):
    core = make_core(tiny_loaded, num_blocks=128, prefix_caching=False)
    assert core.stats().kv_cache_written_bytes == 0
    block_bytes = kv_cache_bytes_per_block(tiny_loaded.model_config, 4, torch.float32)
    run(core, random_prompts(2, seed=3))
    written = core.stats().kv_cache_written_bytes
    assert written == core.kv.num_written_blocks * block_bytes > 0
    run(core, random_prompts(2, seed=3))  # the same sizes again: the same blocks
    assert core.stats().kv_cache_written_bytes == written


def test_logprobs_come_one_per_token_and_are_normalised(tiny_loaded):
    params = msgspec.structs.replace(GREEDY, logprobs=5, max_tokens=6)
    core = make_core(tiny_loaded)
    core.add_request(generation_request("r0", random_prompts(1, seed=6)[0], params))
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


def test_a_prefix_cache_hit_gives_the_same_greedy_tokens_and_logprobs(tiny_loaded):
    """float32: a request that starts from cached blocks computes what it would
    have computed from scratch (logprobs within float32 reordering, 1e-5)."""
    base = random_prompts(1, seed=11)[0] * 3  # long enough for several blocks
    prompts = [base, base, base[:30] + [7, 8, 9], base[:5], base + [1]]
    params = msgspec.structs.replace(GREEDY, logprobs=2, max_tokens=8)
    core = make_core(tiny_loaded)
    cached = run_one_by_one(core, prompts, params)
    stats = core.stats()
    assert stats.prefix_cache_hit_tokens == sum(c for _, _, c in cached)
    assert stats.prefix_cache_queried_tokens == sum(len(p) for p in prompts)
    plain = run_one_by_one(make_core(tiny_loaded, prefix_caching=False), prompts, params)
    block = 4
    assert [c for _, _, c in cached] == [
        0, (len(base) - 1) // block * block, 28, 4, len(base) // block * block
    ]  # fmt: skip
    assert [c for _, _, c in plain] == [0] * len(prompts)
    for (tokens, logprobs, _), (want_tokens, want_logprobs, _) in zip(cached, plain, strict=True):
        assert tokens == want_tokens
        assert logprobs == pytest.approx(want_logprobs, abs=1e-5)


def test_a_reset_forgets_the_cached_prefixes_through_the_engine_input(tiny_loaded):
    from sluice.engine.messages import ResetPrefixCache, Shutdown

    core = make_core(tiny_loaded)
    prompt = random_prompts(1, seed=12)[0] * 2
    params = msgspec.structs.replace(GREEDY, logprobs=1, max_tokens=2)
    assert run_one_by_one(core, [prompt, prompt], params)[1][2] > 0  # a hit
    deltas, errors = [], []
    assert core.handle(ResetPrefixCache(), deltas, errors) and not deltas and not errors
    assert run_one_by_one(core, [prompt], params)[0][2] == 0  # forgotten
    assert core.handle(Shutdown(), deltas, errors) is False


def test_in_bfloat16_a_hit_reads_back_exactly_what_an_earlier_request_computed(
    tiny_loaded, tiny_llama
):
    """What holds in bfloat16, where batch shapes change the rounding: every
    hit on the same blocks gives bitwise the same tokens and logprobs (the
    blocks are read, never rewritten), and a hit stays within bfloat16's
    rounding of the run that computed everything itself."""
    from dataclasses import replace

    from sluice.loader.choices import ModelChoices
    from sluice.models.llama import LlamaForCausalLM

    model = LlamaForCausalLM(tiny_loaded.model_config, torch.bfloat16, torch.device("cpu"))
    model.load_weights(tiny_llama.weights())
    loaded = replace(tiny_loaded, model=model, choices=ModelChoices("bfloat16", None, "as asked"))
    prompt = random_prompts(1, seed=13)[0] * 3
    params = msgspec.structs.replace(GREEDY, logprobs=1, max_tokens=6)
    first, hit, again = run_one_by_one(make_core(loaded), [prompt] * 3, params)
    assert first[2] == 0 and hit[2] == again[2] > 0
    assert hit[:2] == again[:2]  # bitwise
    assert hit[1][0] == pytest.approx(first[1][0], abs=0.05)  # the first token's logprob
