"""GGUF-block matrices on the native kernel of qblock_gemm.c.

A `QBlockMatrix` is one weight [out, in] packed by `models/qblock_pack.py`
from the file's block codes: about the file's size, never a float copy.
`qblock_matmul` multiplies rows by it (activations quantized to int8 per
super-block inside the kernel, exact integer sums, one float step per
super-block: a row's bits never depend on the rows beside it);
`qblock_rows` reads whole weight rows back as float32, exactly the file's
values (the embedding lookup of a quantized or tied table).

Unlike the other kernels here, these have no torch twin: a GGUF kept in 4
bits needs the kernel (AVX512-VNNI and a C compiler). `qblock_available`
says whether it runs; the loader refuses the 4-bit path where it does not.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
from torch import Tensor

from sluice.models.block_codes import BlockCodes, BlockFormat
from sluice.models.native import _library
from sluice.models.native.abi import QBlockExpert, QBlockPart
from sluice.models.qblock_pack import pack_codes


@dataclass(frozen=True, slots=True)
class QBlockMatrix:
    """W [out_features, in_features] as packed block codes."""

    packed: Tensor  # uint8, qblock_pack's layout
    format: BlockFormat
    out_features: int
    in_features: int

    @classmethod
    def from_codes(cls, codes: BlockCodes) -> QBlockMatrix:
        rows, cols = codes.q.shape
        return cls(torch.from_numpy(pack_codes(codes)), codes.format, rows, cols)

    def _format_args(self) -> tuple[int, int, int, int, int, int]:
        fmt = self.format
        return (fmt.bits, fmt.sub_block, fmt.super_block, int(fmt.has_scales),
                int(fmt.has_min), fmt.offset)  # fmt: skip


def qblock_available() -> bool:
    """Whether the kernel runs here (a built library on an AVX512-VNNI CPU)."""
    library = _library()
    return library is not None and bool(library.qblock_gemm_available())


def qblock_matmul(x: Tensor, matrix: QBlockMatrix, out: Tensor | None = None) -> Tensor:
    """x [T, in] (bfloat16 or float32) @ W^T -> [T, out] in x's dtype.

    `out`, when given, is written instead: a [T, out_features] view whose rows
    may be strided (a column slice of a wider output), x's dtype.
    """
    library = _library()
    assert library is not None, "qblock_matmul needs the native library"
    assert x.dtype in (torch.bfloat16, torch.float32), f"no qblock kernel for {x.dtype}"
    x = x.contiguous()
    rows = x.shape[0]
    if out is None:
        out = torch.empty((rows, matrix.out_features), dtype=x.dtype)
    assert out.dtype == x.dtype and out.stride(1) == 1, "out: x's dtype, contiguous rows"
    assert x.shape[1] == matrix.in_features and out.shape == (rows, matrix.out_features)
    is_bf16 = int(x.dtype == torch.bfloat16)
    status = library.qblock_gemm(
        x.data_ptr(), is_bf16, rows, matrix.in_features, matrix.packed.data_ptr(),
        matrix.out_features, *matrix._format_args(), out.data_ptr(), is_bf16, out.stride(0),
    )  # fmt: skip
    assert status == 0, f"qblock_gemm refused {matrix.format.name}"
    return out


def part_array(matrices: list[QBlockMatrix]) -> ctypes.Array:
    """The matrices as a C array of QBlockPart (their packed tensors must outlive it)."""
    parts = (QBlockPart * len(matrices))()
    for struct, matrix in zip(parts, matrices, strict=True):
        fmt = matrix.format
        struct.packed = matrix.packed.data_ptr()
        struct.out_features = matrix.out_features
        struct.bits, struct.sub, struct.super_block = fmt.bits, fmt.sub_block, fmt.super_block
        struct.has_scales, struct.has_min = int(fmt.has_scales), int(fmt.has_min)
        struct.offset = fmt.offset
    return parts


def qblock_matmul_parts(x: Tensor, parts: ctypes.Array, out: Tensor) -> Tensor:
    """x [T, in] @ W^T into `out` [T, sum of the parts' out_features] (x's dtype,
    rows contiguous), W the parts' rows one after another (`part_array`): one
    call, the rows quantized once for every part (a fused q/k/v or gate/up)."""
    library = _library()
    assert library is not None, "qblock_matmul_parts needs the native library"
    assert x.dtype in (torch.bfloat16, torch.float32), f"no qblock kernel for {x.dtype}"
    x = x.contiguous()
    assert out.dtype == x.dtype and out.stride(1) == 1 and out.shape[0] == x.shape[0]
    assert out.shape[1] == sum(part.out_features for part in parts), "out: the parts' width"
    is_bf16 = int(x.dtype == torch.bfloat16)
    status = library.qblock_linear(
        x.data_ptr(), is_bf16, x.shape[0], x.shape[1], parts, len(parts), out.data_ptr(),
        is_bf16, out.stride(0),
    )  # fmt: skip
    assert status == 0, "qblock_linear refused a part's format, or had no memory"
    return out


def expert_array(experts: list[tuple[ctypes.Array, ctypes.Array]]) -> ctypes.Array:
    """Each expert's (gate/up parts, down parts) (`part_array`s, which must
    outlive it) as a C array of QBlockExpert: an MoE layer's experts."""
    array = (QBlockExpert * len(experts))()
    for struct, (gate_up, down) in zip(array, experts, strict=True):
        struct.gate_up = ctypes.cast(gate_up, ctypes.POINTER(QBlockPart))
        struct.num_gate_up = len(gate_up)
        struct.down = ctypes.cast(down, ctypes.POINTER(QBlockPart))
        struct.num_down = len(down)
    return array


