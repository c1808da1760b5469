"""What decides whether a prefix block restored from a cache tier holds the
bits recomputing it would (issue 44): a prompt's KV must not depend on the
chunk budget that computed it.

A block's K/V at layer l are a projection of the hidden state that layer l - 1
computed for those positions, so they carry every earlier layer's attention
rounding. With the row-invariant default, matmuls give a row the same bits in
any step, and attention is chunk-blind at every length: the prefill and
decode kernels of one family visit keys in blocks at fixed absolute
positions through one per-row step (native/avx512_attention.h), and where no
prefill kernel runs on a model's heads (the tiny model's 16), every prefill
token is a row of the decode kernel. So a prompt's KV is the same whatever
the chunk budget, and a token decoded in one turn and sent back as prompt
in the next has the same KV both times.

- the tiny model (heads of 16: decode-kernel rows) and a tiny model with
  heads of 64 (the native prefill kernel past position 512): the same KV
  bits below 512 and for 3,000-token prompts in any chunking;
- property: random prompts up to 8k tokens and random chunk budgets give
  the one-shot prefill's greedy tokens and logprobs bitwise, and a prompt
  that ends in tokens the model decoded gives the decode's next token and
  logprob bitwise (prefill rows equal decode rows);
- `--batch-invariant` (every row in the decode kernel) and the embedded
  model's default, likewise.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sluice.config import ModelConfig
from sluice.engine.core import EngineCore
from sluice.engine.engine_request import generation_request
from sluice.engine.request import Request
from sluice.engine.sampling_params import SamplingParams
from sluice.loader.choices import ModelChoices
from sluice.loader.loaded_model import LoadedModel, load_model
from sluice.models import calibration
from sluice.models.attention import DECODE_ROW_POSITIONS
from sluice.models.native.int8 import int8_gemm_kernels
from sluice.models.native.prefill import prefill_attention_kernel
from tests.invariance_runs import bf16_loaded, random_prompt
from tests.model_factory import build_tiny_model, load_tiny_llama, make_core

BLOCK_SIZE = 16
LONGEST_PROMPT = 8000
ONE_TOKEN = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def prompt_kv(core: EngineCore, prompt: list[int]) -> list[torch.Tensor]:
    """Compute `prompt` and return, per layer, the K/V of its full blocks in
    position order: [2, num_full_blocks * block_size, kv_heads, head_dim]."""
    core.add_request(generation_request("cold", prompt, ONE_TOKEN))
    while core.has_unfinished_requests():
        core.step()
    finder = Request("finder", prompt + [0], ONE_TOKEN)  # +1: every full block is reusable
    num_tokens = core.kv.take_cached_prefix(finder)
    assert num_tokens == len(prompt) // BLOCK_SIZE * BLOCK_SIZE, "the prompt's blocks were evicted"
    block_ids = torch.tensor(finder.block_ids)
    kv = [cache[:, block_ids].flatten(1, 2).clone() for cache in core.runner.kv_caches]
    core.kv.free(finder)
    return kv


def first_differing_position(a: list[torch.Tensor], b: list[torch.Tensor]) -> int | None:
    """The first position whose K or V differs in any layer; None if all agree."""
    positions = [
        int(torch.nonzero((x != y).flatten(2).any(-1).any(0))[0])
        for x, y in zip(a, b, strict=True)
        if not torch.equal(x, y)
    ]
    return min(positions, default=None)


def kv_by_budget(
    loaded: LoadedModel, prompt: list[int], budgets, kv_cache_dtype: str = "auto"
) -> dict[int, int | None]:
    """Per budget, the first position whose KV differs from the first budget's."""
    loaded = replace(loaded, max_model_len=len(prompt) + 64)
    num_blocks = 2 * (len(prompt) // BLOCK_SIZE + 8)
    runs = [
        prompt_kv(
            make_core(
                loaded,
                block_size=BLOCK_SIZE,
                budget=b,
                num_blocks=num_blocks,
                kv_cache_dtype=kv_cache_dtype,
            ),
            prompt,
        )  # fmt: skip
        for b in budgets
    ]
    return {b: first_differing_position(runs[0], run) for b, run in zip(budgets, runs, strict=True)}


@pytest.fixture(scope="module")
def long_tiny(tiny_loaded) -> LoadedModel:
    """The tiny model with RoPE tables long enough for 8k-token prompts."""
    config = replace(tiny_loaded.model_config, max_position_embeddings=LONGEST_PROMPT + 64)
    return replace(tiny_loaded, model_config=config)


def quantized(loaded: LoadedModel) -> LoadedModel:
    """The default's scheme: bf16, row-invariant int8 matmuls."""
    if int8_gemm_kernels() is None:
        pytest.skip("no native int8 matmul (AVX512-VNNI) here")
    rng = random.Random(7)
    calibration.quantize_row_invariant(loaded.model, [rng.randrange(3, 512) for _ in range(300)])
    return loaded


@pytest.fixture(scope="module")
def row_invariant(long_tiny, tiny_llama) -> LoadedModel:
    """The default's scheme on the tiny model (heads of 16)."""
    return quantized(bf16_loaded(long_tiny, tiny_llama, batch_invariant=False))


@pytest.fixture(scope="module")
def wide_heads(long_tiny, tmp_path_factory) -> LoadedModel:
    """The default's scheme on a tiny model with heads of 64, where the
    native prefill kernel runs (a query and a KV head: 2 layers)."""
    if prefill_attention_kernel(torch.bfloat16) is None:
        pytest.skip("no native prefill kernel (AVX512-BF16) here")
    tiny = build_tiny_model(
        "llama_tied", tmp_path_factory.mktemp("wide-heads"), hidden_size=64,
        num_attention_heads=1, num_key_value_heads=1, head_dim=64,
        max_position_embeddings=LONGEST_PROMPT + 64,
    )  # fmt: skip
    model = load_tiny_llama(tiny, torch.bfloat16)
    choices = ModelChoices("bfloat16", None, "as asked")  # the KV cache's dtype too
    return quantized(replace(long_tiny, model=model, model_config=model.config, choices=choices))


def test_the_default_gives_a_prompt_below_512_the_same_kv_in_any_chunking(row_invariant):
    prompt = random_prompt(random.Random(1), DECODE_ROW_POSITIONS - 3)
    assert kv_by_budget(row_invariant, prompt, (2048, 7, 64, 129)) == dict.fromkeys(
        (2048, 7, 64, 129)
    )


def test_the_default_gives_a_long_prompt_the_same_kv_in_any_chunking(row_invariant):
    prompt = random_prompt(random.Random(2), 3000)
    differences = kv_by_budget(row_invariant, prompt, (2048, 512, 300, 65))
    assert differences == dict.fromkeys((2048, 512, 300, 65))


# int8: the 8-bit KV pool (models/kv_int8.py) keeps the kernels chunk-blind.
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_the_native_prefill_kernel_gives_a_long_prompt_the_same_kv_in_any_chunking(
    wide_heads, kv_cache_dtype
):
    prompt = random_prompt(random.Random(2), 3000)
    budgets = (4096, 512, 300, 65, 33)
    differences = kv_by_budget(wide_heads, prompt, budgets, kv_cache_dtype)
    assert differences == dict.fromkeys(budgets)


GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=2)
NEXT_ONE = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logprobs=2)


