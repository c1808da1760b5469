"""The RoPE-and-cache-write kernel of rope_kv.c (bfloat16).

An optimisation only, as every kernel here: `rope_write_kv_kernel` returns
None where it cannot run (no compiler, `SLUICE_NATIVE_KERNELS=0`, another
dtype), and the model keeps its torch path (`RopeAngles.rotate`, then
attention's `_write_kv`), which computes the same rotation with bfloat16
angles and roundings after each op instead of float32 angles and one
rounding at the end.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor

from sluice.models import kv_int8
from sluice.models.native import _library


@cache
def rope_write_kv_kernel(dtype: torch.dtype):
    """rope_write_kv(qkv [T, Hq + 2 Hkv, D], num_heads, cos [T, D/2] f32, sin [T, D/2] f32,
    kv_cache [2, blocks, block_size, Hkv, D], slot_mapping [T] int64)
    -> (q [T, Hq, D], k [T, Hkv, D]) rotated; k and v written at the slots (quantized
    into an int8 pool, sluice/models/kv_int8.py). None: no kernel."""
    if dtype != torch.bfloat16:
        return None
    library = _library()
    if library is None:
        return None
    function = library.rope_write_kv_bf16

    def rope_write_kv(
        qkv: Tensor, num_heads: int, cos: Tensor, sin: Tensor, kv_cache: Tensor,
        slot_mapping: Tensor,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        tokens, width, head_dim = qkv.shape
        num_kv_heads = (width - num_heads) // 2
        assert qkv.stride(2) == 1 and qkv.stride(1) == head_dim, "heads and dims contiguous"
        assert cos.dtype == sin.dtype == torch.float32, "float32 angles"
        assert cos.is_contiguous() and sin.is_contiguous() and kv_cache.is_contiguous()
        assert slot_mapping.dtype == torch.int64 and slot_mapping.is_contiguous()
        if kv_cache.dtype == torch.int8:  # the kernel writes bf16 rows: quantize a copy
            rows = torch.empty((2, 1, tokens, num_kv_heads, head_dim), dtype=torch.bfloat16)
            q, k = rope_write_kv(qkv, num_heads, cos, sin, rows, torch.arange(tokens))
            kv_int8.write_kv(kv_cache, rows[0, 0], rows[1, 0], slot_mapping)
            return q, k
        two, num_blocks, block_size = kv_cache.shape[:3]
        q = torch.empty((tokens, num_heads, head_dim), dtype=torch.bfloat16)
        k = torch.empty((tokens, num_kv_heads, head_dim), dtype=torch.bfloat16)
        status = function(
            qkv.data_ptr(), tokens, qkv.stride(0), num_heads, num_kv_heads, head_dim,
            cos.data_ptr(), sin.data_ptr(), kv_cache.data_ptr(), num_blocks * block_size,
            slot_mapping.data_ptr(), q.data_ptr(), k.data_ptr(),
        )  # fmt: skip
        if status != 0:
            raise ValueError("rope_write_kv: a slot is outside the cache")
        return q, k

    return rope_write_kv
