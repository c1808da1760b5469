"""How the engine core builds its prefix-cache tiers (sluice/engine/kv_tiers.py)
from the config: the RAM tier's bound, and the disk tier's fingerprint.

The fingerprint names everything besides a block's tokens that decides its
bits, so that a disk block is reused only by a server that would compute the
same one: the model's file contents (hashed, never their paths or times),
the weight and KV dtypes, the numeric choices (quantization, activations,
batch invariance), the block size and the block's byte layout, the kernel
plan, the torch version, and the contents of sluice's model code and native
kernels. Anything missed here would let two servers share wrong blocks, so
it errs on the side of more: a change that does not alter bits only costs
a cold cache.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

import torch
from torch import Tensor

from sluice.config import EngineConfig
from sluice.engine.kv_disk import DiskBlockStore
from sluice.engine.kv_tiers import (
    HostBlockStore,
    KVTiers,
    available_memory_bytes,
    content_hash,
    default_ram_bytes,
)
from sluice.engine.startup import kv_dtype_of
from sluice.loader import LoadedModel

logger = logging.getLogger("sluice.engine")

# The files of a model folder whose contents decide the weights.
MODEL_FILE_SUFFIXES = (".safetensors", ".gguf", ".json", ".bin")
MODEL_CODE = Path(__file__).resolve().parents[1] / "models"


def build_tiers(
    config: EngineConfig, loaded: LoadedModel, dtype: torch.dtype, kv_caches: list[Tensor]
) -> KVTiers | None:
    """The tiers the config asks for; None without prefix caching or any tier."""
    cache = config.cache
    if not cache.enable_prefix_caching:
        return None
    ram_bytes = cache.kv_offload_bytes
    if ram_bytes is None:
        ram_bytes = default_ram_bytes(available_memory_bytes())
    ram = HostBlockStore(ram_bytes) if ram_bytes > 0 else None
    tiers = KVTiers(kv_caches, cache.block_size_tokens, ram)
    if cache.kv_cache_dir is not None:
        fingerprint = disk_fingerprint(config, loaded, dtype, tiers.block_bytes)
        tiers.disk = DiskBlockStore(
            cache.kv_cache_dir, fingerprint, tiers.block_bytes, cache.kv_cache_dir_bytes
        )
    if tiers.ram is None and tiers.disk is None:
        return None
    logger.info("%s", describe_tiers(tiers))
    return tiers


def describe_tiers(tiers: KVTiers) -> str:
    """ "prefix cache tiers: RAM up to 5.0 GiB (14,563 blocks of 16 tokens), disk
    DIR up to 16.0 GiB" for the log at start."""
    parts = []
    if tiers.ram is not None:
        num_blocks = tiers.ram.capacity_bytes // max(1, tiers.block_bytes)
        parts.append(
            f"RAM up to {tiers.ram.capacity_bytes / 2**30:.1f} GiB ({num_blocks:,} blocks of "
            f"{tiers.block_size_tokens} tokens)"
        )
    if tiers.disk is not None:
        parts.append(f"disk {tiers.disk.folder} up to {tiers.disk.capacity_bytes / 2**30:.1f} GiB")
    return "prefix cache tiers: " + ", ".join(parts)


def disk_fingerprint(
    config: EngineConfig, loaded: LoadedModel, dtype: torch.dtype, block_bytes: int
) -> bytes:
    """16 bytes naming what decides a block's bits besides its tokens."""
    choices = loaded.choices
    described = "\0".join(
        str(part)
        for part in (
            "sluice-kv-disk-1",
            dtype,
            kv_dtype_of(config, dtype),  # a bf16 block is never read as int8
            choices.dtype,
            choices.quantization,
            choices.activations,
            config.model.batch_invariant,
            config.cache.block_size_tokens,
            block_bytes,
            plan_choices(loaded.kernel_plan),
            torch.__version__,
            loaded.model_config,
        )
    )
    digest = hashlib.blake2b(described.encode(), digest_size=16)
    digest.update(content_hash(model_files(config.model.model, loaded.folder)))
    digest.update(content_hash(sorted(p for p in MODEL_CODE.rglob("*") if _is_code(p))))
    return digest.digest()


def model_files(model: str, folder: Path) -> list[Path]:
    """The files whose contents are the model: its folder's weights and
    configs, and the file it was given as (a .gguf)."""
    files = sorted(p for p in Path(folder).iterdir() if p.suffix in MODEL_FILE_SUFFIXES)
    given = Path(model)
    if given.is_file() and given.resolve() not in {p.resolve() for p in files}:
        files.append(given)
    return files


def plan_choices(kernel_plan: str) -> str:
    """The kernel plan's choices without how it came ("measured at load" on
    the first start, "cached" on the next: the same kernels)."""
    return re.sub(r"^kernel plan \(.*?\): ", "kernel plan: ", kernel_plan)


def _is_code(path: Path) -> bool:
    return path.is_file() and path.suffix in (".py", ".c", ".h")
