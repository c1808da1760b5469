"""The tokens a step's constrained rows may not sample, as one mask over the batch.

`forbidden_tokens(matchers, ...)` asks llguidance for the next-token bitmask
of every constrained row at once (filled in parallel, outside the GIL, into
one int32 array), unpacks it on the host (numpy, one pass) and returns a
[B, V] bool mask, True where a token is forbidden; free rows are all False.
`sluice.engine.sampling.processors` sets those logits to -inf with one
`masked_fill_`. A batch without constrained rows never gets here
(`sluice.engine.sampling.batch` leaves the mask None).

Bit j of word w of a row allows token 32 * w + j (llguidance's layout); read
as little-endian bytes, bit k of byte i allows token 8 * i + k.
"""

from __future__ import annotations

import functools

import llguidance
import numpy as np
import torch
from torch import Tensor

from sluice.structured.matcher import GrammarMatcher

BITS_PER_WORD = 32


@functools.cache
def _executor() -> llguidance.LLExecutor:
    # One per process: it owns a thread pool.
    return llguidance.LLExecutor()


def forbidden_tokens(
    matchers: list[GrammarMatcher | None], vocab_size: int, device: torch.device
) -> Tensor | None:
    """[B, V] bool, True where row i's grammar forbids the token; None when no
    row has a matcher."""
    constrained = [(i, m) for i, m in enumerate(matchers) if m is not None]
    if not constrained:
        return None
    num_words = (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD
    bitmask = np.empty((len(constrained), num_words), dtype=np.int32)  # [m, W]
    targets = [(m.matcher, k) for k, (_, m) in enumerate(constrained)]
    _executor().unsafe_compute_mask_ptr(
        targets, bitmask.ctypes.data, num_words * 4, len(constrained)
    )
    allowed = np.unpackbits(
        bitmask.view(np.uint8), axis=1, count=vocab_size, bitorder="little"
    )  # [m, V] uint8
    forbidden = np.zeros((len(matchers), vocab_size), dtype=np.bool_)  # [B, V]
    forbidden[[i for i, _ in constrained]] = allowed == 0
    return torch.from_numpy(forbidden).to(device, non_blocking=True)
