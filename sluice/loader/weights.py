"""Safetensors checkpoints of an HF folder: find the files, stream the tensors.

A folder holds either one or more `*.safetensors` files, or a sharded
checkpoint described by `model.safetensors.index.json` (tensor name -> shard
file). Invariant: `checkpoint_files` returns only files that exist, and every
shard the index names is among them; tensors are read one at a time from a
memory map, so loading never holds a second full copy of the weights.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from sluice.errors import ModelLoadError

INDEX_FILE = "model.safetensors.index.json"


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files to load, in a stable order; ModelLoadError if any is missing."""
    index = folder / INDEX_FILE
    if index.is_file():
        return _shards_from_index(index)
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise ModelLoadError(
            f"no *.safetensors weights in {folder} (only PyTorch .bin/.pt files, "
            "which sluice does not load)"
        )
    raise ModelLoadError(f"no *.safetensors weights in {folder}")


def iter_weights(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF tensor name, CPU tensor) for every tensor of every file, one at a time."""
    for path in files:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as checkpoint:
                for name in checkpoint.keys():  # noqa: SIM118 (safe_open is not a dict)
                    yield name, checkpoint.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
            # A truncated or malformed file surfaces as one of these.
            raise ModelLoadError(f"unreadable weights file {path}: {exc}") from exc


def _shards_from_index(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shard_names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(f"unreadable {INDEX_FILE} in {index.parent}: {exc!r}") from exc
    shards = [index.parent / name for name in shard_names]
    for shard in shards:
        if not shard.is_file():
            raise ModelLoadError(
                f"weights shard {shard.name} named in {INDEX_FILE} is missing from {index.parent}"
            )
    return shards
