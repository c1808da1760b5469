"""Paged KV cache accounting, with automatic prefix caching. Pure bookkeeping;
the runner owns the tensors, sized `num_blocks` blocks of `block_size_tokens`
slots.

A request's block table (`Request.block_ids`) lists its blocks in position
order: position p lives in slot `p % block_size_tokens` of block
`block_ids[p // block_size_tokens]`. Blocks are handed out as a request grows
and all returned at once when it finishes, is aborted or is preempted.

Prefix caching: once every slot of a block is computed, the block is named by
a chained hash of every token up to its end (and the cache's salt, which
stands for anything else that changes the contents, such as the model and
its dtype). A request being admitted starts with the longest run of named
blocks matching its tokens, shared with whoever else holds them, and
computes from the first token they lack; the last known token is always
computed (its logits are needed). A named block that nobody holds any more
stays named in an LRU list, reused on a hit, and given away to fresh
allocations only when no never-named block is left (least recently freed
first, a request's tail before its head). Among free blocks, one written
before (a nameless tail, or any block without prefix caching) is handed out
before one never written. The blocks ever written are, on a CPU, the pool's
resident memory (`num_written_blocks`, models/zero_pages.py): without prefix
caching, the most blocks held at once; with it, more as named blocks are kept
for hits, up to the whole pool. A shared block is never written:
a request only ever writes slots past its computed tokens, and a named block
is full.

Cache tiers (sluice/engine/kv_tiers.py): with a `tier`, a lookup that runs
out of named blocks asks the tier for the next names of its chain; a block
the tier holds is taken from the free list, named, and listed as a LOAD in
`transfers`; a named block given away is listed as an EVICT, a block named
anew as a NAME. The engine loop applies `take_transfers()` in order before
the next forward pass, so a loaded block holds its contents before anyone
reads it and an evicted one is copied before anyone writes it. The pool
itself stays bookkeeping.

Invariants (checked by `check_consistency`): every block id is exactly one
of free, cached-free (named, held by nobody) or held; a held block's
reference count is the number of block tables that list it; names and blocks
map one to one; a free block has no name.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable

from sluice.engine.block_transfer import BlockTier, BlockTransfer, TransferKind
from sluice.engine.request import Request


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size_tokens: int,
        *,
        enable_prefix_caching: bool = True,
        cache_salt: bytes = b"",
        tier: BlockTier | None = None,
    ) -> None:
        if num_blocks <= 0 or block_size_tokens <= 0:
            raise ValueError(
                f"need num_blocks > 0 and block_size_tokens > 0, "
                f"got {num_blocks} and {block_size_tokens}"
            )
        self.num_blocks = num_blocks
        self.block_size_tokens = block_size_tokens
        self.enable_prefix_caching = enable_prefix_caching
        # The name every chain starts from.
        self._root_hash = hashlib.blake2b(b"sluice-kv\0" + cache_salt, digest_size=16).digest()
        # Never named (or name dropped), held by nobody.
        self._free_block_ids: deque[int] = deque(range(num_blocks))
        # Named, held by nobody, least recently freed first.
        self._cached_free: OrderedDict[int, None] = OrderedDict()
        # Held blocks: how many block tables list each.
        self._ref_count: dict[int, int] = {}
        self._hash_by_block: dict[int, bytes] = {}
        self._block_by_hash: dict[bytes, int] = {}
        # Blocks ever handed out, each counted once: on a CPU the pool's pages
        # become resident as blocks are first written (models/zero_pages.py),
        # so this times a block's bytes is the KV memory the process holds.
        self.num_written_blocks = 0
        self._is_written = bytearray(num_blocks)
        # Tokens looked up and found by requests at their first admission (for
        # metrics; a lookup whose admission failed is not counted: it is tried
        # again, nor is a preempted request's return).
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        # Cache tiers below the pool; None: the pool only.
        self.tier = tier if enable_prefix_caching else None
        # What the engine loop must apply before the next forward pass, in order.
        self.transfers: list[BlockTransfer] = []

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: never named, or named but held by nobody."""
        return len(self._free_block_ids) + len(self._cached_free)

    @property
    def usage(self) -> float:
        """Fraction of the pool held by requests, 0.0 .. 1.0."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    @property
    def capacity_tokens(self) -> int:
        """The most tokens one request could ever hold (the whole pool)."""
        return self.num_blocks * self.block_size_tokens

    def num_holders(self, block_id: int) -> int:
        """How many block tables list `block_id`."""
        return self._ref_count.get(block_id, 0)

    def is_named(self, block_id: int) -> bool:
        """Whether `block_id` is a full block a later request may find by its tokens."""
        return block_id in self._hash_by_block

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size_tokens)  # ceil division

    def num_missing_blocks(self, request: Request, num_new_tokens: int) -> int:
        """Blocks the request lacks to hold its computed tokens plus
        `num_new_tokens` more."""
        num_needed = self.num_blocks_for(request.num_computed_tokens + num_new_tokens)
        return max(0, num_needed - len(request.block_ids))

    def can_allocate(self, request: Request, num_new_tokens: int) -> bool:
        return self.num_missing_blocks(request, num_new_tokens) <= self.num_free_blocks

    def num_allocatable_tokens(self, request: Request) -> int:
        """The most new tokens `allocate_slots` could give the request now: the
        empty slots of its blocks plus every free block's."""
        num_slots = (len(request.block_ids) + self.num_free_blocks) * self.block_size_tokens
        return num_slots - request.num_computed_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Grow the request's block table so that num_computed_tokens +
        num_new_tokens fit. All or nothing: False leaves everything unchanged."""
        num_missing = self.num_missing_blocks(request, num_new_tokens)
        if num_missing > self.num_free_blocks:
            return False
        for _ in range(num_missing):
            block_id = self._take_free_block()
            self._ref_count[block_id] = 1
            request.block_ids.append(block_id)
        return True

    def take_cached_prefix(self, request: Request) -> int:
        """Start a request that holds no blocks at the end of its longest cached
        prefix: those blocks join its table and count as computed. Returns the
        number of tokens found (a multiple of the block size; 0 without prefix
        caching)."""
        assert not request.block_ids and request.num_computed_tokens == 0, (
            f"{request.request_id} already holds blocks"
        )
        if not self.enable_prefix_caching:
            return 0
        # The last known token is always computed: its logits are needed.
        num_reusable_blocks = (request.num_tokens - 1) // self.block_size_tokens
        self._extend_hashes(request, num_reusable_blocks)
        for block_hash in request.block_hashes[:num_reusable_blocks]:
            block_id = self._block_by_hash.get(block_hash)
            if block_id is None:
                block_id = self._load_from_tier(block_hash)
                if block_id is None:
                    break
            elif block_id in self._cached_free:
                del self._cached_free[block_id]
            self._ref_count[block_id] = self._ref_count.get(block_id, 0) + 1
            request.block_ids.append(block_id)
        request.num_named_blocks = len(request.block_ids)
        num_hit_tokens = len(request.block_ids) * self.block_size_tokens
        request.num_computed_tokens = num_hit_tokens
        return num_hit_tokens

    def _load_from_tier(self, block_hash: bytes) -> int | None:
        """A free block named `block_hash`, to be filled from the tier (held by
        nobody yet); None if the tier lacks it or no block is free."""
        if self.tier is None or not self.num_free_blocks:
            return None
        payload = self.tier.fetch(block_hash)
        if payload is None:
            return None
        block_id = self._take_free_block()
        self._name(block_id, block_hash)
        self.transfers.append(BlockTransfer(TransferKind.LOAD, block_id, block_hash, payload))
        return block_id

    def take_transfers(self) -> list[BlockTransfer]:
        """The transfers listed since the last call, in order."""
        transfers, self.transfers = self.transfers, []
        return transfers

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count the lookup of a request admitted with it for the first time."""
        if self.enable_prefix_caching:
            self.num_queried_tokens += num_tokens
            self.num_hit_tokens += num_hit_tokens

    def cache_full_blocks(self, request: Request) -> None:
        """Name the request's blocks that its computed tokens now fill."""
        if not self.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // self.block_size_tokens
        if num_full <= request.num_named_blocks:
            return
        self._extend_hashes(request, num_full)
        for index in range(request.num_named_blocks, num_full):
            block_id = request.block_ids[index]
            block_hash = request.block_hashes[index]
            if block_hash in self._block_by_hash:
                continue  # the same tokens computed into another block: keep that one
            self._name(block_id, block_hash)
            if self.tier is not None:
                self.transfers.append(BlockTransfer(TransferKind.NAME, block_id, block_hash))
        request.num_named_blocks = num_full

    def _name(self, block_id: int, block_hash: bytes) -> None:
        self._hash_by_block[block_id] = block_hash
        self._block_by_hash[block_hash] = block_id

    def free(self, request: Request) -> None:
        """Drop the request's hold on every block of its table. Idempotent."""
        # Tail first: among blocks freed together, the tail is evicted first.
        for block_id in reversed(request.block_ids):
            count = self._ref_count.get(block_id)
            assert count, f"block {block_id} is in {request.request_id}'s table but not held"
            if count > 1:
                self._ref_count[block_id] = count - 1
                continue
            del self._ref_count[block_id]
            if block_id in self._hash_by_block:
                self._cached_free[block_id] = None
            else:  # written and nameless: reuse it before a block never written
                self._free_block_ids.appendleft(block_id)
        request.block_ids.clear()
        request.num_named_blocks = 0

    def free_tail(self, request: Request, num_tokens: int) -> None:
        """Give back the blocks past those `num_tokens` tokens need: after a
        speculative step, the blocks that held only rejected positions (never
        named: a name needs computed tokens filling the block)."""
        num_kept = self.num_blocks_for(num_tokens)
        while len(request.block_ids) > num_kept:
            block_id = request.block_ids.pop()
            assert self._ref_count.get(block_id) == 1 and block_id not in self._hash_by_block, (
                f"block {block_id} past {request.request_id}'s tokens is shared or named"
            )
            del self._ref_count[block_id]
            self._free_block_ids.appendleft(block_id)  # written by nobody: reuse first

    def reset_prefix_cache(self) -> None:
        """Forget every name: cached blocks become plain free blocks."""
        self._free_block_ids.extend(self._cached_free)
        self._cached_free.clear()
        self._hash_by_block.clear()
        self._block_by_hash.clear()

    def _take_free_block(self) -> int:
        if self._free_block_ids:
            return self._mark_written(self._free_block_ids.popleft())
        block_id, _ = self._cached_free.popitem(last=False)  # evict the least recent
        block_hash = self._hash_by_block.pop(block_id)
        del self._block_by_hash[block_hash]
        if self.tier is not None:
            self.transfers.append(BlockTransfer(TransferKind.EVICT, block_id, block_hash))
        return block_id

    def _extend_hashes(self, request: Request, num_blocks: int) -> None:
        """Make `request.block_hashes` name its first `num_blocks` full blocks."""
        hashes = request.block_hashes
        size = self.block_size_tokens
        tokens = request.all_token_ids
        while len(hashes) < num_blocks:
            start = len(hashes) * size
            parent = hashes[-1] if hashes else self._root_hash
            data = array("q", tokens[start : start + size]).tobytes()
            hashes.append(hashlib.blake2b(parent + data, digest_size=16).digest())

    def _mark_written(self, block_id: int) -> int:
        if not self._is_written[block_id]:
            self._is_written[block_id] = 1
            self.num_written_blocks += 1
        return block_id

    def check_consistency(self, requests: Iterable[Request] | None = None) -> None:
        """Raise AssertionError unless free, cached-free and held blocks are
        disjoint and make the whole pool, and the names map one to one. With
        `requests` (every request holding blocks), also that each held block's
        reference count is the number of their tables listing it."""
        free = set(self._free_block_ids)
        cached = set(self._cached_free)
        held = set(self._ref_count)
        _require(len(free) == len(self._free_block_ids), "duplicate ids in the free list")
        _require(not free & cached, f"blocks both free and cached: {sorted(free & cached)}")
        _require(not (free | cached) & held, "blocks both free and held")
        _require(free | cached | held == set(range(self.num_blocks)), "blocks lost from the pool")
        _require(not free & set(self._hash_by_block), "a free block keeps a name")
        _require(cached <= set(self._hash_by_block), "a cached block without a name")
        _require(
            all(self._block_by_hash.get(h) == b for b, h in self._hash_by_block.items())
            and len(self._block_by_hash) == len(self._hash_by_block),
            "names and blocks do not map one to one",
        )
        if requests is None:
            return
        counts: dict[int, int] = {}
        for request in requests:
            table = request.block_ids
            _require(len(set(table)) == len(table), f"{request.request_id} repeats a block")
            for block_id in table:
                counts[block_id] = counts.get(block_id, 0) + 1
        _require(counts == self._ref_count, "reference counts disagree with the block tables")


def _require(condition: bool, message: str) -> None:
    # Not `assert`: tests rely on these checks even under `python -O`.
    if not condition:
        raise AssertionError(message)
