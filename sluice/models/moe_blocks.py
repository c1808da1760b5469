"""Experts kept in their GGUF blocks: `BlockExperts`, and `adopt_expert_blocks`
that gives each MoE layer whose experts all came as block codes one.

A GGUF stacks each projection of a layer's experts into one tensor
(`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`, [E, out, in]); the loader
(loader/gguf_tensors.py) hands every expert's slice over as its own block
codes, and each is packed once (`QBlockMatrix`, about the file's bytes). An
expert's gate and up rows become one `QBlockLinear` (one kernel call where
their types agree), its down rows another; the float stacks of `MoeBlock`
are dropped, so the experts take their file's bytes in memory.

With the native SwiGLU (`silu_mul_kernel`) and one block format a
projection across the experts (a GGUF stacks them in one tensor), the
whole routed part of the layer is one native call (`qblock_moe`,
moe_qblock.c): every chosen expert of every row, their gate/up, SwiGLU,
down and the weighted sum in rank order, reading only the chosen experts'
blocks: the same bits as the per-expert path below, which runs otherwise.

The per-expert path runs an expert on all the rows routed to it in one call per
projection: the qblock kernel's rows are row-invariant at any row count
(int8 activations per super-block, exact integer sums, one float step per
super-block), and the activation between the two runs on moe.py's fixed row
tiles, so a token's output still depends only on its own routing.

A layer whose experts came partly as blocks and partly as floats (a block
type without a kernel for one projection) gets the blocks' exact values
back as floats (`qblock_rows`) in its stacks instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import Tensor, nn

from sluice.errors import ModelLoadError
from sluice.models.linear import BATCH_INVARIANT_ROW_TILE, in_row_tiles
from sluice.models.moe import KeptExperts, MoeBlock
from sluice.models.native import silu_mul_kernel
from sluice.models.native.qblock import QBlockMatrix, expert_array, qblock_moe, qblock_rows
from sluice.models.qblock_linear import QBlockLinear, merged_parts
from sluice.models.weight_targets import WeightTarget

BLOCKS = "GGUF blocks"
# An expert matrix's HF name, as the GGUF loader splits the stacks.
EXPERT_NAME = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")
_PROJECTIONS = ("gate", "up", "down")


class BlockExperts(KeptExperts):
    """Each expert's gate/up and down projections as packed GGUF blocks."""

    def __init__(self, gate_up: list[QBlockLinear], down: list[QBlockLinear]) -> None:
        super().__init__()
        self.gate_up = nn.ModuleList(gate_up)
        self.down = nn.ModuleList(down)
        formats = {part.format.name for linear in (*gate_up, *down) for part in linear.parts}
        self.formats = tuple(sorted(formats))
        self.width = gate_up[0].out_features // 2  # I
        # The experts as moe_qblock.c's array (their part arrays keep the bytes alive),
        # where each projection has one layout across them; None: per expert only.
        self.expert_array = None
        if _uniform(gate_up) and _uniform(down):
            self.expert_array = expert_array(
                [(up.part_array, dn.part_array) for up, dn in zip(gate_up, down, strict=True)]
            )

    def weighted_sum(
        self, x: Tensor, expert_ids: Tensor, weights: Tensor, swiglu: Callable[[Tensor], Tensor]
    ) -> Tensor | None:  # [T, H], [T, k], [T, k] -> [T, H] float32
        if self.expert_array is None or swiglu is not silu_mul_kernel(x.dtype):
            return None
        return qblock_moe(x, self.expert_array, self.width, expert_ids, weights)

    def forward(
        self, expert: int, swiglu: Callable[[Tensor], Tensor], x: Tensor
    ) -> Tensor:  # [n, H]: the rows routed to `expert` -> [n, H]
        gate_up = self.gate_up[expert](x)  # [n, 2 I], each row alone (the kernel)
        hidden = in_row_tiles(swiglu, gate_up, BATCH_INVARIANT_ROW_TILE)  # [n, I]
        return self.down[expert](hidden)

    def describe(self) -> str:
        return f"{BLOCKS} ({', '.join(self.formats)})"


def _uniform(linears: list[QBlockLinear]) -> bool:
    """Whether every expert's projection has the same parts: formats and widths."""
    layout = [[(part.format, part.out_features) for part in linear.parts] for linear in linears]
    return all(parts == layout[0] for parts in layout)


def adopt_expert_blocks(
    layers: nn.ModuleList, arrived: list[tuple[str, WeightTarget, QBlockMatrix]]
) -> None:
    """Give each MoE layer whose expert matrices all came as blocks its
    `BlockExperts` (the float stacks dropped); where only some did, copy those
    blocks' exact values into the stacks. `arrived` holds expert names only."""
    by_layer: dict[int, dict[tuple[int, str], tuple[str, WeightTarget, QBlockMatrix]]] = {}
    for name, target, matrix in arrived:
        match = EXPERT_NAME.fullmatch(name)
        assert match is not None, f"{name} is no expert matrix"
        layer, expert, projection = int(match[1]), int(match[2]), match[3]
        by_layer.setdefault(layer, {})[expert, projection] = (name, target, matrix)
    for index, matrices in by_layer.items():
        moe = layers[index].moe
        assert isinstance(moe, MoeBlock), f"layer {index} has no experts"
        if len(matrices) == len(_PROJECTIONS) * moe.num_experts:
            kept = _block_experts(moe.num_experts, matrices)
            _check_shapes(kept, moe, index)
            moe.keep_experts(kept)
        else:
            for name, target, matrix in matrices.values():
                rows = qblock_rows(matrix, torch.arange(matrix.out_features))
                target.copy_from(name, rows)


def _check_shapes(kept: BlockExperts, moe: MoeBlock, layer: int) -> None:
    """ModelLoadError (one line) where an expert's blocks are not the config's shape."""
    want = {"gate_up": tuple(moe.gate_up.shape[1:]), "down": tuple(moe.down.shape[1:])}
    for projection, linears in (("gate_up", kept.gate_up), ("down", kept.down)):
        for expert, linear in enumerate(linears):
            shape = (linear.out_features, linear.in_features)
            if shape != want[projection]:
                raise ModelLoadError(
                    f"layer {layer} expert {expert}'s {projection} blocks are {shape}, "
                    f"expected {want[projection]}"
                )


def _block_experts(
    num_experts: int, matrices: dict[tuple[int, str], tuple[str, WeightTarget, QBlockMatrix]]
) -> BlockExperts:
    gate_up, down = [], []
    for expert in range(num_experts):
        gate, up = matrices[expert, "gate"][2], matrices[expert, "up"][2]
        gate_up.append(QBlockLinear(merged_parts([gate, up]), None))
        down.append(QBlockLinear([matrices[expert, "down"][2]], None))
    return BlockExperts(gate_up, down)
