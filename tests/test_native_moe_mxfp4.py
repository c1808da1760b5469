"""moe_mxfp4.c (`mxfp4_moe`): gpt-oss's MoE layer's chosen MXFP4 experts in
one native call give the bits of one call per projection per expert
(Mxfp4Experts.forward with its biases and the clamped SwiGLU) summed in rank
order; a token's row is the same alone and in a batch of 1, 3 or 17 tokens
routed elsewhere; only the chosen experts' groups are read; bad ids are
refused; another activation runs per expert."""

from __future__ import annotations

import pytest
import torch

from sluice.models.linear import BATCH_INVARIANT_ROW_TILE, in_row_tiles
from sluice.models.mxfp4_experts import ClampedSwiglu, Mxfp4Experts
from sluice.models.native.mxfp4 import mxfp4_available, mxfp4_moe
from tests.moe_paths import per_expert_sum

pytestmark = pytest.mark.skipif(not mxfp4_available(), reason="needs the native library")
HIDDEN, INTER, NUM_EXPERTS = 96, 64, 6
SWIGLU = ClampedSwiglu(1.702, 1.5)  # a low limit, so the clamp bites


def random_groups(rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    """[E, rows, cols / 32, 17]: exponents near 2^0 (E8M0 120..130), random codes."""
    groups = torch.randint(0, 256, (NUM_EXPERTS, rows, cols // 32, 17), generator=g)
    groups[..., 0] = torch.randint(120, 131, groups.shape[:-1], generator=g)
    return groups.to(torch.uint8)


def mxfp4_experts(dtype: torch.dtype, seed: int = 0) -> Mxfp4Experts:
    g = torch.Generator().manual_seed(seed)
    gate_up, down = random_groups(2 * INTER, HIDDEN, g), random_groups(HIDDEN, INTER, g)
    gate_up_bias = torch.randn(NUM_EXPERTS, 2 * INTER, generator=g).to(dtype)
    down_bias = torch.randn(NUM_EXPERTS, HIDDEN, generator=g).to(dtype)
    return Mxfp4Experts(gate_up, down, gate_up_bias, down_bias)


def routing(tokens: int, top_k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(NUM_EXPERTS, generator=g)[:top_k] for _ in range(tokens)]
    ids = torch.stack(rows) if rows else torch.empty(0, top_k, dtype=torch.int64)
    return ids, torch.rand(tokens, top_k, generator=g).softmax(-1)


def test_the_per_expert_path_runs_its_activation_on_row_tiles():
    """per_expert_sum calls the expert on all its rows; moe.py's SwiGLU
    runs on fixed row tiles: the same bits, as the kernel is row-wise."""
    x = torch.randn(2 * BATCH_INVARIANT_ROW_TILE + 3, 2 * INTER).to(torch.bfloat16)
    assert torch.equal(in_row_tiles(SWIGLU, x, BATCH_INVARIANT_ROW_TILE), SWIGLU(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("tokens", "top_k"), [(1, 4), (3, 2), (17, 3), (40, 6)])
def test_one_call_gives_the_per_expert_paths_bits(dtype, tokens, top_k):
    kept = mxfp4_experts(dtype, seed=tokens)
    x = (torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(tokens)) * 3).to(dtype)
    ids, weights = routing(tokens, top_k, seed=tokens)
    got = kept.weighted_sum(x, ids, weights, SWIGLU)
    assert got is not None and got.dtype == torch.float32 and got.isfinite().all()
    assert torch.equal(got, per_expert_sum(kept, x, ids, weights, SWIGLU))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_tokens_row_is_the_same_alone_and_in_batches_routed_elsewhere(dtype):
    kept = mxfp4_experts(dtype)
    g = torch.Generator().manual_seed(7)
    probe = torch.randn(1, HIDDEN, generator=g).to(dtype)
    probe_ids, probe_weights = routing(1, 3, seed=99)
    alone = kept.weighted_sum(probe, probe_ids, probe_weights, SWIGLU)
    assert alone is not None
    for count in (1, 3, 17):
        others = torch.randn(count - 1, HIDDEN, generator=g).to(dtype)
        ids, weights = routing(count - 1, 3, seed=count)
        at = count // 2
        x = torch.cat([others[:at], probe, others[at:]])
        ids = torch.cat([ids[:at], probe_ids, ids[at:]])
        weights = torch.cat([weights[:at], probe_weights, weights[at:]])
        beside = kept.weighted_sum(x, ids, weights, SWIGLU)
        assert beside is not None and torch.equal(beside[at], alone[0]), count


def test_only_the_chosen_experts_groups_are_read():
    kept = mxfp4_experts(torch.float32)
    x = torch.randn(2, HIDDEN, generator=torch.Generator().manual_seed(3))
    ids, weights = torch.tensor([[4, 1], [1, 2]]), torch.tensor([[0.7, 0.3], [0.5, 0.5]])
    before = kept.weighted_sum(x, ids, weights, SWIGLU)
    for expert in (0, 3, 5):  # never chosen: exponents 2^127, biases NaN
        kept.gate_up[expert].fill_(0xFF)
        kept.down[expert].fill_(0xFF)
        kept.gate_up_bias[expert] = float("nan")
    after = kept.weighted_sum(x, ids, weights, SWIGLU)
    assert after is not None and before is not None
    assert torch.equal(after, before) and after.isfinite().all()


def test_an_expert_id_outside_the_layer_is_refused():
    kept = mxfp4_experts(torch.float32)
    stacks, biases = (kept.gate_up, kept.down), (kept.gate_up_bias, kept.down_bias)
    for bad in (NUM_EXPERTS, -1):
        with pytest.raises(ValueError, match=r"expert id outside \[0, 6\)"):
            mxfp4_moe(torch.randn(1, HIDDEN), stacks, biases, torch.tensor([[0, bad]]),
                      torch.ones(1, 2), 1.702, 7.0)  # fmt: skip


def test_another_activation_or_bias_dtype_runs_per_expert():
    kept = mxfp4_experts(torch.float32)
    x = torch.randn(1, HIDDEN)
    ids, weights = routing(1, 2, seed=1)
    silu = lambda t: torch.nn.functional.silu(t[:, :INTER]) * t[:, INTER:]  # noqa: E731
    assert kept.weighted_sum(x, ids, weights, silu) is None
    assert kept.weighted_sum(x.to(torch.bfloat16), ids, weights, SWIGLU) is None  # float32 biases
