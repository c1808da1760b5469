"""Cases and checks shared by the prefill attention kernels' tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def case(num_queries, num_keys, heads, head_dim, seed=0):
    num_heads, num_kv_heads = heads
    generator = torch.Generator().manual_seed(seed)
    qkv = torch.randn(num_keys, num_heads + 2 * num_kv_heads, head_dim, generator=generator)
    qkv = qkv.to(torch.bfloat16)  # views into one tensor, as the model's q, k and v are
    q = qkv[num_keys - num_queries :, :num_heads]
    k = qkv[:, num_heads : num_heads + num_kv_heads].contiguous()  # as after RoPE
    v = qkv[:, num_heads + num_kv_heads :]
    return q, k, v


def reference(q, k, v, scale, dtype):
    num_queries, num_keys = q.shape[0], k.shape[0]
    query_pos = torch.arange(num_keys - num_queries, num_keys)[:, None]
    mask = torch.arange(num_keys)[None, :] <= query_pos
    out = F.scaled_dot_product_attention(
        *(x.transpose(0, 1)[None].to(dtype) for x in (q, k, v)),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1).float()


def assert_as_close_as_torch(kernel, num_queries: int, num_keys: int, heads, head_dim: int):
    """The kernel's error against float32 attention is about torch's bfloat16 one."""
    q, k, v = case(num_queries, num_keys, heads, head_dim, seed=num_queries * 7 + num_keys)
    got = kernel(q, k, v, 0.125).float()
    exact = reference(q, k, v, 0.125, torch.float32)
    torch_error = (reference(q, k, v, 0.125, torch.bfloat16) - exact).abs()
    error = (got - exact).abs()
    assert got.shape == (num_queries, heads[0], head_dim)
    assert error.max() <= 2 * torch_error.max() + 2**-8
    assert error.mean() <= 1.5 * torch_error.mean() + 1e-4
