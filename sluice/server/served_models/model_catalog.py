"""The models `sluice serve` was asked to serve, as `ModelSpec`s for its `ModelPool`.

    --model PATH (repeatable)   each model, served by its name (a GGUF's file
                                stem without the quantization, a folder's name,
                                "SmolLM2-135M-Instruct" for the embedded model);
    --model NAME=PATH           ... served as NAME;
    --models-dir DIR            every .gguf file and HF folder (with a
                                config.json) in DIR, in name order;
    --served-model-name NAME    the name of the one model, when there is one.

Each model runs in its own engine process (`MultiprocessEngineClient`) with
the server's engine settings, its `ModelConfig.model` changed. A missing path
or two models of one name fail before anything loads. The only model, or
every model with --preload, starts with the server.

A model's estimated bytes, for the pool's memory budget: its weights' files
(a GGUF's file, a folder's safetensors) plus the KV pool its engine allocates
(--kv-cache-memory, else the CPU default).

Before a model's start stops any other, its weights' files are checked
cheaply (`check_weights`: a safetensors header must cover its file, a GGUF
file must start as one), so a truncated download is refused without
unloading a model that works.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from pathlib import Path

from sluice.config import EMBEDDED_MODEL, EngineConfig, ModelConfig, ServerConfig
from sluice.engine.client_base import EngineClient
from sluice.errors import ModelLoadError
from sluice.server.served_models.model_entry import ModelSpec, PoolLimits
from sluice.server.served_models.served_model import ServedModel

# The KV pool of an engine on the CPU without --kv-cache-memory (engine/startup.py).
DEFAULT_KV_BYTES = 1 << 30
# Share of the memory available at start the models may take by default.
MEMORY_BUDGET_SHARE = 0.9
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def pool_limits(config: ServerConfig, gate_capacity: int) -> PoolLimits:
    """The pool's bounds from the server's flags (the memory budget read now)."""
    budget = config.models_memory_bytes
    if budget is None:
        available = available_memory_bytes()
        budget = None if available is None else int(available * MEMORY_BUDGET_SHARE)
    return PoolLimits(gate_capacity, config.models_max, budget)


def available_memory_bytes() -> int | None:
    """The memory the OS could give now (Linux: MemAvailable; None: unknown)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def model_paths(config: ServerConfig) -> list[tuple[str | None, str]]:
    """(name or None, model) of every model asked for, in order."""
    given = list(config.models)
    if not given and config.models_dir is None:
        given = [config.engine.model.model]
    named = [split_name(text) for text in given]
    if config.models_dir is not None:
        named += [(None, str(path)) for path in _models_in(config.models_dir)]
    if not named:
        raise ModelLoadError(f"--models-dir {config.models_dir}: no .gguf file or model folder")
    return named


def model_specs(
    config: ServerConfig, describe: Callable[[ModelConfig], ServedModel]
) -> list[ModelSpec]:
    """A spec for every model `config` asks for, each described by `describe`
    (`launch.describe_model`); ModelLoadError for a missing path or a name
    served twice."""
    from sluice.loader.sources import resolve_source

    named = model_paths(config)
    specs: list[ModelSpec] = []
    for name, model in named:
        source = resolve_source(model)
        if name is None and len(named) == 1:
            name = config.served_model_name
        name = name or source.name
        if any(spec.name == name for spec in specs):
            raise ModelLoadError(f"two models are named {name!r}; name one with --model NAME=PATH")
        engine = dataclasses.replace(
            config.engine, model=dataclasses.replace(config.engine.model, model=model)
        )
        kv_bytes = config.engine.cache.kv_cache_memory_bytes or DEFAULT_KV_BYTES
        specs.append(
            ModelSpec(
                name,
                describe=functools.partial(describe, engine.model),
                make_engine=functools.partial(_engine, engine),
                estimated_bytes=weight_bytes(source.path) + kv_bytes,
                is_preloaded=config.preload or len(named) == 1,
                check=functools.partial(check_weights, source.path),
            )
        )
    return specs


def weight_bytes(path: Path) -> int:
    """Bytes of a model's weights on disk: the file, or a folder's weight files."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.iterdir() if p.suffix in _WEIGHT_SUFFIXES)


def check_weights(path: Path) -> None:
    """A ModelLoadError naming the first weights file of `path` (a GGUF file
    or an HF folder) whose header does not parse or does not cover the file;
    reads headers only. A GGUF's tensor table is not walked (gguf's reader
    takes seconds on a large vocabulary): its magic and version only."""
    if path.is_file():
        with open(path, "rb") as gguf:
            head = gguf.read(8)
        if len(head) < 8 or head[:4] != b"GGUF" or int.from_bytes(head[4:], "little") not in (2, 3):
            raise ModelLoadError(f"unreadable GGUF file {path}: no GGUF v2/v3 header")
        return
    from safetensors import SafetensorError, safe_open

    from sluice.loader.weights import checkpoint_files

    for weights in checkpoint_files(path):
        try:
            with safe_open(str(weights), framework="pt"):
                pass
        except (SafetensorError, OSError) as error:
            raise ModelLoadError(f"unreadable weights file {weights}: {error}") from None


def split_name(text: str) -> tuple[str | None, str]:
    """ "NAME=PATH" -> (NAME, PATH); a path (even with "=" in it) -> (None, text)."""
    name, equals, model = text.partition("=")
    if not equals or not name or "/" in name or Path(text).exists() or text == EMBEDDED_MODEL:
        return None, text
    return name, model


def _models_in(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise ModelLoadError(f"--models-dir {folder}: not a folder")
    return sorted(
        path
        for path in folder.iterdir()
        if (path.is_file() and path.suffix.lower() == ".gguf")
        or (path.is_dir() and (path / "config.json").is_file())
    )


def _engine(engine: EngineConfig) -> EngineClient:
    from sluice.engine.process_client import MultiprocessEngineClient

    return MultiprocessEngineClient(engine)
