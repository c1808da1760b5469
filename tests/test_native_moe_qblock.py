"""moe_qblock.c (`qblock_moe`): an MoE layer's chosen experts in GGUF blocks
in one native call give the bits of one call per projection per expert
(BlockExperts.forward) summed in rank order; a token's row is the same
alone and beside any rows routed anywhere; bad ids are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sluice.loader.gguf_blocks import FORMATS, BlockCodes
from sluice.models.moe_blocks import BlockExperts
from sluice.models.native import silu_mul_kernel
from sluice.models.native.qblock import QBlockMatrix, qblock_available, qblock_moe
from sluice.models.qblock_linear import QBlockLinear, merged_parts
from tests.moe_paths import per_expert_sum

pytestmark = pytest.mark.skipif(not qblock_available(), reason="needs the qblock kernel")
HIDDEN, INTER, NUM_EXPERTS = 256, 256, 6


def random_matrix(name: str, n: int, k: int, rng: np.random.Generator) -> QBlockMatrix:
    fmt = FORMATS[name]
    subs, supers = k // fmt.sub_block, k // fmt.super_block
    codes = BlockCodes(
        fmt,
        rng.integers(0, 2**fmt.bits, (n, k), dtype=np.uint8),
        rng.integers(0, 64, (n, subs), dtype=np.int8) if fmt.has_scales else None,
        rng.integers(0, 64, (n, subs), dtype=np.int8) if fmt.has_scales and fmt.has_min else None,
        (rng.random((n, supers)) / 64).astype(np.float16),
        (rng.random((n, supers)) / 64).astype(np.float16) if fmt.has_min else None,
    )
    return QBlockMatrix.from_codes(codes)


def block_experts(gate: str, up: str, down: str, seed: int = 0) -> BlockExperts:
    """Random experts: gate and up in their formats (merged where they can be), down in its."""
    rng = np.random.default_rng(seed)
    gate_up, downs = [], []
    for _ in range(NUM_EXPERTS):
        parts = [random_matrix(gate, INTER, HIDDEN, rng), random_matrix(up, INTER, HIDDEN, rng)]
        gate_up.append(QBlockLinear(merged_parts(parts), None))
        downs.append(QBlockLinear([random_matrix(down, HIDDEN, INTER, rng)], None))
    return BlockExperts(gate_up, downs)


def routing(tokens: int, top_k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(NUM_EXPERTS, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=g)
    return ids, weights / weights.sum(-1, keepdim=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("formats", "tokens", "top_k"), [
    (("Q4_K", "Q4_K", "Q6_K"), 1, 4), (("Q4_K", "Q4_K", "Q4_K"), 9, 3),
    (("Q4_K", "Q8_0", "Q5_K"), 5, 2), (("Q4_K", "Q4_K", "Q6_K"), 130, 6),
])  # fmt: skip
def test_one_call_gives_the_per_expert_paths_bits(dtype, formats, tokens, top_k):
    kept = block_experts(*formats)
    assert kept.expert_array is not None
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(tokens)).to(dtype)
    ids, weights = routing(tokens, top_k, seed=tokens)
    swiglu = silu_mul_kernel(dtype)
    got = kept.weighted_sum(x, ids, weights, swiglu)
    assert got is not None and got.dtype == torch.float32
    assert torch.equal(got, per_expert_sum(kept, x, ids, weights, swiglu))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_tokens_row_is_the_same_alone_and_beside_rows_routed_anywhere(dtype):
    kept = block_experts("Q4_K", "Q4_K", "Q6_K")
    g = torch.Generator().manual_seed(7)
    probe = torch.randn(1, HIDDEN, generator=g).to(dtype)
    probe_ids, probe_weights = routing(1, 3, seed=99)
    alone = qblock_moe(probe, kept.expert_array, INTER, probe_ids, probe_weights)
    for count in range(1, 10):
        others = torch.randn(count, HIDDEN, generator=g).to(dtype)
        ids, weights = routing(count, 3, seed=count)
        at = count // 2
        x = torch.cat([others[:at], probe, others[at:]])
        ids = torch.cat([ids[:at], probe_ids, ids[at:]])
        weights = torch.cat([weights[:at], probe_weights, weights[at:]])
        beside = qblock_moe(x, kept.expert_array, INTER, ids, weights)
        assert torch.equal(beside[at], alone[0]), count


def test_only_the_chosen_experts_blocks_are_read():
    kept = block_experts("Q4_K", "Q4_K", "Q6_K")
    x = torch.randn(2, HIDDEN, generator=torch.Generator().manual_seed(3))
    ids, weights = torch.tensor([[4, 1], [1, 2]]), torch.tensor([[0.7, 0.3], [0.5, 0.5]])
    before = qblock_moe(x, kept.expert_array, INTER, ids, weights)
    for expert in (0, 3, 5):  # never chosen: their scales become NaN
        for linear in (kept.gate_up[expert], kept.down[expert]):
            for part in linear.parts:
                part.packed.fill_(0xFF)
    after = qblock_moe(x, kept.expert_array, INTER, ids, weights)
    assert torch.equal(after, before) and after.isfinite().all()


def test_an_expert_id_outside_the_layer_is_refused():
    kept = block_experts("Q4_K", "Q4_K", "Q6_K")
    x = torch.randn(1, HIDDEN)
    for bad in (NUM_EXPERTS, -1):
        with pytest.raises(ValueError, match=r"expert id outside \[0, 6\)"):
            qblock_moe(x, kept.expert_array, INTER, torch.tensor([[0, bad]]), torch.ones(1, 2))


def test_experts_of_different_layouts_or_another_activation_run_per_expert():
    kept = block_experts("Q4_K", "Q4_K", "Q6_K")
    mixed = BlockExperts(
        list(kept.gate_up),
        [*list(kept.down)[:-1], block_experts("Q4_K", "Q4_K", "Q8_0").down[0]],
    )
    x = torch.randn(1, HIDDEN)
    ids, weights = routing(1, 2, seed=1)
    assert mixed.expert_array is None
    assert mixed.weighted_sum(x, ids, weights, silu_mul_kernel(torch.float32)) is None
    gelu = lambda t: torch.nn.functional.gelu(t[:, :INTER]) * t[:, INTER:]  # noqa: E731
    assert kept.weighted_sum(x, ids, weights, gelu) is None
