"""Projections and embeddings whose weights stay in their GGUF blocks.

A GGUF's quantized matrices are loaded as block codes (loader/gguf_blocks.py, models/block_codes.py)
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

import dataclasses
import mmap
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from sluice.errors import ModelLoadError
from sluice.models.linear import Linear
from sluice.models.native.qblock import (
    QBlockMatrix,
    part_array,
    qblock_matmul_parts,
    qblock_rows,
)
from sluice.models.qblock_pack import TILE
from sluice.models.weight_targets import WeightTarget
from sluice.models.zero_pages import anonymous_pages


class QBlockLinear(nn.Module):
    """x W^T (+ b) with W as consecutive row ranges, each its own packed blocks.

    A fused projection (q, k, v; gate, up) keeps each part in the type the
    file gave it (Q4_K_M mixes Q4_K and Q6_K inside one layer's attention).
    """

    def __init__(self, parts: list[QBlockMatrix], bias: Tensor | None) -> None:
        super().__init__()
        self.parts = parts
        for index, part in enumerate(parts):  # buffers: the model's weight_bytes counts them
            self.register_buffer(f"packed_{index}", part.packed, persistent=False)
        self.in_features = parts[0].in_features
        self.out_features = sum(part.out_features for part in parts)
        assert all(part.in_features == self.in_features for part in parts), "parts' widths"
        self.bias = bias

        # The parts as the kernel's C array, made once (the buffers above keep their bytes alive).
        self.part_array = part_array(parts)

    def forward(self, x: Tensor) -> Tensor:  # [T, in] -> [T, out]
        out = torch.empty((x.shape[0], self.out_features), dtype=x.dtype)
        # One call: the rows quantized once for every part (q, k, v; gate, up).
        qblock_matmul_parts(x, self.part_array, out)
        if self.bias is not None:
            out += self.bias
        return out


class QBlockEmbedding(nn.Module):
    """Rows of a quantized table, read back exactly (float32, then the model dtype)."""

    def __init__(self, matrix: QBlockMatrix, dtype: torch.dtype) -> None:
        super().__init__()
        self.matrix = matrix
        self.register_buffer("packed", matrix.packed, persistent=False)
        self.dtype = dtype

    def forward(self, input_ids: Tensor) -> Tensor:  # [T] -> [T, hidden]
        return qblock_rows(self.matrix, input_ids).to(self.dtype)


@dataclass(slots=True)
class CodesFor:
    """A matrix that arrived as block codes (packed on arrival, so a load holds
    packed bytes, never every matrix's codes) for rows [row_start, row_end)."""

    row_start: int
    row_end: int
    matrix: QBlockMatrix


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
    return QBlockLinear(merged_parts([part.matrix for part in parts]), bias)


def merged_parts(matrices: list[QBlockMatrix]) -> list[QBlockMatrix]:
    """Neighbouring parts of one format joined into one matrix (one kernel call):
    a part whose rows fill whole 16-row tiles ends exactly where the next one's
    packed tiles can begin (q and k of a Q4_K_M attention; gate and up)."""
    merged = [matrices[0]]
    for matrix in matrices[1:]:
        last = merged[-1]
        if last.format == matrix.format and last.out_features % TILE == 0:
            packed = huge_page_bytes(last.packed.numel() + matrix.packed.numel())
            torch.cat([last.packed, matrix.packed], out=packed)
            rows = last.out_features + matrix.out_features
            merged[-1] = QBlockMatrix(packed, last.format, rows, last.in_features)
        else:
            merged.append(matrix)
    return merged


def adopt_block_codes(
    model: nn.Module, arrived: list[tuple[str, WeightTarget, QBlockMatrix]]
) -> None:
    """Swap in QBlock modules for every matrix that came as block codes.

    `arrived`: (HF name, its target, its packed codes) from `load_weights`. Each
    `Linear` whose weight is a target becomes a `QBlockLinear` in its parent;
    the embedding table (`model.embed_tokens`) gets `model.token_embedding`,
    and a tied lm_head shares its packed matrix. A projection whose rows came
    partly as codes and partly as floats is refused.
    """
    owners = _linear_owners(model)
    parts: dict[int, list[CodesFor]] = {}
    names: dict[int, str] = {}
    for name, target, matrix in arrived:
        key = id(target.param)
        rows = target.param.shape[0]
        start = 0 if target.row_start is None else target.row_start
        end = rows if target.row_end is None else target.row_end
        parts.setdefault(key, []).append(CodesFor(start, end, matrix))
        names.setdefault(key, name)
    for key, pieces in parts.items():
        is_embedding = key == id(model.embed_tokens)
        linears = owners.get(key, [])
        if not linears and not is_embedding:
            raise ModelLoadError(f"{names[key]} came as blocks but is no projection")
        for parent, attribute, linear in linears:
            swapped = qblock_linear(pieces, linear.weight.shape[0], linear.bias, names[key])
            setattr(parent, attribute, swapped)
        if is_embedding:
            # The one packed matrix a tied lm_head holds too (a single part).
            model.token_embedding = QBlockEmbedding(pieces[0].matrix, model.dtype)
            # Drop the never-written float table the codes replaced.
            model.embed_tokens = nn.Parameter(
                torch.empty(0, dtype=model.dtype), requires_grad=False
            )


# Below this a matrix keeps its allocation (a huge page is 2 MiB).
HUGE_PAGES_FROM_BYTES = 4 << 20


def huge_page_bytes(size: int) -> Tensor:
    """An uninitialised uint8 tensor of `size` bytes whose pages may be 2 MiB
    (an anonymous mapping advised MADV_HUGEPAGE; the kernel's
    transparent_hugepage "madvise" setting then backs it with huge pages).

    One stream's decode reads every weight byte once per token, and a 4 KiB
    page ends each hardware prefetch stream every 64 cache lines: the qblock
    kernel streams 12-40% faster from huge pages (a 3072x8192 Q4_K matrix,
    best of 60 calls: 42.5 against 38 GB/s on two threads, 27.0 against
    22.2 on one). Small sizes, and systems without the advice, get torch's
    own allocation."""
    if size < HUGE_PAGES_FROM_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(size, dtype=torch.uint8)
    return anonymous_pages(size)


def on_huge_pages(matrix: QBlockMatrix) -> QBlockMatrix:
    """The matrix with its packed bytes copied into `huge_page_bytes` (same
    bits): llama.py's load_weights moves each matrix as it arrives."""
    packed = huge_page_bytes(matrix.packed.numel())
    packed.copy_(matrix.packed)
    return dataclasses.replace(matrix, packed=packed)


def _linear_owners(model: nn.Module) -> dict[int, list[tuple[nn.Module, str, nn.Module]]]:
    """id(weight parameter) -> every (parent, attribute, Linear) holding it."""
    owners: dict[int, list[tuple[nn.Module, str, nn.Module]]] = {}
    for parent in model.modules():
        for attribute, child in parent.named_children():
            if isinstance(child, Linear):
                owners.setdefault(id(child.weight), []).append((parent, attribute, child))
    return owners
