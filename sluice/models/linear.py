"""The matmul of every projection: dense, oneDNN-prepacked, or weight-only quantized.

A `Linear` holds W [out, in] (and an optional bias) in the model dtype. After
loading, on x86 CPUs, `prepack` repacks W into oneDNN's blocked layout; after
that, `quantize` may add an int8/int4 copy that serves steps of a few tokens
(sluice/models/quantization.py). `forward` picks the path by the number of
rows.
"""

from __future__ import annotations

import platform

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sluice.models.quantization import MAX_QUANTIZED_TOKENS, quantize_weight


def uninitialised_weight(*shape: int, dtype: torch.dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


def can_prepack(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether matrices can be repacked for oneDNN (x86 CPU, and bfloat16 in hardware)."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False  # measured on x86 only; oneDNN on ARM goes through other kernels
    return dtype == torch.float32 or (
        dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


class Linear(nn.Module):
    """y = x W^T + b, with W optionally repacked into oneDNN's blocked layout.

    `prepack` runs once, after the weights are loaded: it replaces W by an
    opaque oneDNN tensor that only `forward` can use. Same bits as F.linear in
    bfloat16 (float32 rounds differently, by about 1e-6 relative), and 1.3-1.7x
    faster bfloat16 matmuls (about 1.1x in float32) at decode batch sizes.

    `forward` is one comparison and one call: each path is a closure bound
    once, when the weights change (`_bind`), since a decode step runs 120 of
    these matmuls and every Python call layer on them costs the step time.
    """

    def __init__(self, in_features: int, out_features: int, has_bias: bool, dtype, device):
        super().__init__()
        self.weight = uninitialised_weight(out_features, in_features, dtype=dtype, device=device)
        self.bias = (
            uninitialised_weight(out_features, dtype=dtype, device=device) if has_bias else None
        )
        self.is_prepacked = False
        # Set by `quantize`: a weight-only copy of W (Int8Linear / Int4Linear)
        # for matmuls of at most `max_quantized_tokens` rows.
        self.quantized: nn.Module | None = None
        self.max_quantized_tokens = 0
        self._dense_matmul = self._plain_matmul
        self._small_matmul = self._plain_matmul

    def forward(self, x: Tensor) -> Tensor:  # [T, in] -> [T, out]
        if x.shape[0] <= self.max_quantized_tokens:
            return self._small_matmul(x)
        return self._dense_matmul(x)

    def _plain_matmul(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def _bind(self) -> None:
        weight, bias = self.weight, self.bias
        if self.is_prepacked:
            linear_pointwise = torch.ops.mkldnn._linear_pointwise

            def packed_matmul(x: Tensor) -> Tensor:
                return linear_pointwise(x, weight, bias, "none", [], "")

            self._dense_matmul = packed_matmul
        else:
            self._dense_matmul = self._plain_matmul
        quantized = self.quantized
        self._small_matmul = (
            self._dense_matmul if quantized is None else quantized.matmul_for(weight.dtype)
        )

    def prepack(self) -> None:
        # The batch-size hint 1 tunes the layout for decode; any batch still works.
        packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), 1)
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.is_prepacked = True
        self._bind()

    def dense_weight(self) -> Tensor:  # [out, in], plain layout
        # oneDNN reorders a packed weight back to the plain layout bit for bit.
        return self.weight.to_dense() if self.is_prepacked else self.weight

    @torch.no_grad()
    def quantize(self, mode: str) -> None:
        """Add a weight-only `mode` copy of W for small matmuls; W becomes its values.

        The quantized kernels lose to the dense matmul beyond a few rows, so
        prefill and large batches keep the dense path. It computes with the
        dequantized values too: a request sees one set of weights whatever the
        batch it runs in (up to the model dtype's rounding).
        """
        dense = self.dense_weight()
        result = quantize_weight(dense, self.bias, mode)
        self.quantized = result.layer
        self.max_quantized_tokens = MAX_QUANTIZED_TOKENS[mode]
        was_prepacked = self.is_prepacked
        self.weight = nn.Parameter(result.dequantized.to(dense.dtype), requires_grad=False)
        self.is_prepacked = False
        if was_prepacked:
            self.prepack()
        else:
            self._bind()
