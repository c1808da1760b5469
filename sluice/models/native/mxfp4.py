"""MXFP4 matrices on the native kernel of mxfp4_gemm.c (gpt-oss's experts in 4 bits).

A matrix W [out, in] is its MXFP4 groups as `mxfp4_groups` lays them out:
uint8 [out, in / 32, 17], per group of 32 inputs the E8M0 exponent byte and
the 16 code bytes of the checkpoint (the file's 4.25 bits a weight).
`mxfp4_matmul` multiplies rows by it: activations quantized to int8 per
group inside the kernel, exact integer sums (the doubled E2M1 values are
integers), one float step per group in a fixed order, so a row's bits never
depend on the rows beside it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sluice.models.native import _library

GROUP, GROUP_BYTES = 32, 17


def mxfp4_available() -> bool:
    """Whether the kernel runs here (the native library built)."""
    library = _library()
    return library is not None and bool(library.mxfp4_gemm_available())


def mxfp4_groups(blocks: Tensor, scales: Tensor) -> Tensor:
    """[..., G, 16] code bytes and [..., G] exponents -> the kernel's [..., G, 17]."""
    return torch.cat([scales.unsqueeze(-1), blocks], dim=-1).contiguous()


def mxfp4_matmul(x: Tensor, groups: Tensor, out: Tensor | None = None) -> Tensor:
    """x [T, in] (bfloat16 or float32) @ W^T -> [T, out] in x's dtype, W as
    `groups` [out, in / 32, 17]; `out`, when given, is written instead (rows
    may be strided, x's dtype)."""
    library = _library()
    assert library is not None, "mxfp4_matmul needs the native library"
    assert x.dtype in (torch.bfloat16, torch.float32), f"no mxfp4 kernel for {x.dtype}"
    assert (
        groups.dtype == torch.uint8 and groups.is_contiguous() and groups.shape[-1] == GROUP_BYTES
    )
    x = x.contiguous()
    rows, (features, num_groups, _) = x.shape[0], groups.shape
    assert x.shape[1] == num_groups * GROUP, "x's width is not the matrix's"
    if out is None:
        out = torch.empty((rows, features), dtype=x.dtype)
    assert out.dtype == x.dtype and out.stride(1) == 1 and out.shape == (rows, features)
    is_bf16 = int(x.dtype == torch.bfloat16)
    status = library.mxfp4_gemm(
        x.data_ptr(), is_bf16, rows, x.shape[1], groups.data_ptr(), features, out.data_ptr(),
        is_bf16, out.stride(0),
    )  # fmt: skip
    assert status == 0, "mxfp4_gemm refused its input (out of memory)"
    return out
