"""The mixture-of-experts block (sluice/models/moe.py): each family's routing,
the grouped experts against a per-token reference, row invariance bitwise
(a token's output alone equals its output among any others), and reading
only the chosen experts' weights."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import DecoderConfig
from sluice.models.llama import _swiglu
from sluice.models.moe import SOFTMAX_TOPK, TOPK_SOFTMAX, MoeBlock, check_experts
from sluice.models.native import silu_mul_kernel

HIDDEN, WIDTH, EXPERTS, TOP_K = 64, 32, 8, 2
CONFIG = DecoderConfig(
    architecture="test", vocab_size=16, hidden_size=HIDDEN, intermediate_size=128,
    num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    rms_norm_eps=1e-6, rope_theta=1e4, rope_scaling=None, max_position_embeddings=64,
    tie_word_embeddings=False, attention_bias=False, o_proj_bias=False, sliding_window=None,
    bos_token_id=None, num_experts=EXPERTS, num_experts_per_tok=TOP_K,
    moe_intermediate_size=WIDTH, norm_topk_prob=True,
)  # fmt: skip


def block(dtype=torch.float32, seed=0, **changes) -> MoeBlock:
    moe = MoeBlock(dataclasses.replace(CONFIG, **changes), dtype, "cpu")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for weight in (moe.router, moe.gate_up, moe.down):
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.1)
    return moe


def rows(count: int, dtype=torch.float32, seed=1, hidden=HIDDEN) -> torch.Tensor:
    return torch.randn(count, hidden, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize(
    ("scoring", "renormalise"), [(SOFTMAX_TOPK, True), (SOFTMAX_TOPK, False), (TOPK_SOFTMAX, False)]
)
def test_each_routing_normalises_the_top_k_as_its_family_does(scoring, renormalise):
    moe = block(router_scoring=scoring, norm_topk_prob=renormalise, num_experts_per_tok=3)
    x = rows(40)
    logits = x @ moe.router.T  # [T, E]
    expert_ids, weights = moe.route(x)
    want_ids = logits.topk(3, dim=-1).indices
    assert torch.equal(expert_ids, want_ids)
    chosen = logits.gather(1, want_ids)
    if scoring == TOPK_SOFTMAX:  # gpt-oss: softmax over the k chosen logits
        want = chosen.softmax(dim=-1)
    else:  # Qwen3-MoE / OLMoE: softmax over all experts, then top-k
        want = logits.softmax(dim=-1).gather(1, want_ids)
        if renormalise:
            want = want / want.sum(dim=-1, keepdim=True)
    torch.testing.assert_close(weights, want, rtol=1e-5, atol=1e-6)
    sums_to_one = renormalise or scoring == TOPK_SOFTMAX
    assert bool((weights.sum(dim=-1) - 1).abs().max() < 1e-6) == sums_to_one


def reference(moe: MoeBlock, x: torch.Tensor) -> torch.Tensor:
    """Token by token: each of its k experts' SwiGLU times its weight, summed."""
    expert_ids, weights = moe.route(x)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for rank in range(moe.top_k):
            e = int(expert_ids[t, rank])
            gate, up = F.linear(x[t], moe.gate_up[e]).chunk(2)
            out[t] += weights[t, rank] * F.linear(F.silu(gate) * up, moe.down[e])
    return out


def test_the_grouped_experts_equal_a_token_by_token_reference():
    moe = block()
    x = rows(50)
    torch.testing.assert_close(moe(x, _swiglu), reference(moe, x), rtol=1e-5, atol=1e-5)


def test_a_shared_expert_adds_its_gated_output_to_every_token():
    """Qwen2-MoE: sigmoid(x . w) times a SwiGLU MLP every token runs."""
    moe = block(shared_expert_intermediate_size=48)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for weight in (moe.shared.gate_up, moe.shared.down, moe.shared.gate):
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.1)
    x = rows(30)
    gate, up = F.linear(x, moe.shared.gate_up).chunk(2, dim=-1)
    shared = torch.sigmoid(x @ moe.shared.gate.T) * F.linear(F.silu(gate) * up, moe.shared.down)
    want = reference(moe, x) + shared
    torch.testing.assert_close(moe(x, _swiglu), want, rtol=1e-5, atol=1e-5)


def test_a_row_gets_the_bits_it_has_alone_in_any_batch():
    """bfloat16 with the CPU's own SwiGLU kernel, at widths where the matmuls'
    blocking changes with the row count (this test fails without the tiles):
    the rows routed to an expert change with the batch."""
    moe = block(torch.bfloat16, hidden_size=512, moe_intermediate_size=768)
    swiglu = silu_mul_kernel(torch.bfloat16) or _swiglu
    x = rows(200, torch.bfloat16, hidden=512)
    alone = torch.cat([moe(x[i : i + 1], swiglu) for i in range(len(x))])
    for start, count in ((0, 200), (3, 4), (17, 31), (100, 64), (199, 1)):
        assert torch.equal(moe(x[start : start + count], swiglu), alone[start : start + count])
    shuffled = torch.randperm(200, generator=torch.Generator().manual_seed(3))
    assert torch.equal(moe(x[shuffled], swiglu), alone[shuffled])


def test_a_token_reads_only_the_experts_it_chose():
    moe = block()
    x = rows(1)
    expert_ids, _ = moe.route(x)
    want = moe(x, _swiglu)
    with torch.no_grad():
        for e in set(range(EXPERTS)) - set(expert_ids[0].tolist()):
            moe.gate_up[e].fill_(float("nan"))
            moe.down[e].fill_(float("nan"))
    assert torch.equal(moe(x, _swiglu), want)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_experts": 0}, "num_experts must be positive, got 0"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok 9 must be between 1 and num_experts 8"),
        ({"num_experts_per_tok": 0}, "num_experts_per_tok 0 must be between 1"),
        ({"moe_intermediate_size": 0}, "moe_intermediate_size must be positive"),
        ({"router_scoring": "sigmoid"}, "unsupported expert routing 'sigmoid'"),
        ({"shared_expert_intermediate_size": -1}, "shared_expert_intermediate_size must not be"),
    ],
)
def test_an_expert_count_or_routing_the_block_does_not_run_is_one_line(changes, message):
    with pytest.raises(ModelLoadError, match=message):
        check_experts(dataclasses.replace(CONFIG, **changes))
    with pytest.raises(ModelLoadError, match=message):
        MoeBlock(dataclasses.replace(CONFIG, **changes), torch.float32, "cpu")
