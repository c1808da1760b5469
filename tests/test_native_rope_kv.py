"""The RoPE-and-cache-write kernel (native/rope_kv.c) against exact arithmetic.

q and k come back rotated within one bfloat16 rounding of the exact rotation
(float32 angles), closer than torch's bfloat16 path; the rotated k and the
unrotated v land at their slots of the paged cache and nowhere else; the
input may be a strided view of the fused projection; a slot outside the
cache raises and writes nothing; other dtypes get no kernel, and a bfloat16
CPU model takes the kernel with float32 angles.
"""

from __future__ import annotations

import pytest
import torch

from sluice.models.native import find_compiler
from sluice.models.native.rope import rope_write_kv_kernel
from sluice.models.rope_norm import RopeAngles

# Skipped only where no compiler exists (test_models_native.py requires the build).
requires_kernel = pytest.mark.skipif(find_compiler() is None, reason="no C compiler here")
HEADS, KV_HEADS, DIM = 9, 3, 64


def angles(num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, DIM, 2, dtype=torch.float64) / DIM))
    table = torch.outer(torch.arange(num_positions, dtype=torch.float64), inv_freq)
    return table.cos(), table.sin()  # float64 [num_positions, DIM // 2]


@requires_kernel
@pytest.mark.parametrize("tokens", [1, 5, 40])
def test_rotation_and_cache_writes(tokens):
    generator = torch.Generator().manual_seed(tokens)
    wide = torch.randn(tokens, HEADS + 2 * KV_HEADS + 2, DIM, generator=generator) * 3
    qkv = wide.to(torch.bfloat16)[:, 1 : 1 + HEADS + 2 * KV_HEADS]  # a strided view
    positions = torch.randperm(2000, generator=generator)[:tokens]
    cos64, sin64 = (t[positions] for t in angles(2000))
    cache = torch.zeros(2, 8, 16, KV_HEADS, DIM, dtype=torch.bfloat16)
    slots = torch.randperm(128, generator=generator)[:tokens]
    kernel = rope_write_kv_kernel(torch.bfloat16)
    q, k = kernel(qkv, HEADS, cos64.float(), sin64.float(), cache, slots)
    x = qkv[:, : HEADS + KV_HEADS].double()
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos64.float().double()[:, None], sin64.float().double()[:, None]
    exact = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    got = torch.cat((q, k), dim=1).double()
    # Within one bfloat16 rounding of exact (2^-8 relative, a little slack for float32).
    assert ((got - exact).abs() <= exact.abs() * 2**-8 + 1e-6).all()
    # Closer than torch's path with bfloat16 angles.
    table = [t.to(torch.bfloat16) for t in angles(2000)]
    torch_path = RopeAngles.at(*table, positions).rotate(qkv[:, : HEADS + KV_HEADS]).double()
    assert (got - exact).abs().mean() < (torch_path - exact).abs().mean()
    flat = cache.view(2, 128, KV_HEADS, DIM)
    assert torch.equal(flat[0, slots], k) and torch.equal(
        flat[1, slots], qkv[:, HEADS + KV_HEADS :]
    )
    untouched = torch.ones(128, dtype=torch.bool)
    untouched[slots] = False
    assert not flat[:, untouched].any()


@requires_kernel
def test_a_slot_outside_the_cache_raises_and_writes_nothing():
    qkv = torch.randn(2, HEADS + 2 * KV_HEADS, DIM).to(torch.bfloat16)
    cos, sin = (t[:2].float() for t in angles(2))
    cache = torch.zeros(2, 2, 16, KV_HEADS, DIM, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="outside the cache"):
        rope_write_kv_kernel(torch.bfloat16)(qkv, HEADS, cos, sin, cache, torch.tensor([0, 32]))
    assert not cache.any()


@requires_kernel
def test_a_bfloat16_cpu_model_takes_the_kernel(tiny_loaded):
    from sluice.models.llama import LlamaForCausalLM

    assert rope_write_kv_kernel(torch.float32) is None
    model = LlamaForCausalLM(tiny_loaded.model_config, torch.bfloat16, torch.device("cpu"))
    assert all(layer.rope_write_kv is not None for layer in model.layers)
    assert model.native_rope and model.rope_cos.dtype == model.rope_sin.dtype == torch.float32
    invariant = LlamaForCausalLM(
        tiny_loaded.model_config, torch.bfloat16, torch.device("cpu"), batch_invariant=True
    )
    assert not invariant.native_rope and invariant.rope_cos.dtype == torch.bfloat16
