"""Hidden states -> one vector per sequence: pooling, normalization, truncation.

Sequences arrive flat, as the decoder computes them ([num_tokens, hidden],
sequence b's tokens at [start_b, start_b + len_b)); an encoder's padded
output is flattened first. Each sequence's vector depends on its own tokens
only (a mean is a per-sequence sum divided by its length).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def pool(hidden: Tensor, seq_lens: list[int], pooling: str) -> Tensor:
    """[num_tokens, H] flat states -> [B, H] float32, one row per sequence;
    `pooling`: "mean", "cls" or "last" (engine/pooling_params.PoolingType)."""
    lengths = torch.tensor(seq_lens, device=hidden.device)  # [B]
    ends = lengths.cumsum(0)  # [B]
    if pooling == "cls":
        return hidden[ends - lengths].float()
    if pooling == "last":
        return hidden[ends - 1].float()
    assert pooling == "mean", f"unknown pooling {pooling!r}"
    owner = torch.repeat_interleave(torch.arange(len(seq_lens), device=hidden.device), lengths)
    sums = torch.zeros(len(seq_lens), hidden.shape[1], device=hidden.device)  # [B, H] float32
    sums.index_add_(0, owner, hidden.float())
    return sums / lengths[:, None]


def finish(vectors: Tensor, normalize: bool, dimensions: int | None) -> Tensor:
    """Cut each row to `dimensions` (Matryoshka), then L2-normalize if the
    model normalizes (vLLM's order: a cut embedding is a unit vector again)."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    if normalize:
        vectors = F.normalize(vectors, p=2, dim=-1)
    return vectors
