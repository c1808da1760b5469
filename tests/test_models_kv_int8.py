"""The 8-bit KV cache (sluice/models/kv_int8.py, issue 44): the per-group
scheme, and that a model on it keeps the bf16 pool's guarantees: a prompt's
KV bytes, and its greedy tokens and logprobs, do not depend on the chunk
budget, a prefix-cache hit, a RAM-tier restore or preemption."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from torch import Tensor

from sluice.engine.engine_request import generation_request
from sluice.engine.sampling_params import SamplingParams
from sluice.loader.choices import ModelChoices
from sluice.loader.loaded_model import LoadedModel
from sluice.models import kv_int8, native
from sluice.models.attention import (
    AttentionMetadata,
    allocate_kv_caches,
    kv_cache_bytes_per_block,
)
from tests.invariance_runs import bf16_loaded, random_prompt
from tests.model_factory import build_tiny_model, load_tiny_llama, make_core

BLOCK_SIZE = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2)


def test_each_group_of_16_reads_back_within_half_a_step_of_its_own_scale():
    x = torch.randn(50, 3, 64) * torch.rand(50, 3, 1) * 10  # [T, Hkv, D]
    x[:, :, 5] *= 40  # an outlier channel, as keys have: it sets one group's scale only
    rows = kv_int8.quantize_rows(x)
    assert rows.dtype == torch.int8 and rows.shape == (50, 3, 64 + 4 * 4)
    back = kv_int8.dequantize_rows(rows, torch.float32)
    step = x.view(50, 3, 4, 16).abs().amax(-1, keepdim=True) / 127  # [T, Hkv, 4, 1]
    error = (back - x).view(50, 3, 4, 16).abs()
    assert (error <= step / 2 * (1 + 1e-5)).all()
    # The largest element of each group is exact up to float rounding.
    groups, back_groups = x.view(50, 3, 4, 16), back.view(50, 3, 4, 16)
    top = groups.abs().argmax(-1, keepdim=True)
    assert torch.allclose(back_groups.gather(-1, top), groups.gather(-1, top), rtol=1e-6)


def test_an_outlier_channel_costs_the_other_groups_nothing():
    x = torch.randn(8, 1, 64)
    with_outlier = x.clone()
    with_outlier[:, :, 0] = 1000.0
    back = kv_int8.dequantize_rows(kv_int8.quantize_rows(with_outlier), torch.float32)
    plain = kv_int8.dequantize_rows(kv_int8.quantize_rows(x), torch.float32)
    assert torch.equal(back[..., 16:], plain[..., 16:])


def test_the_scales_follow_the_values_as_float32_per_group():
    x = torch.zeros(1, 1, 32)
    x[0, 0, 3], x[0, 0, 20] = 2.54, -0.127
    rows = kv_int8.quantize_rows(x)
    scales = rows[0, 0, 32:].contiguous().view(torch.float32)
    assert torch.allclose(scales, torch.tensor([0.02, 0.001]))
    assert rows[0, 0, 3] == 127 and rows[0, 0, 20] == -127


def test_a_rows_bytes_do_not_depend_on_the_rows_beside_it():
    x = torch.randn(40, 2, 128, dtype=torch.bfloat16)
    together = kv_int8.quantize_rows(x)
    alone = torch.stack([kv_int8.quantize_rows(x[i : i + 1])[0] for i in range(40)])
    assert torch.equal(together, alone)


def test_an_all_zero_row_reads_back_as_zeros():
    rows = kv_int8.quantize_rows(torch.zeros(2, 1, 16))
    assert not rows.any()
    assert not kv_int8.dequantize_rows(rows, torch.bfloat16).any()


def test_heads_the_groups_do_not_divide_are_refused():
    with pytest.raises(ValueError, match="multiple of 16"):
        kv_int8.quantize_rows(torch.zeros(1, 1, 40))


def test_the_pool_is_int8_with_a_scale_per_group_and_5_8_of_the_bf16_bytes(tiny_loaded):
    config = tiny_loaded.model_config
    caches = allocate_kv_caches(config, 8, 16, torch.bfloat16, "cpu", kv_dtype=torch.int8)
    head_dim = config.layer_kv_shape(0)[1]
    assert caches[0].dtype == torch.int8 and caches[0].shape[-1] == head_dim * 5 // 4
    bf16 = kv_cache_bytes_per_block(config, 16, torch.bfloat16)
    int8 = kv_cache_bytes_per_block(config, 16, torch.bfloat16, kv_dtype=torch.int8)
    assert int8 * 8 == bf16 * 5


def test_fp8_names_and_a_bf16_pool_under_a_float32_model_are_refused():
    assert kv_int8.kv_torch_dtype("int8", torch.float32) == torch.int8
    assert kv_int8.kv_torch_dtype("auto", torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="bfloat16 model"):
        kv_int8.kv_torch_dtype("bf16", torch.float32)


@pytest.fixture(scope="module")
def bf16_tiny(tiny_loaded, tiny_llama) -> LoadedModel:
    return bf16_loaded(tiny_loaded, tiny_llama, batch_invariant=False)


def greedy_run(core, prompt: list[int], request_id: str = "probe", params=GREEDY):
    core.add_request(generation_request(request_id, prompt, params))
    tokens, logprobs = [], []
    while core.has_unfinished_requests():
        for delta in core.step():
            tokens += delta.new_token_ids
            logprobs += delta.logprobs.logprobs
    return tokens, logprobs


def int8_core(loaded: LoadedModel, budget: int, num_blocks: int = 64, **options):
    return make_core(
        loaded, block_size=BLOCK_SIZE, budget=budget, num_blocks=num_blocks,
        kv_cache_dtype="int8", **options,
    )  # fmt: skip


def prompts_kv(loaded: LoadedModel, prompts: list[list[int]], chunk: int) -> list[Tensor]:
    """Each prompt's int8 K/V bytes ([2, tokens, Hkv, width] per layer, layers
    stacked), the prompts fed together, `chunk` tokens of each per step."""
    model, blocks = loaded.model, [-(-len(p) // BLOCK_SIZE) for p in prompts]
    caches = allocate_kv_caches(
        model.config, sum(blocks), BLOCK_SIZE, model.dtype, "cpu", kv_dtype=torch.int8
    )
    firsts = [sum(blocks[:i]) for i in range(len(prompts))]
    tables = [list(range(f, f + n)) for f, n in zip(firsts, blocks, strict=True)]
    with torch.inference_mode():
        for start in range(0, max(map(len, prompts)), chunk):
            live = [i for i, p in enumerate(prompts) if start < len(p)]
            pieces = [prompts[i][start : start + chunk] for i in live]
            meta = AttentionMetadata.build(
                [len(p) for p in pieces], [start] * len(live), [tables[i] for i in live],
                BLOCK_SIZE, "cpu",
            )  # fmt: skip
            ids = torch.tensor([t for p in pieces for t in p])
            positions = torch.cat([torch.arange(start, start + len(p)) for p in pieces])
            model(ids, positions, caches, meta)
    stacked = torch.stack([c for c in caches if c.dtype == torch.int8])  # [L, 2, blocks, 16, H, W]
    flat = stacked.flatten(2, 3)  # [L, 2, blocks * 16, H, W]
    return [
        flat[:, :, f * BLOCK_SIZE : f * BLOCK_SIZE + len(p)]
        for f, p in zip(firsts, prompts, strict=True)
    ]


def test_a_prompts_kv_bytes_are_the_same_in_one_chunk_or_several_alone_or_batched(bf16_tiny):
    rng = random.Random(44)
    prompt, other = random_prompt(rng, 150), random_prompt(rng, 90)
    (one_chunk,) = prompts_kv(bf16_tiny, [prompt], 150)
    assert one_chunk.any(), "the pool was written"
    for chunk in (7, 16, 64):
        assert torch.equal(prompts_kv(bf16_tiny, [prompt], chunk)[0], one_chunk)
    assert torch.equal(prompts_kv(bf16_tiny, [other, prompt], 32)[1], one_chunk)


def test_the_engine_allocates_an_int8_pool(bf16_tiny):
    core = int8_core(bf16_tiny, 64)
    assert core.runner.kv_caches[0].dtype == torch.int8


def test_any_chunk_budget_gives_the_one_shot_tokens_and_logprobs_bitwise(bf16_tiny):
    prompt = random_prompt(random.Random(4), 240)
    loaded = bf16_tiny
    one_shot = greedy_run(int8_core(loaded, 512), prompt)
    for budget in (7, 64, 129):
        assert greedy_run(int8_core(loaded, budget), prompt) == one_shot, budget


def test_a_prefix_hit_gives_the_cold_runs_bits(bf16_tiny):
    prompt = random_prompt(random.Random(5), 200)
    loaded = bf16_tiny
    cold = greedy_run(int8_core(loaded, 64), prompt)
    core = int8_core(loaded, 64)
    greedy_run(core, prompt[:150] + [7, 8, 9], "warm-up")
    hits = core.kv.num_hit_tokens
    assert greedy_run(core, prompt) == cold
    assert core.kv.num_hit_tokens > hits


def test_a_ram_tier_restore_gives_the_cold_runs_bits(bf16_tiny):
    prompt = random_prompt(random.Random(6), 120)
    loaded = replace(bf16_tiny, max_model_len=160)
    cold = greedy_run(int8_core(loaded, 64), prompt)
    # A pool of 12 blocks: the other prompt evicts the first one's blocks to RAM.
    core = int8_core(loaded, 64, num_blocks=12, kv_offload_bytes=1 << 20)
    greedy_run(core, prompt, "first")
    greedy_run(core, random_prompt(random.Random(7), 150), "evicts")
    assert greedy_run(core, prompt) == cold
    assert core.tiers is not None and core.tiers.stats.ram_hit_blocks > 0


def test_preemption_gives_each_request_its_cold_runs_bits(bf16_tiny):
    prompts = [random_prompt(random.Random(10 + i), 60) for i in range(2)]
    loaded = replace(bf16_tiny, max_model_len=120)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
    cold = [greedy_run(int8_core(loaded, 64), p, params=params) for p in prompts]
    # 8 blocks: both prompts (4 blocks each) start, and one is preempted
    # when both need a fifth.
    core = int8_core(loaded, 256, num_blocks=8, prefix_caching=False)
    for i, prompt in enumerate(prompts):
        core.add_request(generation_request(f"r{i}", prompt, params))
    results: dict[str, tuple[list[int], list[float]]] = {"r0": ([], []), "r1": ([], [])}
    while core.has_unfinished_requests():
        for delta in core.step():
            tokens, logprobs = results[delta.request_id]
            tokens += delta.new_token_ids
            logprobs += delta.logprobs.logprobs
    assert core.scheduler.num_preemptions > 0
    assert [results["r0"], results["r1"]] == cold


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (8, 1, 128), (4, 4, 64)])
def test_the_native_int8_decode_rows_are_the_bf16_kernels_bits_over_the_dequantized_pool(
    heads, kv_heads, head_dim
):
    int8_kernel = native.decode_attention_int8kv_kernel()
    bf16_kernel = native.decode_attention_kernel(torch.bfloat16)
    if int8_kernel is None or bf16_kernel is None:
        pytest.skip("no native library here")
    generator = torch.Generator().manual_seed(heads * head_dim)
    lengths = [1, 17, 100, 333]
    pool = kv_int8.quantize_rows(
        torch.randn(2, 120, 16, kv_heads, head_dim, generator=generator) * 3
    )  # [2, blocks, 16, Hkv, D * 5 / 4]
    tables = torch.randperm(119, generator=generator)[: 4 * 21].view(4, 21) + 1
    q = torch.randn(4, heads, head_dim, generator=generator).to(torch.bfloat16)
    seq_lens = torch.tensor(lengths)
    out = int8_kernel(q, pool, tables, seq_lens, 0.125)
    if out is None:
        pytest.skip("no AVX512-BF16 fixed-block kernel here")
    readable = kv_int8.readable_pool(pool, tables, torch.bfloat16)
    assert torch.equal(out, bf16_kernel(q, readable, tables, seq_lens, 0.125))


@pytest.fixture(scope="module")
def wide_heads(tiny_loaded, tmp_path_factory) -> LoadedModel:
    """A tiny bf16 model with one head of 64: the fixed-block kernels' heads."""
    tiny = build_tiny_model(
        "llama_tied", tmp_path_factory.mktemp("wide-heads"), hidden_size=64,
        num_attention_heads=1, num_key_value_heads=1, head_dim=64, max_position_embeddings=1100,
    )  # fmt: skip
    model = load_tiny_llama(tiny, torch.bfloat16)
    choices = ModelChoices("bfloat16", None, "as asked")
    return replace(
        tiny_loaded, model=model, model_config=model.config, choices=choices, max_model_len=1000
    )


def test_decoded_tokens_sent_back_as_prompt_give_the_decodes_next_token_bitwise(wide_heads):
    """Past position 512 a chunk's rows run in the prefill kernel over the
    dequantized pool, a decode step's in the native int8 decode kernel: the
    same bits."""
    prompt = random_prompt(random.Random(9), 600)
    tokens, logprobs = greedy_run(int8_core(wide_heads, 256, num_blocks=160), prompt)
    next_one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=2)
    again = greedy_run(
        int8_core(wide_heads, 100, num_blocks=160), prompt + tokens[:3], params=next_one
    )
    assert again == ([tokens[3]], [logprobs[3]])
