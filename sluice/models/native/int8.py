"""W8A8's native kernels (sluice/models/int8_activations.py): the row passes
of int8_rows.c and the packed VNNI matmul of int8_gemm.c, which hands large
steps to int8_amx.c's AMX-INT8 tiles where the CPU has them (the same exact
sums through the same epilogue: the same bits).

Invariant, as for every kernel here: an optimisation only. Each function
returns None where the kernel cannot run (no compiler, `SLUICE_NATIVE_KERNELS=0`,
no AVX512-VNNI for the matmul, another dtype), and the caller keeps torch's
path, which computes the same values (tests compare them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor

from sluice.models.native import _library

# Most columns `quantize_rows` takes (its stack buffer in int8_rows.c).
MAX_QUANTIZE_COLUMNS = 2048

# Code rows (A13: two per activation row) from which the AMX kernel beat
# VNNI on every embedded-model shape on the 2-core Sapphire Rapids VM it was
# measured on (interleaved runs: AMX/VNNI 0.58-0.85 at 8 code rows, 0.86-1.17
# at 4, 1.07-1.71 at 1): what callers pass as `amx_min_rows` until a kernel
# plan measures it at load.
AMX_MIN_ROWS = 8


@cache
def int8_row_kernels(dtype: torch.dtype):
    """(quantize, dequantize) for W8A8 matmuls on `dtype` rows; None: no kernel.

    quantize(x [T, K], inv_smooth [K] f32) -> (q [T, K] int8, scales [T] f32), K <= 2048;
    dequantize(acc [T, N] int32, scales [T], col_scales [N] f32, bias [N] | None) -> [T, N].
    """
    if dtype not in (torch.bfloat16, torch.float32):
        return None
    library = _library()
    if library is None:
        return None
    is_bf16 = dtype == torch.bfloat16
    quantize_rows = library.quantize_rows_bf16 if is_bf16 else library.quantize_rows_f32
    dequantize_rows = library.dequantize_rows_bf16 if is_bf16 else library.dequantize_rows_f32

    def quantize(x: Tensor, inv_smooth: Tensor) -> tuple[Tensor, Tensor]:
        rows, cols = x.shape
        assert x.stride(1) == 1 and cols <= MAX_QUANTIZE_COLUMNS, "rows contiguous, K <= 2048"
        q = torch.empty((rows, cols), dtype=torch.int8)
        scales = torch.empty(rows, dtype=torch.float32)
        quantize_rows(x.data_ptr(), rows, cols, x.stride(0), inv_smooth.data_ptr(),
                      q.data_ptr(), scales.data_ptr())  # fmt: skip
        return q, scales

    def dequantize(acc: Tensor, scales: Tensor, col_scales: Tensor, bias: Tensor | None) -> Tensor:
        rows, cols = acc.shape
        assert acc.is_contiguous() and (bias is None or bias.dtype == dtype)
        out = torch.empty((rows, cols), dtype=dtype)
        dequantize_rows(acc.data_ptr(), rows, cols, scales.data_ptr(), col_scales.data_ptr(),
                        None if bias is None else bias.data_ptr(), out.data_ptr())  # fmt: skip
        return out

    return quantize, dequantize


@dataclass(slots=True, frozen=True)
class PackedInt8Weights:
    """W [N, K] int8 in int8_gemm.c's layout, with its compensation (128 * row sums)."""

    packed: Tensor  # int8, opaque layout
    compensation: Tensor  # [N] int32
    out_features: int  # N
    in_features: int  # K


@dataclass(slots=True, frozen=True)
class Int8GemmKernels:
    """int8_gemm.c's functions (`int8_gemm_kernels`).

    `gemm` and `linear` take a keyword `amx_min_rows` (default 0: VNNI
    only): from that many code rows on (A13: two per row), the AMX kernel
    where `has_amx` and K % 64 == 0. Either way the same bits.
    """

    # w [N, K] int8, K % 4 == 0 -> PackedInt8Weights.
    pack: Callable[[Tensor], PackedInt8Weights]
    # (q [T, K] int8, scales [T] f32, weights, col_scales [N] f32, bias [N] bf16 | None)
    #   -> [T, N] bf16: round_bf16(q @ W^T * scales[:, None] * col_scales) (+ bias).
    gemm: Callable[..., Tensor]
    # (x [T, K] bf16 rows contiguous, inv_smooth [K] f32, weights, col_scales, bias,
    #  pairs) -> [T, N] bf16: int8_row_kernels' quantize, then gemm, in one call;
    # `pairs`: A13 codes, each row as two int8 rows (int8_rows.c).
    linear: Callable[..., Tensor]
    # The CPU has AMX-INT8 and Linux granted its tile state to this process.
    has_amx: bool


@cache
def int8_gemm_kernels() -> Int8GemmKernels | None:
    """The packed VNNI matmul; None where the CPU has no AVX512-VNNI or there are no kernels."""
    library = _library()
    if library is None or not library.int8_gemm_available():
        return None

    def pack(w: Tensor) -> PackedInt8Weights:
        n, k = w.shape
        assert w.dtype == torch.int8 and k % 4 == 0, "int8 weights, K a multiple of 4"
        w = w.contiguous()
        packed = torch.empty(library.int8_packed_bytes(n, k), dtype=torch.int8)
        compensation = torch.empty(n, dtype=torch.int32)
        status = library.pack_int8_weights(w.data_ptr(), n, k, packed.data_ptr(),
                                           compensation.data_ptr())  # fmt: skip
        assert status == 0
        return PackedInt8Weights(packed, compensation, n, k)

    def gemm(
        q: Tensor, scales: Tensor, weights: PackedInt8Weights, col_scales: Tensor,
        bias: Tensor | None, *, amx_min_rows: int = 0,
    ) -> Tensor:  # fmt: skip
        rows, k = q.shape
        assert q.is_contiguous() and k == weights.in_features
        assert bias is None or bias.dtype == torch.bfloat16
        n = weights.out_features
        out = torch.empty((rows, n), dtype=torch.bfloat16)
        library.int8_gemm_bf16(
            q.data_ptr(), scales.data_ptr(), rows, k, weights.packed.data_ptr(),
            weights.compensation.data_ptr(), col_scales.data_ptr(),
            None if bias is None else bias.data_ptr(), n, out.data_ptr(), 0, amx_min_rows,
        )  # fmt: skip
        return out

    linear_bf16 = library.int8_linear_bf16

    def linear(
        x: Tensor, inv_smooth: Tensor, weights: PackedInt8Weights, col_scales: Tensor,
        bias: Tensor | None, pairs: bool = False, *, amx_min_rows: int = 0,
    ) -> Tensor:  # fmt: skip
        rows, k = x.shape
        assert x.stride(1) == 1 and x.dtype == torch.bfloat16 and k == weights.in_features
        n = weights.out_features
        out = torch.empty((rows, n), dtype=torch.bfloat16)
        status = linear_bf16(
            x.data_ptr(), rows, k, x.stride(0), inv_smooth.data_ptr(), weights.packed.data_ptr(),
            weights.compensation.data_ptr(), col_scales.data_ptr(),
            None if bias is None else bias.data_ptr(), n, out.data_ptr(), int(pairs),
            amx_min_rows,
        )  # fmt: skip
        if status != 0:
            raise MemoryError("int8_linear_bf16: no memory for the quantized rows")
        return out

    return Int8GemmKernels(pack, gemm, linear, bool(library.int8_amx_available()))
