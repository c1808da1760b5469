"""Weight-only quantization of loaded matrices, for bandwidth-bound CPU decode.

Decoding one token reads every weight once; on CPU that read, not the
arithmetic, sets the step time, so a copy of the matrices in 8 or 4 bits
(2x or 4x fewer bytes than bfloat16) makes small batches faster. Activations
are never quantized.

- "int8": one symmetric scale per output row, w = q * scale with q in
  [-127, 127] (torch's `_weight_int8pack_mm`, as gpt-fast uses on CPU);
- "int4": one scale and one zero per group of `INT4_GROUP_SIZE` input columns,
  w = (q - 8) * scale + zero with q in [0, 15] (torch's tinygemm-style
  `_weight_int4pack_mm_for_cpu`). Groups of 32 spanning [min, max] are the
  layout of llama.cpp's Q4_1, so a model shipped in Q4_1 loses almost nothing
  more here.

These kernels have no AMX path: beyond a few tokens per step the bfloat16
oneDNN matmul is faster (`MAX_QUANTIZED_TOKENS`), so `llama.Linear` keeps a
dense copy for large batches and prefill, holding the same quantized values.

Invariants: the kernels take bfloat16 activations, scales and zeros (with
float32 activations the int8 kernel has no vectorised path and runs ~5x
slower), so a quantized layer casts its input to bfloat16 and its output back
to the input's dtype. A float32 model thus multiplies bfloat16 inputs on the
quantized path: that rounding (2^-9 relative) is below the weights' own
quantization step, so float32 is allowed. Biases are added after the kernel,
in the model dtype. CPU only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from sluice.errors import ModelLoadError

QUANTIZATION_MODES = ("int8", "int4")
# Input columns sharing one int4 scale and zero: llama.cpp's Q4_1 block.
INT4_GROUP_SIZE = 32
# Most tokens per matmul served by the quantized kernel; more go to the dense
# bfloat16 matmul. Measured on the 135M model, one thread, decode steps:
# int4 won up to batch 6 (17 vs 28 ms at batch 1), tied at 8, lost from 12;
# int8 won at batch 1-2 only (26 vs 28 ms at batch 1).
MAX_QUANTIZED_TOKENS = {"int8": 2, "int4": 8}
# The int4 kernel's tiling parameter; the CPU kernel accepts any of 2, 4, 8.
_INT4_INNER_K_TILES = 2
_KERNEL_DTYPE = torch.bfloat16


@dataclass(slots=True)
class QuantizedWeight:
    # Computes x W_q^T + b with the kernel: `Int8Linear` or `Int4Linear`.
    layer: nn.Module
    # W_q [out, in] float32: the values the kernel multiplies by, decoded from
    # the codes by the formula above (not by the kernel's packed layout).
    dequantized: Tensor


def check_quantization(mode: str | None, device: torch.device | str) -> None:
    """ModelLoadError (one line) unless `mode` is None or a mode this device can run."""
    if mode is None:
        return
    if mode not in QUANTIZATION_MODES:
        raise ModelLoadError(
            f"unknown quantization {mode!r}; choose one of {', '.join(QUANTIZATION_MODES)}"
        )
    if torch.device(device).type != "cpu":
        raise ModelLoadError(f"quantization {mode!r} runs on CPU only, not on {device}")


def quantize_weight(weight: Tensor, bias: Tensor | None, mode: str) -> QuantizedWeight:
    """`weight` [out, in] quantized as `mode` says, with a layer computing x W_q^T + b."""
    check_quantization(mode, weight.device)
    if mode == "int8":
        return Int8Linear.quantize(weight, bias)
    return Int4Linear.quantize(weight, bias)


class Int8Linear(nn.Module):
    """y = x (q * scale)^T + b: int8 rows, one bfloat16 scale per output row."""

    def __init__(self, weight_int8: Tensor, scales: Tensor, bias: Tensor | None):
        super().__init__()
        self.register_buffer("weight_int8", weight_int8)  # [out, in] int8
        self.register_buffer("scales", scales)  # [out] bfloat16
        self.bias = bias  # [out] model dtype, or None

    @classmethod
    def quantize(cls, weight: Tensor, bias: Tensor | None) -> QuantizedWeight:
        # A float32 working copy, then in-place steps: fewer passes over memory.
        q = weight.to(torch.float32, copy=True)  # [out, in]
        # The largest |w| of a row maps to 127; a row of zeros keeps a tiny scale.
        w_min, w_max = torch.aminmax(q, dim=1)  # [out] each
        scales = (torch.maximum(-w_min, w_max).clamp(min=1e-12) / 127).to(_KERNEL_DTYPE)
        # Round against the scale actually stored, so q * scale is the nearest value.
        q.div_(scales.float()[:, None]).round_().clamp_(-127, 127)
        layer = cls(q.to(torch.int8), scales, bias)
        return QuantizedWeight(layer, q.mul_(scales.float()[:, None]))

    def forward(self, x: Tensor) -> Tensor:  # [T, in] -> [T, out]
        y = torch.ops.aten._weight_int8pack_mm(x.to(_KERNEL_DTYPE), self.weight_int8, self.scales)
        return _finish(y, self.bias, x.dtype)

    def matmul_for(self, dtype: torch.dtype) -> Callable[[Tensor], Tensor]:
        """`forward` for inputs of `dtype`, as one kernel call where no cast or bias is due."""
        if dtype != _KERNEL_DTYPE or self.bias is not None:
            return self.forward
        kernel, weight, scales = torch.ops.aten._weight_int8pack_mm, self.weight_int8, self.scales
        return lambda x: kernel(x, weight, scales)


class Int4Linear(nn.Module):
    """y = x W^T + b, W in groups of `group_size` input columns: (q - 8) * scale + zero."""

    def __init__(
        self, packed: Tensor, scales_and_zeros: Tensor, bias: Tensor | None, group_size: int
    ):
        super().__init__()
        self.register_buffer("packed", packed)  # [out, in // 2] uint8, the kernel's layout
        self.register_buffer("scales_and_zeros", scales_and_zeros)  # [in // group, out, 2]
        self.bias = bias  # [out] model dtype, or None
        self.group_size = group_size

    @classmethod
    def quantize(
        cls, weight: Tensor, bias: Tensor | None, group_size: int = INT4_GROUP_SIZE
    ) -> QuantizedWeight:
        out_features, in_features = weight.shape
        if in_features % group_size:
            raise ModelLoadError(
                f"int4 needs input sizes divisible by {group_size}, got a [{out_features}, "
                f"{in_features}] matrix"
            )
        # A float32 working copy, then in-place steps: fewer passes over memory.
        q = weight.to(torch.float32, copy=True)
        q = q.view(out_features, in_features // group_size, group_size)  # [out, groups, group]
        w_min, w_max = torch.aminmax(q, dim=-1)  # [out, groups] each
        # 15 steps span [min, max]; a constant group keeps a tiny step.
        scales = ((w_max - w_min) / 15).clamp(min=1e-12).to(_KERNEL_DTYPE)
        # zero is the value of code 8: with bfloat16 scales and zeros stored,
        # rounding against them keeps every code the nearest one to its weight.
        zeros = (w_min + 8 * scales.float()).to(_KERNEL_DTYPE)
        scale_f, zero_f = scales.float()[..., None], zeros.float()[..., None]
        q.sub_(zero_f).div_(scale_f).add_(8).round_().clamp_(0, 15)
        codes = q.view(out_features, in_features).to(torch.int32)  # [out, in]
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, _INT4_INNER_K_TILES)
        scales_and_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous()
        layer = cls(packed, scales_and_zeros, bias, group_size)
        dequantized = q.sub_(8).mul_(scale_f).add_(zero_f).view(out_features, in_features)
        return QuantizedWeight(layer, dequantized)

    def forward(self, x: Tensor) -> Tensor:  # [T, in] -> [T, out]
        # The kernel needs a contiguous input; the gate half of gate/up is a strided view.
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.to(_KERNEL_DTYPE).contiguous(), self.packed, self.group_size, self.scales_and_zeros
        )
        return _finish(y, self.bias, x.dtype)

    def matmul_for(self, dtype: torch.dtype) -> Callable[[Tensor], Tensor]:
        """`forward` for inputs of `dtype`, as one kernel call where no cast or bias is due."""
        if dtype != _KERNEL_DTYPE or self.bias is not None:
            return self.forward
        kernel = torch.ops.aten._weight_int4pack_mm_for_cpu
        packed, group_size, scales_and_zeros = self.packed, self.group_size, self.scales_and_zeros
        # A one-row view (a decode's gate half) is contiguous already; more rows may not be.
        return lambda x: kernel(x.contiguous(), packed, group_size, scales_and_zeros)


def _finish(y: Tensor, bias: Tensor | None, dtype: torch.dtype) -> Tensor:
    y = y.to(dtype)  # [T, out]
    return y if bias is None else y.add_(bias)
