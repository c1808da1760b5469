"""The disk tier of the prefix cache (`--kv-cache-dir`): full KV blocks as
files, kept across restarts and shared by every server on the same folder.

A block's file is `DIR/<fingerprint>/<name[:2]>/<name>.kvb`: `name` is the
block's prefix hash chain (sluice/engine/kv_cache.py), `fingerprint` a hash
of everything that decides the block's bits besides its tokens (model file
contents, dtypes, block size, kernel plan, the model code: `kv_tiers.py`
builds it). A file is a fixed header (magic, format version, fingerprint,
name, payload length, BLAKE2b of the payload) and the payload.

Guarantees:
- crash-safe: a file is written under a temporary name, fsynced and renamed
  into place, so a reader sees a whole file or none; leftovers of a killed
  writer are temporary names, never read, removed after an hour;
- a file is used only if its header names this fingerprint and block, its
  length is this model's block size and its checksum holds: a torn,
  corrupted or foreign file is counted (`num_bad_files`), removed and read
  as a miss;
- bounded: past `capacity_bytes` the least recently used files go (a hit
  touches its file), across every fingerprint in the folder;
- writes never stop the engine: they run on a writer thread from a bounded
  queue (a full queue drops the block, counted); a failed write (a full
  disk, a read-only folder) is counted and forgotten;
- two servers on one folder: both write the same bits for a name, and a
  rename is atomic, so either file is whole and right.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger("sluice.engine")

MAGIC = b"SLUICEKV"
FORMAT_VERSION = 1
# magic, version, fingerprint, block name, payload bytes, BLAKE2b-256 of the payload
HEADER = struct.Struct("<8sI16s16sQ32s")
SUFFIX = ".kvb"
TEMP_PREFIX = ".tmp-"
# A temporary file this old belongs to a writer that died.
STALE_TEMP_S = 3600.0
# Blocks waiting for the writer thread; more are dropped (counted).
WRITE_QUEUE_BLOCKS = 256
# After going over the bound, evict down to this share of it (fewer scans).
EVICT_TO_SHARE = 0.9


@dataclass(slots=True)
class DiskStats:
    """Since the engine started (the writer thread adds to the write counts)."""

    num_hits: int = 0
    num_misses: int = 0
    bytes_read: int = 0
    num_written: int = 0
    bytes_written: int = 0
    # Files that were torn, corrupted or foreign: ignored and removed.
    num_bad_files: int = 0
    # Writes that failed (full disk, read-only folder) or were dropped.
    num_write_failures: int = 0
    num_dropped_writes: int = 0
    num_evicted: int = 0
    # The folder's size as last counted (every fingerprint).
    usage_bytes: int = 0


class DiskBlockStore:
    def __init__(
        self, folder: Path, fingerprint: bytes, block_bytes: int, capacity_bytes: int
    ) -> None:
        assert len(fingerprint) == 16, "a 16-byte fingerprint"
        self.root = Path(folder)
        self.folder = self.root / fingerprint.hex()
        self.fingerprint = fingerprint
        self.block_bytes = block_bytes
        self.capacity_bytes = capacity_bytes
        self.stats = DiskStats()
        self._queue: queue.Queue[tuple[bytes, bytes] | None] = queue.Queue(WRITE_QUEUE_BLOCKS)
        self._lock = threading.Lock()  # the writer's counters against the loop's reads
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            logger.warning(
                "kv cache dir %s unusable (%s): disk tier writes will fail", folder, error
            )
        self.stats.usage_bytes = self._scan_usage()
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk", daemon=True)
        self._writer.start()

    def path_of(self, block_hash: bytes) -> Path:
        name = block_hash.hex()
        return self.folder / name[:2] / f"{name}{SUFFIX}"

    # -- reads (engine loop) ------------------------------------------------

    def read(self, block_hash: bytes) -> torch.Tensor | None:
        """The block's bytes [block_bytes] uint8, or None (absent, unreadable or bad)."""
        path = self.path_of(block_hash)
        try:
            data = path.read_bytes()
        except OSError:
            self.stats.num_misses += 1
            return None
        payload = self._payload_of(data, block_hash)
        if payload is None:
            self.stats.num_bad_files += 1
            self.stats.num_misses += 1
            _remove_quietly(path)
            return None
        self.stats.num_hits += 1
        self.stats.bytes_read += len(data)
        with contextlib.suppress(OSError):
            os.utime(path)  # least recently used goes first
        return torch.frombuffer(bytearray(payload), dtype=torch.uint8)

    def _payload_of(self, data: bytes, block_hash: bytes) -> bytes | None:
        if len(data) != HEADER.size + self.block_bytes:
            return None
        magic, version, fingerprint, name, length, checksum = HEADER.unpack_from(data)
        payload = data[HEADER.size :]
        is_ours = (magic, version, fingerprint, name) == (
            MAGIC,
            FORMAT_VERSION,
            self.fingerprint,
            block_hash,
        )
        if not is_ours or length != len(payload) or checksum != _checksum(payload):
            return None
        return payload

    def contains(self, block_hash: bytes) -> bool:
        return self.path_of(block_hash).exists()

    # -- writes (queued by the loop, done by the writer thread) -------------

    def write(self, block_hash: bytes, payload: torch.Tensor) -> None:
        """Queue the block's bytes for writing; dropped (counted) if the queue is full."""
        if HEADER.size + self.block_bytes > self.capacity_bytes or self.contains(block_hash):
            return
        try:
            self._queue.put_nowait((block_hash, payload.numpy().tobytes()))
        except queue.Full:
            with self._lock:
                self.stats.num_dropped_writes += 1

    def flush(self) -> None:
        """Wait until every queued block is written (or failed)."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, then stop the writer thread."""
        self._queue.put(None)
        self._writer.join()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write_file(*item)
            finally:
                self._queue.task_done()

    def _write_file(self, block_hash: bytes, payload: bytes) -> None:
        path = self.path_of(block_hash)
        header = HEADER.pack(
            MAGIC, FORMAT_VERSION, self.fingerprint, block_hash, len(payload), _checksum(payload)
        )
        temp = path.parent / f"{TEMP_PREFIX}{os.getpid()}-{threading.get_ident()}-{path.name}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(temp, "wb") as file:
                file.write(header)
                file.write(payload)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, path)
        except OSError as error:
            _remove_quietly(temp)
            with self._lock:
                self.stats.num_write_failures += 1
            logger.debug("kv cache block write failed: %s", error)
            return
        with self._lock:
            self.stats.num_written += 1
            self.stats.bytes_written += len(header) + len(payload)
            self.stats.usage_bytes += len(header) + len(payload)
            if self.stats.usage_bytes > self.capacity_bytes:
                self._evict()

    # -- the bound ----------------------------------------------------------

    def _files(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every block file under the root; removes
        temporary files left by dead writers."""
        found = []
        now = time.time()
        for directory, _subdirs, names in os.walk(self.root):
            for name in names:
                path = Path(directory) / name
                try:
                    info = path.stat()
                except OSError:
                    continue
                if name.startswith(TEMP_PREFIX):
                    if now - info.st_mtime > STALE_TEMP_S:
                        _remove_quietly(path)
                elif name.endswith(SUFFIX):
                    found.append((info.st_mtime, info.st_size, path))
        return found

    def _scan_usage(self) -> int:
        return sum(size for _mtime, size, _path in self._files())

    def _evict(self) -> None:
        """Remove the least recently used files (any server's) down to the bound's share."""
        files = sorted(self._files())
        usage = sum(size for _mtime, size, _path in files)
        target = self.capacity_bytes * EVICT_TO_SHARE
        for _mtime, size, path in files:
            if usage <= target:
                break
            if _remove_quietly(path):
                self.stats.num_evicted += 1
            usage -= size
        self.stats.usage_bytes = usage


def _checksum(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=32).digest()


def _remove_quietly(path: Path) -> bool:
    try:
        path.unlink()
    except OSError:
        return False
    return True
