"""Projections and embeddings whose weights stay in their GGUF blocks.

A GGUF's quantized matrices are loaded as block codes (loader/gguf_blocks.py)
and packed once (`QBlockMatrix`, native/qblock.py): about the file's bytes,
with no float copy anywhere. After a model's weights are in,
`adopt_block_codes` swaps each `Linear` whose rows all came as codes for a
`QBlockLinear` (one module swap, as gpt-fast swaps in its quantized
modules: the layer's strategy is fixed once, never rebound per call), and a
quantized embedding table for a `QBlockEmbedding`.

Every row count runs the same kernel (int8 activations, exact integer sums
per super-block, llama.cpp's arithmetic), so a row's bits never depend on
the rows beside it: the row-invariant default and speculation's greedy
guarantee hold on this path at any step size, prefill included.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from sluice.errors import ModelLoadError
from sluice.loader.gguf_blocks import BlockCodes
from sluice.models.native.qblock import QBlockMatrix, qblock_matmul, qblock_rows


class QBlockLinear(nn.Module):
    """x W^T (+ b) with W as consecutive row ranges, each its own packed blocks.

    A fused projection (q, k, v; gate, up) keeps each part in the type the
    file gave it (Q4_K_M mixes Q4_K and Q6_K inside one layer's attention).
    """

    def __init__(self, parts: list[QBlockMatrix], bias: Tensor | None) -> None:
        super().__init__()
        self.parts = parts
        self.in_features = parts[0].in_features
        self.out_features = sum(part.out_features for part in parts)
        assert all(part.in_features == self.in_features for part in parts), "parts' widths"
        self.bias = bias

    def forward(self, x: Tensor) -> Tensor:  # [T, in] -> [T, out]
        out = torch.empty((x.shape[0], self.out_features), dtype=x.dtype)
        start = 0
        for part in self.parts:
            qblock_matmul(x, part, out[:, start : start + part.out_features])
            start += part.out_features
        if self.bias is not None:
            out += self.bias
        return out

    def weight_bytes(self) -> int:
        return sum(part.packed.numel() for part in self.parts)


class QBlockEmbedding(nn.Module):
    """Rows of a quantized table, read back exactly (float32, then the model dtype)."""

    def __init__(self, matrix: QBlockMatrix, dtype: torch.dtype) -> None:
        super().__init__()
        self.matrix = matrix
        self.dtype = dtype

    def forward(self, input_ids: Tensor) -> Tensor:  # [T] -> [T, hidden]
        return qblock_rows(self.matrix, input_ids).to(self.dtype)


@dataclass(slots=True)
class CodesFor:
    """Block codes that arrived for rows [row_start, row_end) of one parameter."""

    row_start: int
    row_end: int
    codes: BlockCodes


def qblock_linear(
    parts: list[CodesFor], out_features: int, bias: Tensor | None, name: str
) -> QBlockLinear:
    """The QBlockLinear of a projection whose rows all came as codes, in row order."""
    parts = sorted(parts, key=lambda part: part.row_start)
    covered = 0
    for part in parts:
        if part.row_start != covered:
            raise ModelLoadError(f"{name}: rows {covered}..{part.row_start} came without blocks")
        covered = part.row_end
    if covered != out_features:
        raise ModelLoadError(f"{name}: {covered} of {out_features} rows came as blocks")
    return QBlockLinear([QBlockMatrix.from_codes(part.codes) for part in parts], bias)
