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


def mxfp4_moe(
    x: Tensor, stacks: tuple[Tensor, Tensor], biases: tuple[Tensor, Tensor], expert_ids: Tensor,
    weights: Tensor, alpha: float, limit: float,
) -> Tensor:  # fmt: skip
    """x [T, H] (bfloat16 or float32), the experts' gate/up and down groups
    ([E, 2 I, H / 32, 17], [E, H, I / 32, 17]) and biases ([E, 2 I], [E, H],
    x's dtype), each token's experts [T, k] and weights [T, k] -> [T, H]
    float32: sum over ranks r, in order, of weight times expert(x), expert =
    down(clamped_swiglu(gate_up x + b) ) + b (moe_mxfp4.c). One call for every
    chosen expert of every row; ValueError for an expert id outside [0, E)."""
    library = _library()
    assert library is not None, "mxfp4_moe needs the native library"
    assert x.dtype in (torch.bfloat16, torch.float32), f"no mxfp4 kernel for {x.dtype}"
    (gate_up, down), (gate_up_bias, down_bias) = stacks, biases
    assert all(t.is_contiguous() for t in (gate_up, down, gate_up_bias, down_bias))
    assert gate_up_bias.dtype == down_bias.dtype == x.dtype, "biases in x's dtype"
    x = x.contiguous()
    experts, width = gate_up.shape[0], down.shape[2] * GROUP  # E, I
    assert gate_up.shape[1] == 2 * width and x.shape[1] == gate_up.shape[2] * GROUP
    expert_ids = expert_ids.to(torch.int64).contiguous()
    weights = weights.to(torch.float32).contiguous()
    assert expert_ids.shape == weights.shape and expert_ids.shape[0] == x.shape[0]
    out = torch.empty(x.shape, dtype=torch.float32)
    status = library.mxfp4_moe(
        x.data_ptr(), int(x.dtype == torch.bfloat16), x.shape[0], x.shape[1], width,
        gate_up.data_ptr(), down.data_ptr(), gate_up_bias.data_ptr(), down_bias.data_ptr(),
        experts, expert_ids.data_ptr(), weights.data_ptr(), expert_ids.shape[1], alpha, limit,
        out.data_ptr(),
    )  # fmt: skip
    if status != 0:
        raise ValueError(f"mxfp4_moe refused: an expert id outside [0, {experts}), or no memory")
    return out