def greedy_run(core: EngineCore, prompt: list[int], params: SamplingParams = GREEDY):
    """The greedy tokens, their logprobs and the top logprobs of `prompt`."""
    core.add_request(generation_request("probe", prompt, params))
    tokens, logprobs, tops = [], [], []
    while core.has_unfinished_requests():
        for delta in core.step():
            tokens += delta.new_token_ids
            logprobs += delta.logprobs.logprobs
            tops += delta.logprobs.top_logprobs
    return tokens, logprobs, tops


# No shrinking: an 8k-token example takes seconds, and its draws are printed.
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck),
          phases=(Phase.explicit, Phase.reuse, Phase.generate))  # fmt: skip
@given(data=st.data())
def test_any_chunking_and_decoding_give_the_one_shot_prefills_bits(wide_heads, data):
    # Past DECODE_ROW_POSITIONS, where the prefill kernel serves (below it,
    # the tests above).
    length = data.draw(st.integers(DECODE_ROW_POSITIONS + 1, LONGEST_PROMPT), label="length")
    seed = data.draw(st.integers(0, 2**16), label="prompt seed")
    # At least length / 120 tokens a step: each example stays a few seconds.
    budget = data.draw(st.integers(max(8, length // 120), 4096), label="chunk budget")
    prompt = random_prompt(random.Random(seed), length)
    loaded = replace(wide_heads, max_model_len=length + 64)
    num_blocks = 2 * (length // BLOCK_SIZE + 8)

    def core(budget: int) -> EngineCore:
        return make_core(loaded, block_size=BLOCK_SIZE, budget=budget, num_blocks=num_blocks)

    one_shot = greedy_run(core(length + 8), prompt)
    assert greedy_run(core(budget), prompt) == one_shot
    # The tokens it decoded, sent back as prompt (an agent's next turn): the
    # prefill rows of those positions give the decode's next token bitwise.
    tokens, logprobs, tops = one_shot
    again = greedy_run(core(budget), prompt + tokens[:2], NEXT_ONE)
    assert again == ([tokens[2]], [logprobs[2]], [tops[2]])


def test_batch_invariant_mode_gives_an_8k_prompt_the_same_kv_in_any_chunking(long_tiny, tiny_llama):
    loaded = bf16_loaded(long_tiny, tiny_llama, batch_invariant=True)
    prompt = random_prompt(random.Random(3), LONGEST_PROMPT)
    assert kv_by_budget(loaded, prompt, (2048, 1000, 333)) == dict.fromkeys((2048, 1000, 333))


@pytest.mark.slow
def test_the_embedded_default_gives_a_long_prompt_the_same_kv_in_any_chunking(
    embedded_model_dir,
):
    loaded = load_model(ModelConfig(cache_dir=embedded_model_dir.parent))
    prompt = random_prompt(random.Random(4), 1500)
    assert kv_by_budget(loaded, prompt, (2048, 500)) == dict.fromkeys((2048, 500))