def qblock_moe(
    x: Tensor, experts: ctypes.Array, inter: int, expert_ids: Tensor, weights: Tensor
) -> Tensor:
    """x [T, H] (bfloat16 or float32), each token's experts [T, k] and weights
    [T, k] float32 -> [T, H] float32: sum over ranks r, in order, of weight
    times expert(x), expert = down(silu(gate x) * up x) (moe_qblock.c). One
    call for every chosen expert of every row."""
    library = _library()
    assert library is not None, "qblock_moe needs the native library"
    assert x.dtype in (torch.bfloat16, torch.float32), f"no qblock kernel for {x.dtype}"
    x = x.contiguous()
    expert_ids = expert_ids.to(torch.int64).contiguous()
    weights = weights.to(torch.float32).contiguous()
    assert expert_ids.shape == weights.shape and expert_ids.shape[0] == x.shape[0]
    out = torch.empty(x.shape, dtype=torch.float32)
    status = library.qblock_moe(
        x.data_ptr(), int(x.dtype == torch.bfloat16), x.shape[0], x.shape[1], inter, experts,
        len(experts), expert_ids.data_ptr(), weights.data_ptr(), expert_ids.shape[1],
        out.data_ptr(),
    )  # fmt: skip
    if status != 0:
        raise ValueError(f"qblock_moe refused: an expert id outside [0, {len(experts)}), "
                         "experts of different formats, or no memory")  # fmt: skip
    return out


def qblock_rows(matrix: QBlockMatrix, ids: Tensor) -> Tensor:
    """The float32 weight rows `ids` [N] -> [N, in_features], the file's exact values."""
    library = _library()
    assert library is not None, "qblock_rows needs the native library"
    ids = ids.to(torch.int64).contiguous()
    out = torch.empty((ids.numel(), matrix.in_features), dtype=torch.float32)
    status = library.qblock_rows(
        matrix.packed.data_ptr(), matrix.out_features, matrix.in_features,
        *matrix._format_args(), ids.data_ptr(), ids.numel(), out.data_ptr(),
    )  # fmt: skip
    if status != 0:
        raise IndexError(f"a row id outside [0, {matrix.out_features})")
    return out
