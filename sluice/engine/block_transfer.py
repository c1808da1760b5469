"""What moves between the KV block pool and the cache tiers below it: the
pool (sluice/engine/kv_cache.py) lists each move as a `BlockTransfer` while it
schedules, and the engine loop applies them in order before the next forward
pass (sluice/engine/kv_tiers.py). Pure values, no tensors: the pool stays
bookkeeping.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class TransferKind(enum.Enum):
    LOAD = "load"  # the tier's copy goes into the block
    EVICT = "evict"  # the block loses its name: its contents may leave for a tier
    NAME = "name"  # the block was just filled and named


@dataclass(slots=True)
class BlockTransfer:
    """One named block's contents moving between the pool and a cache tier."""

    kind: TransferKind
    block_id: int
    block_hash: bytes
    # LOAD: the tier's copy (opaque to the pool); None otherwise.
    payload: object = None


class BlockTier(Protocol):
    """Where blocks the pool lost may still be found (sluice/engine/kv_tiers.py)."""

    def fetch(self, block_hash: bytes) -> object | None:
        """The block named `block_hash`, held until the LOAD is applied; None if absent."""
        ...
