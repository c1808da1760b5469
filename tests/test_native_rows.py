"""The C row kernels (sluice/models/native/rows.c) against the torch code they replace.

- silu_mul: `F.silu(gate, inplace=True).mul_(up)` on the halves of a [T, 2 I]
  row: the same bits in bfloat16 (both roundings kept), float32 within a few
  ulp (the kernel's exp is a polynomial), for strided rows, widths that are
  not a multiple of the vector width, one row and many, and extreme inputs;
- argmax: torch.argmax's answer, including ties (the first), NaN (the first
  NaN), all -inf rows, and widths that are not a multiple of the lane count;
- the model's MLP and the greedy sampler take them, and fall back to torch
  when the kernels are switched off.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from sluice.models import native
from sluice.models.native import argmax_kernel, find_compiler, silu_mul_kernel

# Skipped only where no compiler exists (test_models_native.py requires the build).
requires_kernel = pytest.mark.skipif(find_compiler() is None, reason="no C compiler here")


def torch_swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.clone().chunk(2, dim=-1)
    return F.silu(gate, inplace=True).mul_(up)


@requires_kernel
@pytest.mark.parametrize("rows", [1, 3, 4, 64])
@pytest.mark.parametrize("inter", [1536, 7, 300])
def test_bfloat16_silu_mul_is_torch_bit_for_bit(rows, inter):
    generator = torch.Generator().manual_seed(rows * 1000 + inter)
    x = (torch.randn(rows, 2 * inter, generator=generator) * 6).to(torch.bfloat16)
    assert torch.equal(silu_mul_kernel(torch.bfloat16)(x), torch_swiglu(x))


@requires_kernel
def test_float32_silu_mul_within_a_few_ulp_and_extremes():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(16, 2 * 1536, generator=generator) * 8
    x[0, :6] = torch.tensor([0.0, -0.0, 88.0, -88.0, 200.0, -200.0])
    x[0, 1536:1542] = 1.0
    got, want = silu_mul_kernel(torch.float32)(x), torch_swiglu(x)
    torch.testing.assert_close(got, want, rtol=4e-7, atol=1e-30)
    assert got[0, 4].item() == 200.0 and abs(got[0, 5].item()) < 1e-30


@requires_kernel
def test_silu_mul_reads_strided_rows():
    """A view whose rows lie wider apart (every other row of a buffer)."""
    buffer = torch.randn(8, 2 * 96).to(torch.bfloat16)
    view = buffer[::2]
    assert view.stride(0) == 2 * 2 * 96
    assert torch.equal(silu_mul_kernel(torch.bfloat16)(view), torch_swiglu(view))


@requires_kernel
@pytest.mark.parametrize("cols", [49152, 1, 15, 16, 17, 1000])
def test_argmax_is_torch_argmax(cols):
    generator = torch.Generator().manual_seed(cols)
    x = torch.randn(9, cols, generator=generator)
    x[1] = float("-inf")  # all -inf: index 0
    if cols > 3:
        x[2, cols - 1] = x[2, cols - 3] = x[2].max() + 1  # a tie: the first
        x[3, 2] = float("nan")  # NaN wins
        x[3, cols - 1] = float("inf")
        x[4, cols - 2] = float("inf")
    assert torch.equal(argmax_kernel()(x), x.argmax(dim=-1))


@requires_kernel
def test_the_model_and_the_sampler_take_the_kernels():
    from sluice.engine.sampler import Sampler
    from sluice.models.families.registry import parse_hf_config
    from sluice.models.llama import LlamaDecoderLayer

    config = parse_hf_config(
        {"architectures": ["LlamaForCausalLM"], "vocab_size": 32, "hidden_size": 64,
         "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 64}
    )  # fmt: skip
    assert Sampler(100, frozenset(), "cpu")._argmax is argmax_kernel()
    for dtype in (torch.bfloat16, torch.float32):
        layer = LlamaDecoderLayer(config, dtype, "cpu")
        assert layer.swiglu is silu_mul_kernel(dtype)


def test_switched_off_the_callers_keep_torch(monkeypatch):
    monkeypatch.setenv("SLUICE_NATIVE_KERNELS", "0")
    for cached in (native._loaded, native.silu_mul_kernel, native.argmax_kernel):
        cached.cache_clear()
    try:
        assert silu_mul_kernel(torch.bfloat16) is None and argmax_kernel() is None
        from sluice.engine.sampler import Sampler
        from sluice.models.llama import _swiglu

        logits = torch.randn(3, 100)
        assert torch.equal(Sampler(100, frozenset(), "cpu")._argmax(logits), logits.argmax(-1))
        x = torch.randn(2, 16)
        assert torch.equal(_swiglu(x.clone()), torch_swiglu(x))
    finally:
        monkeypatch.undo()
        for cached in (native._loaded, native.silu_mul_kernel, native.argmax_kernel):
            cached.cache_clear()


def flash_halves(num_tokens: int, context_len: int, seed: int):
    """Attention of `num_tokens` bfloat16 queries over a cached context
    (every key visible) and over themselves (causal): each flash call's
    output and log-sum-exp, as attention._cached_prefix_then_chunk gets them."""
    generator = torch.Generator().manual_seed(seed)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

    def heads_first(rows: int, heads: int) -> torch.Tensor:
        x = torch.randn(rows, heads, 64, generator=generator).to(torch.bfloat16)
        return x.transpose(0, 1)[None]

    q = heads_first(num_tokens, 9)
    context = flash(q, heads_first(context_len, 3), heads_first(context_len, 3), 0.0, False,
                    scale=0.125)  # fmt: skip
    chunk = flash(q, heads_first(num_tokens, 3), heads_first(num_tokens, 3), 0.0, True,
                  scale=0.125)  # fmt: skip
    return context, chunk


@requires_kernel
@pytest.mark.parametrize(("num_tokens", "context_len"), [(1, 5), (7, 100), (300, 2000)])
def test_merge_attention_is_the_log_sum_exp_merge_rounded_once(num_tokens, context_len):
    (x, lx), (y, ly) = flash_halves(num_tokens, context_len, seed=num_tokens)
    out = torch.empty(num_tokens, 9, 64, dtype=torch.bfloat16)
    native.merge_attention_kernel()(
        x[0].transpose(0, 1), lx[0].t(), y[0].transpose(0, 1), ly[0].t(), out
    )
    # The merge in float64 from the same inputs, rounded once.
    top = torch.maximum(lx, ly).double()
    a, b = (lx - top).exp()[..., None], (ly - top).exp()[..., None]
    exact = (x.double() * a + y.double() * b) / (a + b)
    expected = exact[0].transpose(0, 1).to(torch.bfloat16)
    # Within one bfloat16 step of the exactly merged value (float32 inside).
    step = expected.float().abs().clamp(min=2**-14) * 2**-7
    assert ((out.float() - expected.float()).abs() <= step).all()
    assert (out != expected).float().mean() < 0.01


@requires_kernel
def test_a_chunk_behind_cached_context_merges_natively_or_in_torch_alike(monkeypatch):
    from sluice.models import attention

    (x, lx), (y, ly) = flash_halves(64, 700, seed=3)
    flash_outputs = iter([(x, lx), (y, ly)] * 2)
    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu",
                        lambda *args, **kwargs: next(flash_outputs))  # fmt: skip
    monkeypatch.setattr(attention, "_cached_kv", lambda *args: (None, None))
    monkeypatch.setattr(attention, "_heads_first", lambda t: t)
    q, plan = (
        torch.zeros(64, 9, 64, dtype=torch.bfloat16),
        SimpleNamespace(block_ids=None, context_len=700),
    )
    native_out = attention._cached_prefix_then_chunk(q, q, q, None, plan, 0.125)
    monkeypatch.setattr(attention, "merge_attention_kernel", lambda: None)
    torch_out = attention._cached_prefix_then_chunk(q, q, q, None, plan, 0.125)
    assert native_out.shape == torch_out.shape == (64, 9, 64)
    torch.testing.assert_close(native_out.float(), torch_out.float(), atol=2e-2, rtol=1e-2)


@requires_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_clamped_swiglu_is_torchs_clamped_swiglu(dtype):
    """gpt-oss's activation (mxfp4_experts.clamped_swiglu): the clamp bites
    both ways (limit 1.5 on values up to ~12), NaN-free, strided rows too."""
    from sluice.models.mxfp4_experts import clamped_swiglu

    generator = torch.Generator().manual_seed(3)
    buffer = (torch.randn(34, 2 * 300, generator=generator) * 4).to(dtype)
    for x in (buffer, buffer[::2]):
        got = native.clamped_swiglu_kernel(dtype)(x, 1.702, 1.5)
        want = clamped_swiglu(1.702, 1.5, x)
        if dtype == torch.bfloat16:  # each step rounded as torch's: all but rare sigmoid ties
            assert (got != want).float().mean() < 0.01
            torch.testing.assert_close(got, want, rtol=2**-7, atol=0)
        else:
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
