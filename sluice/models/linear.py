"""The matmul of every projection: dense, oneDNN-prepacked, or weight-only quantized.

A `Linear` holds W [out, in] (and an optional bias) in the model dtype. After
loading, on x86 CPUs, `prepack` repacks W into oneDNN's blocked layout; after
that, `quantize` may add an int8/int4 copy that serves steps of a few tokens
(sluice/models/quantization.py), and `quantize_activations` an int8 x int8
matmul for the larger steps (sluice/models/int8_activations.py). `forward`
picks the path by the number of rows.

Batch-invariant mode (`row_tile`): every matmul runs on tiles of exactly
`row_tile` rows (the last one zero-padded), so a row's result never depends
on how many other rows share the step. oneDNN and torch pick their kernel,
blocking and reduction order from the shape: measured on this CPU, float32
F.linear at 1 row differs from the same row among 2 or more, and bfloat16
with K=1536 differs at 3, 4, 5, 7 and 12 rows; with a fixed tile shape no
row differed, at any position in its tile. The weight-only int8/int4 kernels
gave the same bits at any row count, but are slow beyond a few rows, so the
mode uses the dense matmul (on the quantized values) for every step.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sluice.models.int8_activations import SMOOTHING_ALPHA, Int8ActivationLinear
from sluice.models.quantization import MAX_QUANTIZED_TOKENS, quantize_weight

# Row counts W8A8 serves: half-open ranges, ascending, never adjacent; the
# last may run to sys.maxsize (every larger step). Empty: W8A8 serves none.
RowBands = tuple[range, ...]
# W8A8 at every row count: the row-invariant scheme (`quantize_activations`' `every_row`).
EVERY_ROW: RowBands = (range(1, sys.maxsize),)
# Rows per matmul in batch-invariant mode: small enough that a one-row decode
# step wastes little, large enough that big steps keep efficient kernels.
BATCH_INVARIANT_ROW_TILE = 8


def uninitialised_weight(*shape: int, dtype: torch.dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


def in_row_tiles(
    function: Callable[[Tensor], Tensor], x: Tensor, row_tile: int
) -> Tensor:  # [T, in] -> [T, out]
    """`function` applied to tiles of exactly `row_tile` contiguous rows of x
    (zero rows pad the last one): the same shapes, so the same kernels, for
    every row whatever the number of rows."""
    num_rows = x.shape[0]
    if num_rows == row_tile and x.is_contiguous():
        return function(x)
    num_padded = -(-num_rows // row_tile) * row_tile
    padded = x.new_zeros((num_padded, x.shape[1]))  # [T padded, in]
    padded[:num_rows] = x
    return torch.cat([function(tile) for tile in padded.split(row_tile)])[:num_rows]


def can_prepack(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether matrices can be repacked for oneDNN (x86 CPU, and bfloat16 in hardware)."""
    if torch.device(device).type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False  # measured on x86 only; oneDNN on ARM goes through other kernels
    return dtype == torch.float32 or (
        dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def _in_bands(
    bands: RowBands,
    w8a8: Callable[[Tensor], Tensor],
    small: Callable[[Tensor], Tensor],
    max_small_rows: int,
    dense: Callable[[Tensor], Tensor],
) -> Callable[[Tensor], Tensor]:
    """The matmul `forward` calls from `bands[0].start` rows up: W8A8 itself
    when it serves every larger step (no extra call), else W8A8 inside the
    bands and the weight-only or dense path between them."""
    if len(bands) == 1 and bands[0].stop == sys.maxsize:
        return w8a8

    def banded(x: Tensor) -> Tensor:  # [T, in] -> [T, out]
        num_rows = x.shape[0]
        if any(num_rows in band for band in bands):
            return w8a8(x)
        return small(x) if num_rows <= max_small_rows else dense(x)

    return banded


def bands_from(bands: RowBands, floor: int) -> RowBands:
    """`bands` cut to the row counts from `floor` up (a W8A8 layer's own
    `min_rows`: it never serves fewer); bands wholly below it go."""
    return tuple(range(max(b.start, floor), b.stop) for b in bands if b.stop > floor)


class Linear(nn.Module):
    """y = x W^T + b, with W optionally repacked into oneDNN's blocked layout.

    `prepack` runs once, after the weights are loaded: it replaces W by an
    opaque oneDNN tensor that only `forward` can use. Same bits as F.linear in
    bfloat16 (float32 rounds differently, by about 1e-6 relative), and 1.3-1.7x
    faster bfloat16 matmuls (about 1.1x in float32) at decode batch sizes.

    `forward` is at most two comparisons and one call: each path is a closure bound
    once, when the weights change (`_bind`), since a decode step runs 120 of
    these matmuls and every Python call layer on them costs the step time.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        has_bias: bool,
        dtype,
        device,
        row_tile: int | None = None,
    ):
        super().__init__()
        # Batch-invariant mode: every matmul on tiles of this many rows (module docstring).
        self.row_tile = row_tile
        self.weight = uninitialised_weight(out_features, in_features, dtype=dtype, device=device)
        self.bias = (
            uninitialised_weight(out_features, dtype=dtype, device=device) if has_bias else None
        )
        self.is_prepacked = False
        # Set by `quantize`: a weight-only copy of W (Int8Linear / Int4Linear)
        # for matmuls of at most `max_quantized_tokens` rows.
        self.quantized: nn.Module | None = None
        self.max_quantized_tokens = 0
        # Set by `quantize_activations`: W8A8 (`_large_matmul`) for matmuls
        # in `int8_row_bands` (from its `min_rows` up, unless raced at load:
        # `serve_int8_activations_in`; or every row count: `quantize_activations`'s
        # `every_row`); it takes precedence over the
        # weight-only copy. `min_large_rows`: the bands' first row count.
        self.int8_activations: Int8ActivationLinear | None = None
        self._raced_bands: RowBands | None = None
        self.int8_row_bands: RowBands = ()
        self.min_large_rows = sys.maxsize
        self._bind()

    def forward(self, x: Tensor) -> Tensor:  # [T, in] -> [T, out]
        num_rows = x.shape[0]
        if num_rows >= self.min_large_rows:
            return self._large_matmul(x)
        if num_rows <= self.max_quantized_tokens:
            return self._small_matmul(x)
        return self._dense_matmul(x)

    @property
    def row_dependence(self) -> str | None:
        """How a row's result depends on the number of rows in its step; None
        where it does not: row tiles (batch-invariant mode), or W8A8 at every
        row count (exact integer sums, one epilogue). Elsewhere the path
        changes with the row count, and so does a dense kernel's blocking."""
        if self.row_tile is not None or self.int8_row_bands == EVERY_ROW:
            return None
        paths = []
        num_small_rows = 0
        if self.quantized is not None:
            num_small_rows = min(self.max_quantized_tokens, self.min_large_rows - 1)
            paths.append(f"weight-only up to {num_small_rows} rows")
        bands = self.int8_row_bands
        if bands:
            paths.append(f"int8 activations from {self.min_large_rows} rows")
        is_w8a8_above = len(bands) == 1 and bands[0].stop == sys.maxsize
        if not (is_w8a8_above and num_small_rows == self.min_large_rows - 1):
            paths.append("dense elsewhere, blocked by the row count")
        return ", ".join(paths)

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
        if self.row_tile is not None:
            dense, row_tile = self._dense_matmul, self.row_tile
            self._dense_matmul = lambda x: in_row_tiles(dense, x, row_tile)
            self.max_quantized_tokens = 0  # one kernel for every step (module docstring)
        quantized = self.quantized
        self._small_matmul = (
            self._dense_matmul if quantized is None else quantized.matmul_for(weight.dtype)
        )
        self._large_matmul, self.min_large_rows = self._dense_matmul, sys.maxsize
        self.int8_row_bands = ()
        if self.int8_activations is not None and self.row_tile is None:
            own = (range(self.int8_activations.min_rows, sys.maxsize),)
            bands = self.int8_row_bands = self._raced_bands or own
            self._large_matmul = _in_bands(
                bands, self.int8_activations.forward, self._small_matmul,
                self.max_quantized_tokens, self._dense_matmul,
            )  # fmt: skip
            self.min_large_rows = bands[0].start

    def prepack(self) -> None:
        # The batch-size hint 1 tunes the layout for decode; any batch still works.
        packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), 1)
        self.weight = nn.Parameter(packed, requires_grad=False)
        self.is_prepacked = True
        self._bind()

    def dense_matmul(self, x: Tensor) -> Tensor:  # [T, in] -> [T, out]
        """The dense (prepacked) path whatever the rows, as `forward` takes it
        between the weight-only and the W8A8 thresholds."""
        return self._dense_matmul(x)

    def serve_int8_activations_in(self, bands: RowBands) -> None:
        """Serve W8A8 in `bands` only (never below the layer's own
        `min_rows`), the other paths elsewhere; where that leaves no band,
        drop the W8A8 layer (int8_threshold.py races the bands at load)."""
        if self.int8_activations is None:
            return
        kept = bands_from(bands, self.int8_activations.min_rows)
        if kept:
            self._raced_bands = kept
        else:
            self.int8_activations = None
        self._bind()

    def dense_weight(self) -> Tensor:  # [out, in], plain layout
        # oneDNN reorders a packed weight back to the plain layout bit for bit.
        return self.weight.to_dense() if self.is_prepacked else self.weight

    @torch.no_grad()
    def quantize_activations(
        self, input_absmax: Tensor, every_row: bool = False, pairs: bool = False,
        alpha: float = SMOOTHING_ALPHA,
    ) -> None:  # fmt: skip
        """Serve matmuls of the W8A8 layer's `min_rows` rows or more with int8
        activations times int8 weights, smoothed by the calibration's max |x|
        per input column [in] (`alpha`: the migration strength). Smaller steps
        keep their path; batch-invariant mode keeps the dense matmul for every
        step. `every_row`: every step, from one row (the row-invariant scheme:
        exact integer sums, so a row's bits ignore the rest of its step);
        `pairs`: A13 activations (int8_activations.py)."""
        self.int8_activations = Int8ActivationLinear.quantize(
            self.dense_weight(), self.bias, input_absmax, self.weight.dtype, pairs, alpha
        )
        if every_row:
            self._raced_bands = EVERY_ROW
        self._bind()

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
        self.max_quantized_tokens = MAX_QUANTIZED_TOKENS[mode] if self.row_tile is None else 0
        was_prepacked = self.is_prepacked
        self.weight = nn.Parameter(result.dequantized.to(dense.dtype), requires_grad=False)
        self.is_prepacked = False
        if was_prepacked:
            self.prepack()
        else:
            self._bind()


def row_dependence(model: nn.Module) -> str | None:
    """How a row's bits depend on the number of rows in its step, for the
    first of `model`'s matmuls where they do ("layers.0.qkv_proj: weight-only
    up to 3 rows, ..."); None where no matmul's do."""
    for name, module in model.named_modules():
        if isinstance(module, Linear) and (how := module.row_dependence) is not None:
            return f"{name}: {how}"
    return None
