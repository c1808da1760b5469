"""W8A8: int8 activations times int8 weights, for all but the smallest steps, on CPU.

Int8 multiply-adds (VNNI: 4 per lane per instruction, against bfloat16's 2)
do a matmul up to twice as fast as bfloat16. On a CPU with AVX512-VNNI the
int8 matmul is native/int8_gemm.c, on weights packed once: with its passes,
1.5-1.9x faster than the prepacked bfloat16 matmul for the embedded model's
shapes from 4 to 512 rows, and whole decode steps 1.05x faster at 4 tokens,
1.23-1.28x from 8 to 64 (`MIN_PACKED_INT8_TOKENS`; below, weight-only int4
reads half the bytes and wins). Elsewhere it is torch's `_int_mm` (oneDNN,
which packs the weights on every call), and pays only from about 40 rows
(`MIN_INT8_ACTIVATION_TOKENS`). `Int8ActivationLinear` computes y = x W^T + b as

    v = x / smooth                     (per input column, SmoothQuant)
    q_x = round(v / s_t), s_t = max|v_t| / 127    (per token: each row its own scale)
    y = (q_x @ q_W^T) * s_t * s_n + b  (q_W = round(W * smooth / s_n), per output row)

The smoothing factors, smooth_j = max|x_j|^0.5 / max|W_j|^0.5, move the
activations' outlier columns into the weights, where a per-row scale absorbs
them; max|x_j| comes from a calibration text the engine runs at load
(`calibration.py`). Measured on the embedded model (perplexity on
tests/data/quality_text.txt in 64-token steps, float32 = 0; bfloat16 + int4
alone +0.21%): per-token int8 without smoothing +4.3%; smoothed, all four
decoder matmuls +1.37%; smoothed without down_proj +0.68%. So only q/k/v, o
and gate/up take this path (75% of the decoder's multiply-adds); down_proj
(its input, silu(gate) * up, has the widest outliers) and lm_head keep
bfloat16. tests/test_quality_gate.py holds the default within 1%.

The row-invariant scheme, the default where the VNNI kernel runs
(calibration.quantize_row_invariant), uses this layer differently: for every
matrix, lm_head included, at every step (no weight-only copy, no bfloat16
path), and with A13 activations for down_proj and lm_head (`pairs`: codes in
[-8191, 8191] fed to the same int8 matmul as a high and a low int8 row), so
their outliers cost no quality. Integer sums are exact and every kernel
scales them in one epilogue (native/int8_epilogue.h): a row's bits never
depend on the row count.

The passes around the int8 matmul are C kernels too (native/int8_rows.c;
the packed matmul scales its int32 sums itself); in torch ops they cost more
than the matmul saves (a batch-64 step went from 88 to 104 ms). The torch
fallback here computes the same values.

Invariants: weights and activations use symmetric codes in [-127, 127]; a
row of zeros gets scale 1 (codes 0); float32 throughout up to one rounding
to the model dtype, then the bias.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from sluice.models.kernel_plan import AMX, VNNI, Bands, band_of
from sluice.models.native.int8 import (
    AMX_MIN_ROWS,
    MAX_QUANTIZE_COLUMNS,
    PackedInt8Weights,
    int8_gemm_kernels,
    int8_row_kernels,
)

# Fewest rows a matmul takes this path with (`Int8ActivationLinear.min_rows`).
# With the packed VNNI matmul (native/int8_gemm.c), decode steps of the
# embedded model against the paths without W8A8 (weight-only int4 up to 8
# rows, bfloat16 above), interleaved step by step in one process
# (benchmarks/int8_activations.py --force): batch 1 0.91x, 2 0.96x, 4 1.05x,
# 8 1.24x, 16 1.28x, 64 1.23x; a 480-token prefill 1.23x. Smaller steps
# keep int4: they are bound by the bytes of the weights, int4's half of int8's.
MIN_PACKED_INT8_TOKENS = 4
# Through torch._int_mm (no VNNI kernel here: oneDNN packs the weights on
# every call), against bfloat16: batch 16 0.93x, 24 1.01x, 32 0.96x, 48
# 1.11x, 64 1.09x; a 480-token prefill 1.05-1.14x.
MIN_INT8_ACTIVATION_TOKENS = 40
# SmoothQuant's migration strength: 0.5 measured best on the embedded model
# (0.4: +1.8%, 0.55: +1.5%, 0.7: +3.3% with all four matmuls).
SMOOTHING_ALPHA = 0.5
_TINY = 1e-5


class Int8ActivationLinear(nn.Module):
    """y = x W^T + b through int8 x int8 -> int32 (module docstring)."""

    def __init__(
        self,
        weight_int8: Tensor,  # [out, in] int8
        weight_scales: Tensor,  # [out] float32
        inv_smooth: Tensor,  # [in] float32: 1 / smooth
        bias: Tensor | None,  # [out] model dtype
        dtype: torch.dtype,
        pairs: bool = False,
    ):
        super().__init__()
        # A13: activation codes in [-8191, 8191], each fed as two int8 codes
        # (native/int8_rows.c); for inputs whose outliers int8 codes lose.
        self.pairs = pairs
        self.register_buffer("weight_scales", weight_scales)
        self.register_buffer("inv_smooth", inv_smooth)
        self.bias = bias
        self.dtype = dtype
        num_columns = weight_int8.shape[1]
        kernels = int8_row_kernels(dtype) if num_columns <= MAX_QUANTIZE_COLUMNS else None
        kernels = None if pairs and dtype != torch.bfloat16 else kernels
        gemm = int8_gemm_kernels() if kernels and dtype == torch.bfloat16 else None
        if gemm is not None and num_columns % 4 == 0:
            # VNNI on weights packed once (native/int8_gemm.c), quantizing
            # inside the same call; the codes themselves are not kept. AMX-INT8
            # tiles (native/int8_amx.c) from AMX_MIN_ROWS rows, where the CPU
            # has them: the same exact sums, so the same bits.
            self._amx_min_rows = AMX_MIN_ROWS if gemm.has_amx else 0
            self._amx_bands: Bands | None = None
            self._linear = functools.partial(gemm.linear, amx_min_rows=self._amx_min_rows)
            self.packed: PackedInt8Weights | None = gemm.pack(weight_int8)
            self.weight_int8 = None
            # The fewest rows for which this layer beats the model's other
            # paths (on a CPU with AMX, int8_threshold.py may raise it).
            self.min_rows = MIN_PACKED_INT8_TOKENS
        else:
            if pairs:  # A13 codes: the torch passes
                kernels = (
                    functools.partial(_quantize_rows, pairs=True),
                    functools.partial(_dequantize_rows(dtype), pairs=True),
                )
            self._quantize, self._dequantize = kernels or (_quantize_rows, _dequantize_rows(dtype))
            self.packed = None
            self.register_buffer("weight_int8", weight_int8)
            self.min_rows = MIN_INT8_ACTIVATION_TOKENS

    @classmethod
    @torch.no_grad()
    def quantize(
        cls, weight: Tensor, bias: Tensor | None, input_absmax: Tensor, dtype: torch.dtype,
        pairs: bool = False, alpha: float = SMOOTHING_ALPHA,
    ) -> Int8ActivationLinear:  # fmt: skip
        """`weight` [out, in] and the calibration's max |x| per input column [in];
        `pairs`: A13 activations; `alpha`: SmoothQuant's migration strength."""
        w = weight.to(torch.float32, copy=True)  # [out, in]
        column_max = w.abs().amax(dim=0).clamp(min=_TINY)  # [in]
        smooth = input_absmax.float().clamp(min=_TINY).pow(alpha)
        smooth = smooth.div_(column_max.pow(1 - alpha)).clamp(min=_TINY)  # [in]
        w.mul_(smooth)
        scales = w.abs().amax(dim=1).clamp(min=1e-12).div_(127)  # [out]
        codes = w.div_(scales[:, None]).round_().clamp_(-127, 127).to(torch.int8)
        return cls(codes, scales, smooth.reciprocal(), bias, dtype, pairs)

    def serve_bands(self, bands: Bands) -> None:
        """Take AMX-INT8 or VNNI per step as the kernel plan's `bands` of int8
        code rows say (kernel_plan.py; "amx" / "vnni"): the same bits either
        way, only the speed differs. One threshold stays inside the C call."""
        gemm = int8_gemm_kernels()
        if self.packed is None or gemm is None or not gemm.has_amx or not bands:
            return
        threshold = _threshold(bands)
        if threshold is not None:
            self._amx_min_rows, self._amx_bands = threshold, None
            self._linear = functools.partial(gemm.linear, amx_min_rows=threshold)
            return
        self._amx_bands = bands
        linear, amx_min_rows_at = gemm.linear, self.amx_min_rows_at

        def banded(x: Tensor, *args) -> Tensor:
            return linear(x, *args, amx_min_rows=amx_min_rows_at(x.shape[0]))

        self._linear = banded

    def amx_min_rows_at(self, rows: int) -> int:
        """The native call's `amx_min_rows` for a step of `rows` rows (packed
        layers only): the kernel plan's band for its code rows."""
        if self._amx_bands is None:
            return self._amx_min_rows
        kernel = band_of(self._amx_bands, rows * (2 if self.pairs else 1))
        return 1 if kernel == AMX else 0

    def forward(self, x: Tensor) -> Tensor:  # [T, in] model dtype -> [T, out]
        if x.stride(-1) != 1:
            x = x.contiguous()
        if self.packed is not None:  # quantize and matmul in one native call
            return self._linear(
                x, self.inv_smooth, self.packed, self.weight_scales, self.bias, self.pairs
            )
        codes, row_scales = self._quantize(x, self.inv_smooth)  # [T (x2), in] int8, [T] f32
        acc = torch._int_mm(codes, self.weight_int8.t())  # [T (x2), out] int32
        return self._dequantize(acc, row_scales, self.weight_scales, self.bias)


