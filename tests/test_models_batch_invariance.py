"""Batch-invariant mode, and the default's row-invariant scheme (int8
matmuls with exact sums, decode-kernel attention rows below 512 positions):
in bfloat16, where batch shapes change the rounding of other kernels, a
greedy request's tokens and logprobs are bitwise the same alone, inside
random batches, under random prefill chunk budgets, after preemption, and
with or without a prefix-cache hit."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from sluice.config import ModelConfig
from sluice.loader.loaded_model import LoadedModel, load_model
from sluice.models import calibration
from sluice.models.linear import BATCH_INVARIANT_ROW_TILE, Linear, in_row_tiles
from sluice.models.native.int8 import int8_gemm_kernels
from tests.invariance_runs import bf16_loaded, probe_output, random_prompt
from tests.model_factory import make_core


@pytest.fixture(scope="module", params=["batch_invariant", "row_invariant"])
def invariant(request, tiny_loaded, tiny_llama) -> LoadedModel:
    """`--batch-invariant`, or the default where the native int8 matmul runs."""
    if request.param == "batch_invariant":
        return bf16_loaded(tiny_loaded, tiny_llama, batch_invariant=True)
    if int8_gemm_kernels() is None:
        pytest.skip("no native int8 matmul (AVX512-VNNI) here")
    loaded = bf16_loaded(tiny_loaded, tiny_llama, batch_invariant=False)
    rng = random.Random(7)
    calibration.quantize_row_invariant(loaded.model, [rng.randrange(3, 512) for _ in range(300)])
    return loaded


def test_row_tiles_give_each_row_the_bits_it_has_alone():
    torch.manual_seed(0)
    weight = (torch.randn(576, 1536) * 0.05).bfloat16()
    matmul = lambda x: torch.nn.functional.linear(x, weight)  # noqa: E731
    rows = torch.randn(70, 1536).bfloat16()
    alone = in_row_tiles(matmul, rows[:1], BATCH_INVARIANT_ROW_TILE)
    for count in (1, 3, 5, 7, 12, 33, 70):
        assert torch.equal(
            in_row_tiles(matmul, rows[:count], BATCH_INVARIANT_ROW_TILE)[0], alone[0]
        )
        moved = torch.cat([rows[1:count], rows[:1]])  # the same row last, in another tile place
        assert torch.equal(in_row_tiles(matmul, moved, BATCH_INVARIANT_ROW_TILE)[-1], alone[0])


def test_a_tiled_linear_takes_the_dense_path_even_when_quantized():
    linear = Linear(64, 32, False, torch.bfloat16, "cpu", row_tile=BATCH_INVARIANT_ROW_TILE)
    torch.nn.init.normal_(linear.weight, std=0.1)
    linear.quantize("int8")
    assert linear.max_quantized_tokens == 0
    x = torch.randn(3, 64).bfloat16()
    assert torch.equal(linear(x), torch.nn.functional.linear(x, linear.dense_weight()))


def test_a_greedy_request_is_bitwise_the_same_alone_and_in_random_batches(invariant):
    rng = random.Random(16)
    probe = random_prompt(rng, 37)
    alone = probe_output(make_core(invariant, budget=512, chunked=False), probe, [], rng)
    num_preempted = 0
    for trial in range(8):
        crowd = [random_prompt(rng, rng.randrange(3, 50)) for _ in range(rng.randrange(1, 12))]
        if trial % 2:  # crowd members sharing the probe's first blocks: prefix-cache hits
            crowd[0] = probe[: rng.randrange(8, 37)] + random_prompt(rng, 5)
        # A tight KV pool (bf16 blocks are half the size make_core assumes) forces preemptions.
        core = make_core(
            replace(invariant, max_model_len=128),
            budget=rng.choice([5, 8, 13, 32, 64]),
            num_blocks=rng.choice([16, 24, 512]),
            prefix_caching=rng.random() < 0.7,
        )
        assert probe_output(core, probe, crowd, rng) == alone, f"trial {trial}"
        num_preempted += core.scheduler.num_preemptions
    assert num_preempted > 0


def test_a_prefix_cache_hit_and_a_second_run_give_the_same_bits(invariant):
    rng = random.Random(3)
    probe = random_prompt(rng, 45)
    core = make_core(invariant, budget=16)
    first = probe_output(core, probe, [], rng)
    hit = probe_output(core, probe, [random_prompt(rng, 20)], rng)
    assert core.stats().prefix_cache_hit_tokens > 0
    assert hit == first


def test_the_previous_default_differs_where_these_do_not(tiny_loaded, tiny_llama, invariant):
    """The comparison above can fail: with the previous default's matmuls
    (int4 weights for steps of a few rows, W8A8 above), a prompt prefilled
    in 4-token chunks and in one piece rounds apart."""
    default = bf16_loaded(tiny_loaded, tiny_llama, batch_invariant=False)
    default.model.quantize("int4")
    rng = random.Random(7)
    calibration.quantize_activations(default.model, [rng.randrange(3, 512) for _ in range(300)])
    rng = random.Random(16)
    probe = random_prompt(rng, 37)
    outputs = {
        name: [
            probe_output(make_core(loaded, budget=budget), probe, [], rng)[1] for budget in (4, 64)
        ]
        for name, loaded in (("default", default), ("invariant", invariant))
    }
    assert outputs["default"][0] != outputs["default"][1]
    assert outputs["invariant"][0] == outputs["invariant"][1]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["batch_invariant", "default"])
def test_the_embedded_model_in_bfloat16_answers_alike_alone_and_in_a_crowd(
    embedded_model_config, embedded_tokenizer, mode
):
    """What `--batch-invariant`, and the default where the native int8 matmul
    runs, promise a client on the real model: the crowd and small chunks
    change every step's shapes, not one bit of the probe's answer."""
    if mode == "batch_invariant":
        config = replace(embedded_model_config, dtype="bfloat16", quantization="int4")
        loaded = load_model(replace(config, batch_invariant=True))
        assert loaded.model.batch_invariant
    else:
        loaded = load_model(ModelConfig(cache_dir=embedded_model_config.cache_dir))
        if not loaded.choices.row_invariant:
            pytest.skip("no native int8 matmul here: the default is not row-invariant")
    loaded = replace(loaded, max_model_len=1024)
    rng = random.Random(0)

    def prompt(text: str) -> list[int]:
        messages = [{"role": "user", "content": text}]
        chat = embedded_tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return embedded_tokenizer.encode(chat)

    probe = prompt("Explain why the sky is blue, in three sentences.")
    crowd = [prompt(f"Write a poem about the number {i}.") for i in range(12)]
    crowd.append(probe[:20] + prompt("Say hello."))
    alone = probe_output(
        make_core(loaded, budget=512, chunked=False, num_blocks=64, block_size=16), probe, [], rng
    )
    for budget in (7, 64):
        core = make_core(loaded, budget=budget, num_blocks=64, block_size=16)
        assert probe_output(core, probe, crowd, rng) == alone, f"budget {budget}"
