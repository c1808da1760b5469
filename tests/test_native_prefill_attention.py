"""The prefill flash-attention kernel (native/prefill_attention.c) against exact attention.

Causal over the chunk with cached context before it (queries are the last L
of S positions): whole prompts and chunks behind context, lengths on and off
its 8-query blocks and 16-key tiles, a single token, grouped-query and plain
heads, heads of 64 and 128, strided views as the model passes them (keys contiguous, as RoPE leaves
them, values a view). Each
output is within what torch's own bfloat16 attention errs by (float32
attention on the same bfloat16 inputs is the reference). Other head sizes
and dtypes get no kernel; the model's prefill takes the kernel's path.
"""

from __future__ import annotations

import pytest
import torch

from sluice.loader.choices import cpu_flags
from sluice.models import attention
from sluice.models.native import find_compiler
from sluice.models.native.prefill import prefill_attention_kernel
from tests.prefill_attention_cases import assert_as_close_as_torch, case

# Skipped only where the kernel cannot exist: no compiler, or no AVX512-BF16.
requires_kernel = pytest.mark.skipif(
    find_compiler() is None or "avx512_bf16" not in cpu_flags(),
    reason="no C compiler or no AVX512-BF16 here",
)


@requires_kernel
@pytest.mark.parametrize(
    ("num_queries", "num_keys"),
    [(1, 1), (5, 5), (8, 8), (37, 37), (130, 130), (1, 40), (20, 100), (17, 33), (64, 300)],
)
@pytest.mark.parametrize(("heads", "head_dim"), [((9, 3), 64), ((8, 1), 128), ((4, 4), 128)])
def test_the_kernel_is_as_close_to_exact_as_torchs_bfloat16_attention(
    num_queries, num_keys, heads, head_dim
):
    assert_as_close_as_torch(prefill_attention_kernel(torch.bfloat16), num_queries, num_keys,
                             heads, head_dim)  # fmt: skip


@requires_kernel
def test_other_shapes_and_dtypes_get_no_kernel_or_an_error():
    assert prefill_attention_kernel(torch.float32) is None
    q, k, v = case(4, 4, (4, 2), 96)
    with pytest.raises(ValueError, match="unsupported shape"):
        prefill_attention_kernel(torch.bfloat16)(q, k, v, 0.1)


@requires_kernel
def test_the_models_prefill_takes_the_kernel(monkeypatch):
    calls = []
    kernel = prefill_attention_kernel(torch.bfloat16)

    def counting(*args):
        calls.append(args[0].shape)
        return kernel(*args)

    monkeypatch.setattr(attention, "prefill_attention_kernel", lambda dtype: counting)
    q, k, v = case(12, 12, (9, 3), 64)
    plan = attention.PrefillPlan(0, 12, context_len=0, seq_len=12, block_ids=None)
    out = attention._prefill_attention(q, k, v, None, plan, 0.125)
    assert calls == [q.shape]
    assert torch.equal(out, kernel(q, k, v, 0.125))


@requires_kernel
def test_the_models_prefill_follows_the_kernel_plan_by_length(monkeypatch):
    from sluice.models.kernel_plan import NATIVE, TORCH, KernelPlan

    calls = []
    kernel = prefill_attention_kernel(torch.bfloat16)

    def counting(*args):
        calls.append(args[0].shape[0])
        return kernel(*args)

    monkeypatch.setattr(attention, "prefill_attention_kernel", lambda dtype: counting)
    amx = KernelPlan(((0, NATIVE), (40, TORCH)), "measured at load")
    for length in (12, 39, 40, 64):
        q, k, v = case(length, length, (9, 3), 64)
        plan = attention.PrefillPlan(0, length, context_len=0, seq_len=length, block_ids=None)
        calls.clear()
        out = attention._prefill_attention(q, k, v, None, plan, 0.125, amx)
        if length < 40:
            assert calls == [length] and torch.equal(out, kernel(q, k, v, 0.125))
        else:
            assert calls == []
            assert torch.equal(out, attention.prefill_attention_torch(q, k, v, 0.125))
    # Both kernels agree within bfloat16 rounding (the tests above bound each).
    q, k, v = case(64, 64, (9, 3), 64)
    gap = kernel(q, k, v, 0.125).float() - attention.prefill_attention_torch(q, k, v, 0.125)
    assert gap.abs().max() < 0.05
