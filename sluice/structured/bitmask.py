"""The allowed tokens of a step's constrained rows, as one mask over the batch.

`allowed_tokens(matchers, ...)` asks llguidance for the next-token bitmask of
every constrained row at once (filled in parallel, outside the GIL, straight
into one int32 tensor); `apply_allowed_tokens` sets every other token's logit
to -inf. A batch without constrained rows never gets here
(`sluice.engine.sampling.batch` leaves the mask None).

Bit j of word w of a row allows token 32 * w + j (llguidance's layout).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import llguidance
import torch
from torch import Tensor

from sluice.structured.matcher import GrammarMatcher

BITS_PER_WORD = 32


@dataclass(slots=True)
class AllowedTokens:
    """Which tokens the constrained rows of a batch may sample."""

    row_ids: Tensor  # [m] int64: the constrained rows, in batch order
    bitmask: Tensor  # [m, ceil(V / 32)] int32, on the logits' device


@functools.cache
def _executor() -> llguidance.LLExecutor:
    # One per process: it owns a thread pool.
    return llguidance.LLExecutor()


def allowed_tokens(
    matchers: list[GrammarMatcher | None], vocab_size: int, device: torch.device
) -> AllowedTokens | None:
    """The mask of the rows whose matcher is not None; None when there are none."""
    constrained = [(i, m) for i, m in enumerate(matchers) if m is not None]
    if not constrained:
        return None
    num_words = (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD
    bitmask = torch.empty(len(constrained), num_words, dtype=torch.int32)  # [m, W]
    targets = [(m.matcher, k) for k, (_, m) in enumerate(constrained)]
    _executor().unsafe_compute_mask_ptr(targets, bitmask.data_ptr(), num_words * 4, len(targets))
    row_ids = torch.tensor([i for i, _ in constrained], dtype=torch.int64)
    return AllowedTokens(
        row_ids=row_ids.to(device, non_blocking=True),
        bitmask=bitmask.to(device, non_blocking=True),
    )


def apply_allowed_tokens(logits: Tensor, allowed: AllowedTokens) -> None:
    """Set the logits of forbidden tokens to -inf, in place. logits: [B, V]."""
    vocab_size = logits.shape[1]
    rows = logits[allowed.row_ids]  # [m, V]
    is_allowed = unpack_bitmask(allowed.bitmask, vocab_size)  # [m, V]
    logits[allowed.row_ids] = rows.masked_fill(~is_allowed, float("-inf"))


def unpack_bitmask(bitmask: Tensor, vocab_size: int) -> Tensor:
    """[m, W] int32 bitmask -> [m, vocab_size] bool, True where allowed."""
    shifts = torch.arange(BITS_PER_WORD, dtype=torch.int32, device=bitmask.device)  # [32]
    bits = (bitmask[:, :, None] >> shifts) & 1  # [m, W, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()  # [m, V]