def _threshold(bands: Bands) -> int | None:
    """The C call's `amx_min_rows` for bands of one switch at most (0: never
    AMX); None for bands that go back to VNNI above an AMX band."""
    names = [name for _, name in bands]
    if names == [VNNI]:
        return 0
    if names == [AMX]:
        return 1
    if names == [VNNI, AMX]:
        return bands[1][0]
    return None


def _quantize_rows(x: Tensor, inv_smooth: Tensor, pairs: bool = False) -> tuple[Tensor, Tensor]:
    """The torch path of native `quantize_rows` (`pairs`: `quantize_row_pairs`):
    the same steps, the same values."""
    max_code = 8191 if pairs else 127
    v = x.float() * inv_smooth  # [T, in]
    top = v.abs().amax(dim=1)  # [T]
    scales = torch.where(top > 0, top / max_code, torch.ones_like(top))
    codes = (v * scales.reciprocal()[:, None]).round_().clamp_(-max_code, max_code)
    if not pairs:
        return codes.to(torch.int8), scales
    high = torch.floor((codes + 64) / 128)  # [T, in], codes = 128 * high + low
    low = codes - 128 * high
    return torch.stack([high, low], dim=1).flatten(0, 1).to(torch.int8), scales  # [2T, in]


def _dequantize_rows(dtype: torch.dtype):
    def dequantize(
        acc: Tensor, scales: Tensor, col_scales: Tensor, bias: Tensor | None, pairs: bool = False
    ) -> Tensor:
        sums = acc.float()  # [T (x2), out]
        if pairs:  # as int8_epilogue.h: high * 128 + low, then the scales
            sums = sums[0::2].mul_(128).add_(sums[1::2])
        y = sums.mul_(scales[:, None]).mul_(col_scales).to(dtype)  # [T, out]
        return y if bias is None else y.add_(bias)

    return dequantize
