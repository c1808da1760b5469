"""The prefill attention kernel of prefill_attention.c (bfloat16, AVX512-BF16).

An optimisation only, as every kernel here: `prefill_attention_kernel`
returns None where it cannot run (no compiler, `SLUICE_NATIVE_KERNELS=0`, no
AVX512-BF16, another dtype), and the caller keeps torch's flash attention.
"""

from __future__ import annotations

import ctypes
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
    if dtype != torch.bfloat16:
        return None
    library = _library()
    if library is None or not library.prefill_attention_available():
        return None
    function = library.prefill_attention_bf16
    int64, pointer = ctypes.c_int64, ctypes.c_void_p
    function.argtypes = [pointer, int64, pointer, int64, pointer] + [int64] * 6
    function.argtypes += [ctypes.c_float, pointer]
    function.restype = ctypes.c_int

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
