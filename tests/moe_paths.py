"""The per-expert path of an MoE layer's kept experts, as moe.py runs it,
for the tests of the one-call kernels (moe_qblock.c, moe_mxfp4.c) to match."""

from __future__ import annotations

from collections.abc import Callable

import torch

from sluice.models.moe import KeptExperts


def per_expert_sum(
    kept: KeptExperts, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
    swiglu: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:  # fmt: skip
    """Each expert over its rows (one `kept` call), then the rank-order float32 sum."""
    outputs = torch.empty(*ids.shape, x.shape[1], dtype=x.dtype)
    for expert in ids.unique().tolist():
        token, rank = (ids == expert).nonzero(as_tuple=True)
        outputs[token, rank] = kept(expert, swiglu, x[token])
    total = outputs[:, 0].float().mul_(weights[:, :1])
    for rank in range(1, ids.shape[1]):
        total.add_(outputs[:, rank].float().mul_(weights[:, rank : rank + 1]))
    return total
