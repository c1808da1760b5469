"""Configuration: a frozen dataclass tree built once by the CLI (or `LLM`) and
passed down; each component takes its own part. Environment variables are read
here and nowhere else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

EMBEDDED_MODEL = "embedded"


def default_cache_dir() -> Path:
    """Where converted models (GGUF -> safetensors + tokenizer) are kept."""
    env = os.environ.get("SLUICE_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sluice"


@dataclass(frozen=True, slots=True)
class ModelConfig:
    # "embedded", a Hugging Face folder, or a path to a .gguf file.
    model: str = EMBEDDED_MODEL
    # "float32" or "bfloat16".
    dtype: str = "float32"
    # "cpu" or "cuda".
    device: str = "cpu"
    # Cap on prompt + generated tokens; None means the model's own limit.
    max_model_len: int | None = None
    cache_dir: Path = field(default_factory=default_cache_dir)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size_tokens: int = 16
    # Bytes for the KV pool; None means derive from gpu_memory_fraction / a CPU default.
    kv_cache_memory_bytes: int | None = None
    # Fraction of free device memory for the KV pool when no byte budget is given.
    memory_fraction: float = 0.5


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    # Tokens computed in one step, summed over the batch (decodes + prefill chunks).
    max_num_batched_tokens: int = 512
    # Requests running at once.
    max_num_seqs: int = 64
    # Split long prompts across steps so running decodes are never starved.
    enable_chunked_prefill: bool = True
    # Requests allowed to wait for admission; beyond it new ones are refused.
    max_waiting_requests: int = 1024


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # Run the engine core in its own process (default) or in this one (tests).
    multiprocess: bool = True


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    api_key: str | None = None
    cors_allowed_origins: tuple[str, ...] = ()
    engine: EngineConfig = field(default_factory=EngineConfig)
