"""gpt-oss's MXFP4 experts kept in 4 bits: `Mxfp4Experts`, and `StackTarget`,
the expert stacks' load target that takes them.

OpenAI's checkpoints store each expert matrix as `*_blocks` and `*_scales`
(models/mxfp4.py); `gpt_oss.in_stacked_layout` joins the two into the
kernel's groups (uint8 [E, out, in / 32, 17], native/mxfp4.py), gate rows
then up rows, and the stack's `StackTarget` keeps them instead of copying
values into the float stack. After the load, a layer whose gate/up and down
both came so runs its experts from them (`MoeBlock.keep_experts`, the float
stacks dropped): each chosen expert's gate/up and down in one
`mxfp4_matmul` each over all the rows routed to it, plus its biases. The
kernel's rows are row-invariant at any row count and the activation runs on
moe.py's fixed row tiles, so a token's bits are its own. A layer where only
one stack came in MXFP4 gets that stack's exact values as floats.

gpt-oss's clamped SwiGLU is `ClampedSwiglu`: rows.c's kernel where the
native library runs (torch's ops, `clamped_swiglu`, elsewhere). With it, the
whole routed part of the layer is one native call (`mxfp4_moe`,
moe_mxfp4.c): every chosen expert of every row, gate/up, biases, SwiGLU,
down and the weighted sum in rank order, the same bits as the per-expert
path above, which runs otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from sluice.errors import ModelLoadError
from sluice.models.linear import BATCH_INVARIANT_ROW_TILE, in_row_tiles
from sluice.models.moe import KeptExperts, MoeBlock
from sluice.models.mxfp4 import dequantize_mxfp4
from sluice.models.native import clamped_swiglu_kernel
from sluice.models.native.mxfp4 import GROUP, GROUP_BYTES, mxfp4_matmul, mxfp4_moe
from sluice.models.weight_targets import WeightTarget


def clamped_swiglu(
    alpha: float, limit: float, gate_up: Tensor
) -> Tensor:  # [T, 2 I] (gate rows, then up) -> [T, I]
    """out = (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)."""
    gate, up = gate_up.chunk(2, dim=-1)  # [T, I] each
    gate = gate.clamp(max=limit)
    return (up.clamp(-limit, limit) + 1) * (gate * torch.sigmoid(gate * alpha))


@dataclass(frozen=True)
class ClampedSwiglu:
    """gpt-oss's experts' activation with its alpha and limit: rows.c's
    kernel (each step rounded as torch's ops round) where it runs, else
    `clamped_swiglu`."""

    alpha: float
    limit: float

    def native(self, dtype: torch.dtype):
        """The native kernel for `dtype` rows; None: torch's ops."""
        return clamped_swiglu_kernel(dtype)

    def __call__(self, gate_up: Tensor) -> Tensor:  # [T, 2 I] -> [T, I]
        kernel = self.native(gate_up.dtype) if gate_up.device.type == "cpu" else None
        if kernel is None or gate_up.stride(-1) != 1:
            return clamped_swiglu(self.alpha, self.limit, gate_up)
        return kernel(gate_up, self.alpha, self.limit)


class Mxfp4Experts(KeptExperts):
    """Each expert's gate/up and down as MXFP4 groups, with their biases."""

    def __init__(self, gate_up: Tensor, down: Tensor, gate_up_bias: Tensor, down_bias: Tensor):
        super().__init__()
        # [E, 2 I, H / 32, 17] and [E, H, I / 32, 17] uint8.
        self.gate_up: Tensor
        self.down: Tensor
        self.register_buffer("gate_up", gate_up, persistent=False)
        self.register_buffer("down", down, persistent=False)
        # [E, 2 I] and [E, H]: the block's own parameters (counted there), shared.
        self.gate_up_bias, self.down_bias = gate_up_bias, down_bias

    def weighted_sum(
        self, x: Tensor, expert_ids: Tensor, weights: Tensor, swiglu: Callable[[Tensor], Tensor]
    ) -> Tensor | None:  # [T, H], [T, k], [T, k] -> [T, H] float32
        native = isinstance(swiglu, ClampedSwiglu) and swiglu.native(x.dtype) is not None
        if not native or self.gate_up_bias.dtype != x.dtype or self.down_bias.dtype != x.dtype:
            return None
        assert isinstance(swiglu, ClampedSwiglu)
        return mxfp4_moe(
            x, (self.gate_up, self.down), (self.gate_up_bias, self.down_bias), expert_ids,
            weights, swiglu.alpha, swiglu.limit,
        )  # fmt: skip

    def forward(
        self, expert: int, swiglu: Callable[[Tensor], Tensor], x: Tensor
    ) -> Tensor:  # [n, H]: the rows routed to `expert` -> [n, H]
        gate_up = mxfp4_matmul(x, self.gate_up[expert]).add_(self.gate_up_bias[expert])
        hidden = in_row_tiles(swiglu, gate_up, BATCH_INVARIANT_ROW_TILE)  # [n, I]
        return mxfp4_matmul(hidden, self.down[expert]).add_(self.down_bias[expert])

    def describe(self) -> str:
        return "MXFP4"


@dataclass
class StackTarget(WeightTarget):
    """An expert stack's target: float values copy into the stack; MXFP4 groups
    (uint8 [E, out, in / 32, 17]) are kept as they are in `groups`."""

    groups: Tensor | None = None

    def copy_from(self, name: str, tensor: Tensor) -> None:
        if tensor.dtype != torch.uint8:
            super().copy_from(name, tensor)
            return
        experts, rows, cols = self.param.shape
        want = (experts, rows, cols // GROUP, GROUP_BYTES)
        if tuple(tensor.shape) != want:
            raise ModelLoadError(
                f"MXFP4 tensor {name} has {tuple(tensor.shape)[:-1]} groups, expected {want[:-1]}"
            )
        self.groups = tensor

    def to_floats(self, name: str) -> None:
        """Copy kept groups' exact values into the float stack."""
        if self.groups is not None:
            blocks, scales = self.groups[..., 1:], self.groups[..., 0]
            super().copy_from(name, dequantize_mxfp4(name, blocks, scales))
            self.groups = None


def keep_mxfp4(
    moe: MoeBlock, gate_up: StackTarget, down: StackTarget, biases: tuple[Tensor, Tensor],
    prefix: str,
) -> None:  # fmt: skip
    """After a layer's load: run its experts from their MXFP4 groups (with
    `biases`, gate/up's and down's) where both stacks came so; else floats."""
    if gate_up.groups is not None and down.groups is not None:
        moe.keep_experts(Mxfp4Experts(gate_up.groups, down.groups, *biases))
        return
    gate_up.to_floats(prefix + "gate_up_proj")
    down.to_floats(prefix + "down_proj")
