"""sluice's cache folder: what it keeps, keyed by content, bounded, listable.

    <cache_dir>/
      <stem>-<key>/            a GGUF converted to an HF folder (gguf_convert.py)
      <stem>-<key>-meta/       the same without weights (config and tokenizer only)
      calibration/             activation maxima and kernel plans, a few KB each
      native/                  the compiled kernels (models/native/build.py)
      content/                 memo: a file's identity -> the digest of its bytes

A converted folder is named after the digest of the GGUF's bytes (not its
path): two copies of one file, in two virtual environments say, share one
folder, and an edited file gets a new one. Hashing reads the file once
(about a second a GB); the memo keeps the digest under the file's path,
size, mtime and inode, so later starts read nothing.

The converted folders are bounded in bytes (`--cache-max-bytes`): after a
conversion, the least recently used others are removed until the total fits;
the folder in use is never removed, so one model larger than the bound still
works. A folder's mtime is its last use. Removing a folder that another
server has loaded is safe: its files are open or mapped, and the kernel keeps
them until they are closed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CONTENT_MEMO = "content"
# The per-file sub-folders that are not converted models.
_SUPPORT_FOLDERS = frozenset({CONTENT_MEMO, "calibration", "native"})
_READ_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One thing under the cache folder, as `sluice cache list` shows it."""

    name: str
    path: Path
    size_bytes: int
    last_used_s: float  # epoch seconds
    # A converted model (bounded, pruned) or support files (listed only).
    is_model: bool


def content_digest(path: Path, cache_dir: Path) -> str:
    """sha256 of the file's bytes, hex; read once per (path, size, mtime, inode)."""
    stat = path.stat()
    identity = f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ino}"
    memo = cache_dir / CONTENT_MEMO / hashlib.sha256(identity.encode()).hexdigest()[:32]
    try:
        known = memo.read_text(encoding="ascii").strip()
        if len(known) == 64:
            return known
    except OSError:
        pass  # not hashed yet (or unreadable): hash it
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(_READ_BYTES):
            digest.update(block)
    value = digest.hexdigest()
    _write_atomically(memo, value)
    return value


def mark_used(folder: Path) -> None:
    """Record a use of a converted folder (its mtime), for the LRU bound."""
    # A read-only cache still serves; it just is not pruned by use.
    with contextlib.suppress(OSError):
        os.utime(folder)


def entries(cache_dir: Path) -> list[CacheEntry]:
    """Everything under `cache_dir`, least recently used first."""
    try:
        found = [entry for entry in os.scandir(cache_dir) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    listed = [
        CacheEntry(
            name=entry.name,
            path=Path(entry.path),
            size_bytes=_tree_bytes(Path(entry.path)),
            last_used_s=entry.stat(follow_symlinks=False).st_mtime,
            is_model=entry.name not in _SUPPORT_FOLDERS,
        )
        for entry in found
        if not entry.name.startswith(".")  # a conversion in progress
    ]
    return sorted(listed, key=lambda entry: entry.last_used_s)


def prune(cache_dir: Path, max_bytes: int, keep: Path | None = None) -> list[CacheEntry]:
    """Remove least recently used converted folders (never `keep`) until they
    total at most `max_bytes`; returns what was removed."""
    models = [entry for entry in entries(cache_dir) if entry.is_model]
    total = sum(entry.size_bytes for entry in models)
    removed = []
    for entry in models:
        if total <= max_bytes:
            break
        if keep is not None and entry.path == keep:
            continue
        remove(entry)
        total -= entry.size_bytes
        removed.append(entry)
    return removed


def remove(entry: CacheEntry) -> None:
    """Remove one entry: renamed aside first, so no reader sees half a folder."""
    aside = entry.path.with_name(f".removing-{entry.name}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(entry.path, aside)
    except OSError:
        return  # already gone (another process pruned it)
    shutil.rmtree(aside, ignore_errors=True)


def _tree_bytes(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _write_atomically(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".", dir=path.parent)
        with os.fdopen(fd, "w", encoding="ascii") as file:
            file.write(text)
        os.replace(temp, path)
    except OSError:
        pass  # a read-only cache: the digest is computed again next time
