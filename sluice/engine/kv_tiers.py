"""The prefix cache's tiers below the KV block pool: host RAM and disk.

The pool (sluice/engine/kv_cache.py) keeps named blocks nobody holds until it
needs their room. With tiers, a named block it gives away is copied to a
bounded host-RAM store (`--kv-offload-bytes`, LRU by bytes), and every block
named anew is written to the disk tier when there is one (`--kv-cache-dir`,
sluice/engine/kv_disk.py). A request whose chain of block names runs past the
pool's blocks asks the tiers for the next names, RAM first: a block found
there is loaded into a free pool block instead of being recomputed, and
counts as cached (`cached_tokens` in usage counts every tier).

One owner: `KVTiers` is called by the engine loop only. The pool lists its
moves while it schedules; `apply` runs them in order before the next forward
pass (a loaded block is filled before anyone reads it, an evicted one copied
before anyone writes it). The disk tier's writer thread only ever sees bytes
already copied out of the pool.

A restored block holds the bits of the run that computed it, so the tokens
after it are those of a cold run exactly where the KV of a prompt ignores its
chunking: at every length with the row-invariant default, whose attention is
chunk-blind (docs/ARCHITECTURE.md, issue 44), and with --batch-invariant
(tests/test_models_prefix_bits.py).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from sluice.engine.block_transfer import BlockTransfer, TransferKind
from sluice.engine.kv_disk import DiskBlockStore, DiskStats
from sluice.engine.messages import KVTierStats

# The RAM tier's default bound: llama.cpp's --cache-ram default (8 GiB), or a
# quarter of the memory available at start where that is less. It is a cap,
# not a reservation: the store holds only blocks the pool evicted.
DEFAULT_RAM_BYTES = 8 << 30
DEFAULT_RAM_SHARE = 0.25


class HostBlockStore:
    """Blocks' bytes by name in host RAM, at most `capacity_bytes`, least
    recently used dropped first."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.num_bytes = 0
        self.num_evicted = 0
        self._blocks: OrderedDict[bytes, Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._blocks

    def get(self, block_hash: bytes) -> Tensor | None:
        data = self._blocks.get(block_hash)
        if data is not None:
            self._blocks.move_to_end(block_hash)
        return data

    def put(self, block_hash: bytes, data: Tensor) -> bool:
        """Keep `data` (not copied: the caller gives it up); False if it can never fit."""
        if data.numel() > self.capacity_bytes:
            return False
        if block_hash in self._blocks:
            self._blocks.move_to_end(block_hash)
            return True
        self._blocks[block_hash] = data
        self.num_bytes += data.numel()
        while self.num_bytes > self.capacity_bytes:
            _, dropped = self._blocks.popitem(last=False)
            self.num_bytes -= dropped.numel()
            self.num_evicted += 1
        return True

    def clear(self) -> None:
        self._blocks.clear()
        self.num_bytes = 0


@dataclass(slots=True)
class TierStats:
    """Since the engine started, in tokens and bytes."""

    # Tokens looked up in the tiers (past the pool's own blocks), and found.
    queried_tokens: int = 0
    hit_tokens: int = 0
    # The RAM tier's blocks asked for and found.
    ram_queried_blocks: int = 0
    ram_hit_blocks: int = 0
    # Bytes copied: pool to RAM (evictions), RAM or disk to pool (loads),
    # pool to the disk writer (new blocks).
    bytes_pool_to_ram: int = 0
    bytes_ram_to_pool: int = 0
    bytes_disk_to_pool: int = 0
    bytes_pool_to_disk: int = 0


class KVTiers:
    """The `BlockTier` the pool asks, and the hand that moves block contents."""

    def __init__(
        self,
        kv_caches: list[Tensor],
        block_size_tokens: int,
        ram: HostBlockStore | None,
        disk: DiskBlockStore | None = None,
    ) -> None:
        self.kv_caches = kv_caches
        self.block_size_tokens = block_size_tokens
        self.ram = ram
        self.disk = disk
        self.stats = TierStats()

    @property
    def block_bytes(self) -> int:
        return sum(view.numel() * view.element_size() for view in self._views(0))

    def fetch(self, block_hash: bytes) -> Tensor | None:
        """The block's bytes from RAM, else disk; None where neither has it."""
        self.stats.queried_tokens += self.block_size_tokens
        data = None
        if self.ram is not None:
            self.stats.ram_queried_blocks += 1
            data = self.ram.get(block_hash)
            if data is not None:
                self.stats.ram_hit_blocks += 1
                self.stats.bytes_ram_to_pool += data.numel()
        if data is None and self.disk is not None:
            data = self.disk.read(block_hash)
            if data is not None:
                self.stats.bytes_disk_to_pool += data.numel()
        if data is not None:
            self.stats.hit_tokens += self.block_size_tokens
        return data

    def apply(self, transfers: Iterable[BlockTransfer]) -> None:
        """Run the pool's moves in order (see the module docstring)."""
        for transfer in transfers:
            if transfer.kind is TransferKind.LOAD:
                assert isinstance(transfer.payload, Tensor), "a load carries the block's bytes"
                self._write_block(transfer.block_id, transfer.payload)
            elif transfer.kind is TransferKind.EVICT and self.ram is not None:
                if transfer.block_hash in self.ram:
                    self.ram.get(transfer.block_hash)  # most recent again
                    continue
                data = self.read_block(transfer.block_id)
                if self.ram.put(transfer.block_hash, data):
                    self.stats.bytes_pool_to_ram += data.numel()
            elif transfer.kind is TransferKind.NAME and self.disk is not None:
                self._write_through(transfer.block_id, transfer.block_hash)

    def _write_through(self, block_id: int, block_hash: bytes) -> None:
        """Queue a block named anew for the disk tier (unless a file has it)."""
        assert self.disk is not None, "with a disk tier only"
        if not self.disk.contains(block_hash):
            data = self.read_block(block_id)
            self.disk.write(block_hash, data)
            self.stats.bytes_pool_to_disk += data.numel()

    def read_block(self, block_id: int) -> Tensor:
        """A copy of the block's bytes over every layer: [block_bytes] uint8."""
        return torch.cat([view.reshape(-1).view(torch.uint8) for view in self._views(block_id)])

    def _write_block(self, block_id: int, data: Tensor) -> None:
        offset = 0
        for view in self._views(block_id):
            num_bytes = view.numel() * view.element_size()
            part = data[offset : offset + num_bytes].view(view.dtype).view(view.shape)
            view.copy_(part)
            offset += num_bytes
        assert offset == data.numel(), f"{data.numel()} bytes for a block of {offset}"

    def _views(self, block_id: int) -> list[Tensor]:
        """The block's slice of each layer: K and V of an attention layer
        [2, block_size, kv_heads, head_dim]; a hybrid conv layer's state
        snapshot at the block's end (row `block_id` of its states)."""
        return [
            cache[:, block_id] if cache.dim() == 5 else cache[block_id] for cache in self.kv_caches
        ]

    def clear_ram(self) -> None:
        if self.ram is not None:
            self.ram.clear()

    def close(self) -> None:
        """Finish the disk tier's queued writes."""
        if self.disk is not None:
            self.disk.close()


def default_ram_bytes(available_bytes: int | None) -> int:
    """The RAM tier's bound when none is given (see DEFAULT_RAM_BYTES)."""
    if available_bytes is None:
        return DEFAULT_RAM_BYTES
    return min(DEFAULT_RAM_BYTES, int(available_bytes * DEFAULT_RAM_SHARE))


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable of /proc/meminfo; None where there is no such file."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def content_hash(paths: Iterable[Path]) -> bytes:
    """BLAKE2b of the files' contents, in the order given (names not included)."""
    digest = hashlib.blake2b(digest_size=16)
    for path in paths:
        with open(path, "rb") as file:
            while chunk := file.read(1 << 24):
                digest.update(chunk)
        digest.update(b"\0file\0")
    return digest.digest()


def tier_stats(tiers: KVTiers | None) -> KVTierStats | None:
    """The tiers' counters for the engine's stats snapshot; None without tiers."""
    if tiers is None:
        return None
    stats, ram, disk = tiers.stats, tiers.ram, tiers.disk
    disk_stats = disk.stats if disk is not None else DiskStats()
    return KVTierStats(
        queried_tokens=stats.queried_tokens,
        hit_tokens=stats.hit_tokens,
        ram_queried_blocks=stats.ram_queried_blocks,
        ram_hit_blocks=stats.ram_hit_blocks,
        ram_evicted_blocks=ram.num_evicted if ram is not None else 0,
        ram_bytes=ram.num_bytes if ram is not None else 0,
        ram_capacity_bytes=ram.capacity_bytes if ram is not None else 0,
        transfer_bytes={
            "pool_to_ram": stats.bytes_pool_to_ram,
            "ram_to_pool": stats.bytes_ram_to_pool,
            "disk_to_pool": stats.bytes_disk_to_pool,
            "pool_to_disk": stats.bytes_pool_to_disk,
        },
        disk_hits=disk_stats.num_hits,
        disk_misses=disk_stats.num_misses,
        disk_writes=disk_stats.num_written,
        disk_write_failures=disk_stats.num_write_failures + disk_stats.num_dropped_writes,
        disk_bad_files=disk_stats.num_bad_files,
        disk_evicted_files=disk_stats.num_evicted,
        disk_bytes=disk_stats.usage_bytes,
    )
