"""The prefill attention kernels: prefill_attention.c (bfloat16, AVX512-BF16)
and prefill_attention_amx.c (the same on AMX-BF16 tiles), one wrapper.

An optimisation only, as every kernel here: each getter returns None where
its kernel cannot run (no compiler, `SLUICE_NATIVE_KERNELS=0`, no
AVX512-BF16 or no AMX tiles, another dtype), and the caller keeps torch's
flash attention. Which one serves which prompt lengths: kernel_plan.py.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor

from sluice.models.native import _library

# The head sizes the kernel is built for.
HEAD_DIMS = (64, 128)


@cache
def prefill_attention_kernel(dtype: torch.dtype):
    """attention(q [L, Hq, D], keys [S, Hkv, D], values [S, Hkv, D], scale) -> [L, Hq, D]:
    causal, the L queries being the last L of the S positions; None: no kernel."""
    return _kernel(dtype, "prefill_attention_bf16", "prefill_attention_available")


@cache
def prefill_attention_amx_kernel(dtype: torch.dtype):
    """The same attention on AMX-BF16 tiles (prefill_attention_amx.c); None
    where the CPU or the OS grants no AMX tiles. A query's result depends
    only on its own q and the keys, not on how its prompt was chunked."""
    return _kernel(dtype, "prefill_attention_amx_bf16", "prefill_attention_amx_available")


def _kernel(dtype: torch.dtype, name: str, available: str):
    """The wrapper of the library's `name` (prefill_attention_bf16's
    arguments), or None where `available` says it cannot run."""
    if dtype != torch.bfloat16:
        return None
    library = _library()
    if library is None or not getattr(library, available)():
        return None
    function = getattr(library, name)

    def attention(q: Tensor, keys: Tensor, values: Tensor, scale: float) -> Tensor:
        num_queries, num_heads, head_dim = q.shape
        num_keys, num_kv_heads, _ = keys.shape
        for x in (q, keys, values):
            assert x.stride(2) == 1 and x.stride(1) == head_dim, "heads and dims contiguous"
        out = torch.empty((num_queries, num_heads, head_dim), dtype=torch.bfloat16)
        status = function(
            q.data_ptr(), q.stride(0), keys.data_ptr(), keys.stride(0), values.data_ptr(),
            values.stride(0), num_queries, num_keys, num_heads, num_kv_heads, head_dim, scale,
            out.data_ptr(),
        )  # fmt: skip
        if status != 0:
            raise ValueError("prefill attention: unsupported shape, or no memory")
        return out

    return attention
