"""Paged KV cache accounting: which block ids are free and which request owns
each of the others. Pure bookkeeping; the runner owns the tensors, sized
`num_blocks` blocks of `block_size_tokens` slots.

A request's block table (`Request.block_ids`) lists its blocks in position
order: position p lives in slot `p % block_size_tokens` of block
`block_ids[p // block_size_tokens]`. Blocks are handed out as a request grows
and all returned at once when it finishes, is aborted or is preempted.

Invariants (checked by `check_consistency`): every block id is either free or
owned by exactly one request, never both; the free list holds no duplicates.
No prefix caching: blocks are never shared.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from sluice.engine.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size_tokens: int) -> None:
        if num_blocks <= 0 or block_size_tokens <= 0:
            raise ValueError(
                f"need num_blocks > 0 and block_size_tokens > 0, "
                f"got {num_blocks} and {block_size_tokens}"
            )
        self.num_blocks = num_blocks
        self.block_size_tokens = block_size_tokens
        self._free_block_ids: deque[int] = deque(range(num_blocks))
        # block id -> id of the request that owns it.
        self._owner_by_block: dict[int, str] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_block_ids)

    @property
    def usage(self) -> float:
        """Fraction of the pool in use, 0.0 .. 1.0."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    @property
    def capacity_tokens(self) -> int:
        """The most tokens one request could ever hold (the whole pool)."""
        return self.num_blocks * self.block_size_tokens

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size_tokens)  # ceil division

    def num_missing_blocks(self, request: Request, num_new_tokens: int) -> int:
        """Blocks the request lacks to hold its computed tokens plus
        `num_new_tokens` more."""
        num_needed = self.num_blocks_for(request.num_computed_tokens + num_new_tokens)
        return max(0, num_needed - len(request.block_ids))

    def can_allocate(self, request: Request, num_new_tokens: int) -> bool:
        return self.num_missing_blocks(request, num_new_tokens) <= self.num_free_blocks

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Grow the request's block table so that num_computed_tokens +
        num_new_tokens fit. All or nothing: False leaves everything unchanged."""
        num_missing = self.num_missing_blocks(request, num_new_tokens)
        if num_missing > self.num_free_blocks:
            return False
        for _ in range(num_missing):
            block_id = self._free_block_ids.popleft()
            self._owner_by_block[block_id] = request.request_id
            request.block_ids.append(block_id)
        return True

    def free(self, request: Request) -> None:
        """Return every block of the request to the pool. Idempotent."""
        for block_id in request.block_ids:
            owner = self._owner_by_block.pop(block_id, None)
            assert owner == request.request_id, (
                f"block {block_id} is in {request.request_id}'s table but owned by {owner}"
            )
            self._free_block_ids.append(block_id)
        request.block_ids.clear()

    def check_consistency(self, requests: Iterable[Request] | None = None) -> None:
        """Raise AssertionError unless free + owned == all blocks, disjoint and
        without duplicates. With `requests` (every request holding blocks),
        also that their block tables together are exactly the owned blocks,
        each owned under its table's request id, none in two tables."""
        free = set(self._free_block_ids)
        owned = set(self._owner_by_block)
        _require(len(free) == len(self._free_block_ids), "duplicate ids in the free list")
        _require(not free & owned, f"blocks both free and owned: {sorted(free & owned)}")
        _require(free | owned == set(range(self.num_blocks)), "blocks lost from the pool")
        if requests is None:
            return
        seen: set[int] = set()
        for request in requests:
            table = request.block_ids
            _require(not seen.intersection(table), f"{request.request_id} shares a block")
            seen.update(table)
            _require(len(set(table)) == len(table), f"{request.request_id} repeats a block")
            for block_id in table:
                owner = self._owner_by_block.get(block_id)
                _require(owner == request.request_id, f"block {block_id} owned by {owner}")
        _require(seen == owned, f"owned blocks in no table: {sorted(owned - seen)}")


def _require(condition: bool, message: str) -> None:
    # Not `assert`: tests rely on these checks even under `python -O`.
    if not condition:
        raise AssertionError(message)
