"""GGUF -> a cached Hugging Face folder, converted once.

Parsing a GGUF vocabulary into a fast tokenizer is slow pure Python, so a
GGUF is converted once into a folder under `ModelConfig.cache_dir`:

    config.json                 HF llama config from the GGUF metadata
    model.safetensors           dequantized float32 weights, HF names and layout (and
                                model-00002.safetensors... past SHARD_BYTES each,
                                then with model.safetensors.index.json)
    tokenizer.json              fast tokenizer built by transformers from the GGUF
                                (loader/gguf_tokenizer.py)
    tokenizer_config.json       special tokens
    chat_template.jinja         the GGUF's tokenizer.chat_template, when it has one
    generation_config.json      eos/bos token ids
    sluice_source.json          which file this came from, and its tensor types

Invariants:
- the folder name is keyed by the digest of the GGUF's bytes (and a format
  version; loader/model_cache.py), so two copies of one file share a folder
  and an edited or replaced file is converted again;
- the converted folders are bounded in bytes: after a conversion the least
  recently used others are removed (model_cache.prune);
- the folder appears atomically: everything is written into a temporary
  sibling and renamed into place, so a crash never leaves a half cache, and
  two processes converting at once both end with one complete folder;
- a temporary sibling names its owner (`.<folder>.<host>-<pid>.<random>`), so
  one left by a killed conversion (as big as the weights) is removed by the
  next start: when its owner process on this host is gone, or, owned
  elsewhere (a shared cache), when untouched for `STALE_TEMP_AGE_S`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader
from safetensors.numpy import save_file

from sluice.errors import ModelLoadError
from sluice.loader import gguf_llama, gguf_mxfp4, gguf_tokenizer, model_cache
from sluice.loader.weights import INDEX_FILE

# Bump when the folder layout or tensor conversion changes: old caches are ignored.
CONVERSION_VERSION = 2
SOURCE_FILE = "sluice_source.json"
# Dequantized float32 weights are written in files of about this size, so a
# conversion holds one file's worth in memory (a 1B model is 4 GB in float32).
SHARD_BYTES = 1024 * 1024 * 1024
# A temporary folder whose owner cannot be checked (another host's, or one
# from before owners were named) is stale once untouched this long: far
# beyond the slowest conversion.
STALE_TEMP_AGE_S = 24 * 3600
# `.<stem>-<key>.<host>-<pid>.<mkdtemp's 8 characters>`; no owner part before
# owners were named.
_TEMP_NAME = re.compile(
    r"\.[^/]+-[0-9a-f]{16}(?:-meta)?\.(?:(?P<host>[\w-]+)-(?P<pid>\d+)\.)?[a-z0-9_]{8}"
)


def converted_folder(
    gguf_path: Path, cache_dir: Path, with_weights: bool = True, max_bytes: int | None = None
) -> Path:
    """The cached HF folder for `gguf_path`, converting it first if needed.

    `with_weights=False`: config and tokenizer only (a folder of its own, a
    few MB), for loads that read the weights from the GGUF itself
    (`--quantization gguf`: loader/gguf_tensors.py). `max_bytes`: the bound
    of the converted folders, applied after a conversion (None: unbounded)."""
    folder = cache_folder_for(gguf_path, cache_dir, with_weights)
    if folder.is_dir():
        remove_stale_temps(cache_dir)
        model_cache.mark_used(folder)
        return folder
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelLoadError(f"cannot create cache dir {cache_dir}: {exc.strerror}") from exc
    remove_stale_temps(cache_dir)
    owner = f"{host_name()}-{os.getpid()}"
    temp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.{owner}.", dir=cache_dir))
    try:
        temp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
        write_hf_folder(gguf_path, temp, with_weights=with_weights)
        _publish(temp, folder)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    model_cache.mark_used(folder)
    if max_bytes is not None:
        model_cache.prune(cache_dir, max_bytes, keep=folder)
    return folder


def cache_folder_for(gguf_path: Path, cache_dir: Path, with_weights: bool = True) -> Path:
    """`<cache_dir>/<stem>-<key>`: key = hash of the file's bytes and the
    format version (and "-meta" for a folder without weights)."""
    path = gguf_path.resolve()
    identity = f"{model_cache.content_digest(path, cache_dir)}\0{CONVERSION_VERSION}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return cache_dir / f"{path.stem}-{key}{'' if with_weights else '-meta'}"


def remove_stale_temps(cache_dir: Path) -> None:
    """Remove the temporary conversion folders of conversions that died."""
    try:
        entries = [entry for entry in os.scandir(cache_dir) if _TEMP_NAME.fullmatch(entry.name)]
    except OSError:
        return  # no cache yet, or unreadable: nothing of ours to clean
    for entry in entries:
        if _is_stale(entry):
            shutil.rmtree(entry.path, ignore_errors=True)


def host_name() -> str:
    """This machine's name as temporary folder names hold it (no dots)."""
    return re.sub(r"[^\w-]", "_", socket.gethostname())


