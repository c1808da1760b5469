"""Configuration: a frozen dataclass tree built once by the CLI (or `LLM`) and
passed down; each component takes its own part. Environment variables are read
here and nowhere else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

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
    # "float32", "bfloat16", or "auto": bfloat16 where the hardware has it
    # (sluice/loader/choices.py).
    dtype: str = "auto"
    # "cpu" or "cuda".
    device: str = "cpu"
    # Cap on prompt + generated tokens; None means the model's own limit.
    max_model_len: int | None = None
    cache_dir: Path = field(default_factory=default_cache_dir)
    # Weight-only quantization of the decoder matrices, CPU only: "int8"
    # (per-row scales) or "int4" (groups of 32, like llama.cpp's Q4_1); None
    # keeps the model dtype. Small decode batches read the quantized copy
    # (int4: ~1.6x faster single-stream); prefill and large batches keep the
    # dense matmul on the same quantized values (sluice/models/quantization.py).
    # "auto": int4 when the weights came in 4 bits (a Q4 GGUF), else None.
    quantization: str | None = "auto"
    # Int8 activations times int8 weights (W8A8, VNNI) for the steps of more
    # than a few tokens, in q/k/v, o and gate/up, calibrated at load
    # (sluice/models/int8_activations.py): "int8", None, or "auto": int8 on a
    # CPU with VNNI when the weights are quantized (quantization above).
    activation_quantization: str | None = "auto"
    # Kernels whose result for a token ignores the rest of its step: greedy
    # tokens and logprobs bitwise the same alone or in any batch, prefill
    # chunking, preemption or prefix-cache hit (sluice/models/llama.py). Costs
    # step time (docs/BENCHMARKS.md); quantization then only changes the values.
    batch_invariant: bool = False


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size_tokens: int = 16
    # Bytes for the KV pool; None means derive from gpu_memory_fraction / a CPU default.
    kv_cache_memory_bytes: int | None = None
    # Fraction of free device memory for the KV pool when no byte budget is given.
    memory_fraction: float = 0.5
    # Reuse the KV of full blocks whose tokens an earlier request computed
    # (sluice/engine/kv_cache.py).
    enable_prefix_caching: bool = True


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    # Tokens computed in one step, summed over the batch (decodes + prefill
    # chunks). vLLM's CPU default: a 2,000-token prompt prefills 1.2x sooner
    # than in 512-token chunks (2.43 vs 2.91 s on the embedded model: fewer
    # masked attention passes over the prompt, larger matmuls), at the price
    # of one longer pause for the decodes sharing that step.
    max_num_batched_tokens: int = 2048
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
    # Seconds without any message from the engine process before it is declared
    # hung and killed. The engine sends one message per step and one a second
    # when idle, so this must exceed the longest step: a CPU prefill chunk can
    # take seconds on a loaded machine, hence the generous default.
    heartbeat_timeout_s: float = 60.0
    # torch intra-op threads of the engine; None: torch's default (all cores).
    # On a small machine shared with the HTTP process, fewer threads avoid
    # OpenMP barriers waiting on a descheduled thread.
    num_threads: int | None = None


@dataclass(frozen=True, slots=True)
class DataParallelConfig:
    """Engine replicas placed by Ray behind one frontend (sluice/scaleout, docs/SCALING.md)."""

    # Engine replicas, each a Ray actor running its own engine core.
    num_replicas: int = 1
    # A running Ray cluster ("auto", or the head's host:port); None starts a
    # local Ray instance in this process.
    ray_address: str | None = None
    # Ray resources each replica asks for (where it may be placed). The
    # replica's engine runs that many torch threads unless num_threads is set.
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0
    # Times Ray restarts a replica's crashed actor in place (-1: always).
    # Beyond them the frontend starts a new actor, backing off between tries.
    max_actor_restarts: int = -1


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Per-request bounds the HTTP edge enforces with a 400 naming the field.

    The protocol's own caps (n <= 128, 16 stop strings, 20 logprobs) still
    apply; these can only be stricter. None means "no limit but the model's".
    """

    # Prompt tokens of one prompt (after the chat template); None: the context.
    max_prompt_tokens: int | None = None
    max_n: int = 128
    # Largest max_tokens / max_completion_tokens a client may ask for.
    max_tokens: int | None = None
    max_stop_strings: int = 16
    # Characters in one stop string: each choice follows every stop string
    # character by character, and holds back up to this much text.
    max_stop_string_chars: int = 1024
    max_logit_bias_entries: int = 1024
    # Messages of one chat request (counted before they are validated): each
    # costs ~10 us to validate, convert and render, off the loop.
    max_chat_messages: int = 10_000
    # Bodies beyond this are a 413: by their Content-Length before a byte is
    # read, or once that many bytes arrived. Besides the memory one connection
    # can pin, this bounds the few steps of a large body still done in one
    # call (copying ~2M prompt token ids into a tuple: ~5 ms; sluice/server/body.py).
    max_request_body_bytes: int = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    api_key: str | None = None
    cors_allowed_origins: tuple[str, ...] = ()
    engine: EngineConfig = field(default_factory=EngineConfig)
    limits: RequestLimits = field(default_factory=RequestLimits)
    # Open connections at once, a new one included; beyond it uvicorn answers a
    # plain-text 503 (None: unbounded).
    max_connections: int | None = 4096
    # A stream whose next chunk cannot be written for this long (the client
    # stopped reading) is cut and its engine requests aborted.
    send_timeout_s: float = 30.0
    # Per connection: the kernel's send buffer (SO_SNDBUF) and the transport's
    # high-water mark (None: the OS's and uvloop's own; Linux grows the send
    # buffer to 4 MiB). Bounded, a client that stops reading holds little
    # memory, and its stream coalesces in sluice (where deltas merge) instead
    # of queueing in buffers.
    send_buffer_bytes: int | None = 64 * 1024
    # Longest a request may wait for its first token unless it asks for less
    # (header X-Sluice-Queue-Timeout, seconds); None: no deadline.
    queue_timeout_s: float | None = None
    # On SIGTERM, running requests get this long to finish before they are cut.
    drain_timeout_s: float = 30.0
    # When the engine dies: start a new one, or stop the server (exit status 1)
    # and leave the restart to a process supervisor.
    on_engine_death: Literal["restart", "exit"] = "restart"
    # Engine replicas on Ray (--data-parallel); None: one engine, no Ray.
    data_parallel: DataParallelConfig | None = None
    # How chat outputs are read into tool calls: "hermes", "llama3_json" or
    # "mistral"; None: guessed from the model's chat template (and none when it
    # shows no known format: then tool_choice "auto" is a 400).
    tool_call_parser: str | None = None
    # "deepseek_r1": <think>…</think> goes to reasoning_content; None: off.
    reasoning_parser: str | None = None
