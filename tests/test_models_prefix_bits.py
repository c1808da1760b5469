"""What decides whether a prefix block restored from a cache tier holds the
bits recomputing it would (issue 44): a prompt's KV must not depend on the
chunk budget that computed it.

A block's K/V at layer l are a projection of the hidden state that layer l - 1
computed for those positions, so they carry every earlier layer's attention
rounding. With the row-invariant default, matmuls give a row the same bits in
any step, and attention rows below `DECODE_ROW_POSITIONS` (512) run in the
decode kernel over exactly their own keys: a prompt's KV is the same whatever
the chunking up to there. Past it, prefill chunks run in flash kernels (the
native one, or torch's SDPA, as the kernel plan chose) whose rounding follows
the chunk: the same prompt computed in other budgets gives other KV bits, so
a block restored from any cache (the pool's own prefix cache included) can
differ from a cold recompute. `--batch-invariant` runs every row in the
decode kernel, and is chunking-blind at every length.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from sluice.config import ModelConfig
from sluice.engine.core import EngineCore
from sluice.engine.request import Request
from sluice.engine.sampling_params import SamplingParams
from sluice.loader.loaded_model import LoadedModel, load_model
from sluice.models import calibration
from sluice.models.attention import DECODE_ROW_POSITIONS
from sluice.models.native.int8 import int8_gemm_kernels
from tests.invariance_runs import bf16_loaded, random_prompt
from tests.model_factory import make_core

BLOCK_SIZE = 16
LONGEST_PROMPT = 8000
ONE_TOKEN = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def prompt_kv(core: EngineCore, prompt: list[int]) -> list[torch.Tensor]:
    """Compute `prompt` and return, per layer, the K/V of its full blocks in
    position order: [2, num_full_blocks * block_size, kv_heads, head_dim]."""
    core.add_request("cold", prompt, ONE_TOKEN)
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


def kv_by_budget(loaded: LoadedModel, prompt: list[int], budgets) -> dict[int, int | None]:
    """Per budget, the first position whose KV differs from the first budget's."""
    loaded = replace(loaded, max_model_len=len(prompt) + 64)
    num_blocks = 2 * (len(prompt) // BLOCK_SIZE + 8)
    runs = [
        prompt_kv(make_core(loaded, block_size=BLOCK_SIZE, budget=b, num_blocks=num_blocks), prompt)
        for b in budgets
    ]
    return {b: first_differing_position(runs[0], run) for b, run in zip(budgets, runs, strict=True)}


@pytest.fixture(scope="module")
def long_tiny(tiny_loaded) -> LoadedModel:
    """The tiny model with RoPE tables long enough for 8k-token prompts."""
    config = replace(tiny_loaded.model_config, max_position_embeddings=LONGEST_PROMPT + 64)
    return replace(tiny_loaded, model_config=config)


@pytest.fixture(scope="module")
def row_invariant(long_tiny, tiny_llama) -> LoadedModel:
    """The default's scheme on the tiny model: bf16, row-invariant int8 matmuls."""
    if int8_gemm_kernels() is None:
        pytest.skip("no native int8 matmul (AVX512-VNNI) here")
    loaded = bf16_loaded(long_tiny, tiny_llama, batch_invariant=False)
    rng = random.Random(7)
    calibration.quantize_row_invariant(loaded.model, [rng.randrange(3, 512) for _ in range(300)])
    return loaded


def test_the_default_gives_a_prompt_below_512_the_same_kv_in_any_chunking(row_invariant):
    prompt = random_prompt(random.Random(1), DECODE_ROW_POSITIONS - 3)
    assert kv_by_budget(row_invariant, prompt, (2048, 7, 64, 129)) == dict.fromkeys(
        (2048, 7, 64, 129)
    )


@pytest.mark.xfail(
    # Not strict: which prefill kernel runs past 512 is the kernel plan's
    # choice, measured at load on each CPU and under each load (a clean CI
    # clone measured a plan whose kernel gave these budgets the same bits).
    strict=False,
    raises=AssertionError,
    reason="issue 44: past position 512 prefill attention runs in flash kernels whose "
    "rounding follows the chunk; a restored prefix is exact there only with --batch-invariant",
)
def test_the_default_gives_a_long_prompt_the_same_kv_in_any_chunking(row_invariant):
    prompt = random_prompt(random.Random(2), 3000)
    differences = kv_by_budget(row_invariant, prompt, (2048, 512, 300))
    assert differences == dict.fromkeys((2048, 512, 300))


def test_the_default_long_prompt_kv_first_differs_past_512(row_invariant):
    """Where the difference starts: never below DECODE_ROW_POSITIONS."""
    prompt = random_prompt(random.Random(2), 3000)
    differences = kv_by_budget(row_invariant, prompt, (2048, 512, 300))
    assert all(p is None or p >= DECODE_ROW_POSITIONS for p in differences.values())
    assert any(p is not None for p in differences.values()), "now chunking-blind: drop the xfail"


def test_batch_invariant_mode_gives_an_8k_prompt_the_same_kv_in_any_chunking(long_tiny, tiny_llama):
    loaded = bf16_loaded(long_tiny, tiny_llama, batch_invariant=True)
    prompt = random_prompt(random.Random(3), LONGEST_PROMPT)
    assert kv_by_budget(loaded, prompt, (2048, 1000, 333)) == dict.fromkeys((2048, 1000, 333))


@pytest.mark.slow
@pytest.mark.xfail(
    strict=False,  # the kernel plan's choice, measured at load (see above)
    raises=AssertionError,
    reason="issue 44: the embedded model's default prefill kernels past 512 round by chunk",
)
def test_the_embedded_default_gives_a_long_prompt_the_same_kv_in_any_chunking(
    embedded_model_dir,
):
    loaded = load_model(ModelConfig(cache_dir=embedded_model_dir.parent))
    prompt = random_prompt(random.Random(4), 1500)
    assert kv_by_budget(loaded, prompt, (2048, 500)) == dict.fromkeys((2048, 500))