def _is_stale(entry: os.DirEntry) -> bool:
    match = _TEMP_NAME.fullmatch(entry.name)
    assert match is not None, "only temporary folder names are judged"
    if match["host"] == host_name():
        return not _is_running(int(match["pid"]))
    try:
        return time.time() - entry.stat().st_mtime > STALE_TEMP_AGE_S
    except OSError:
        return False


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def write_hf_folder(gguf_path: Path, folder: Path, with_weights: bool = True) -> None:
    """Write the HF folder for `gguf_path` into the existing `folder`."""
    # 1. Metadata and tensors, straight from the memory-mapped GGUF.
    reader = _open_reader(gguf_path)
    config = _guarded(gguf_path, lambda: gguf_llama.hf_config(reader))
    if with_weights:
        tensors = gguf_mxfp4.hf_tensors(reader, config)
        _guarded(gguf_path, lambda: _save_in_shards(tensors, folder))
    _write_json(folder / "config.json", config)
    _write_json(folder / "generation_config.json", _generation_config(config))
    # 2. The tokenizer: transformers' GGUF converter (the slow step).
    _write_tokenizer(gguf_path, folder)
    template = gguf_llama.field_value(reader, "tokenizer.chat_template")
    if template:
        (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    stat = gguf_path.stat()
    source = {
        "gguf_path": str(gguf_path.resolve()),
        "size_bytes": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "conversion_version": CONVERSION_VERSION,
        # GGUF name -> GGUF type ("Q4_1", "F32", ...): how the weights came.
        "tensor_types": {tensor.name: tensor.tensor_type.name for tensor in reader.tensors},
    }
    _write_json(folder / SOURCE_FILE, source)


def _save_in_shards(tensors: Iterator[tuple[str, np.ndarray]], folder: Path) -> None:
    """Dequantized tensors into safetensors files of about `SHARD_BYTES` each:
    model.safetensors, then model-00002.safetensors... with the index HF
    readers expect; the float32 copy in memory is one shard, never the model."""
    shard: dict[str, np.ndarray] = {}
    weight_map: dict[str, str] = {}
    shard_bytes, number = 0, 1
    for name, array in tensors:
        shard[name] = array
        shard_bytes += array.nbytes
        if shard_bytes >= SHARD_BYTES:
            weight_map |= _save_shard(shard, folder, number)
            shard, shard_bytes, number = {}, 0, number + 1
    if shard or number == 1:
        weight_map |= _save_shard(shard, folder, number)
    if len(set(weight_map.values())) > 1:
        _write_json(folder / INDEX_FILE, {"metadata": {}, "weight_map": weight_map})


def _save_shard(shard: dict[str, np.ndarray], folder: Path, number: int) -> dict[str, str]:
    """Write one shard; returns tensor name -> its file name."""
    file_name = "model.safetensors" if number == 1 else f"model-{number:05d}.safetensors"
    save_file(shard, str(folder / file_name), metadata={"format": "pt"})
    return dict.fromkeys(shard, file_name)


def source_tensor_types(folder: Path) -> dict[str, str] | None:
    """The GGUF tensor types a converted folder came from; None for other folders."""
    path = folder / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    types = value.get("tensor_types") if isinstance(value, dict) else None
    return types if isinstance(types, dict) else None


def _open_reader(gguf_path: Path) -> GGUFReader:
    try:
        return GGUFReader(gguf_path)
    except Exception as exc:  # the reader raises anything from ValueError to IndexError
        raise ModelLoadError(f"corrupt GGUF file {gguf_path}: {_one_line(exc)}") from exc


def _guarded(gguf_path: Path, read: Any) -> Any:
    # Header parsing succeeded but the file may still be truncated or
    # inconsistent; whatever numpy or gguf raise then means "corrupt".
    try:
        return read()
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"corrupt GGUF file {gguf_path}: {_one_line(exc)}") from exc


def _write_tokenizer(gguf_path: Path, folder: Path) -> None:
    gguf_tokenizer.write_tokenizer(gguf_path, folder)


def _generation_config(config: dict[str, Any]) -> dict[str, Any]:
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {key: config[key] for key in keys if key in config}


def _publish(temp: Path, folder: Path) -> None:
    try:
        os.rename(temp, folder)
    except OSError:
        # Another process published the same conversion first: use theirs.
        if not folder.is_dir():
            raise


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
