"""Configuration: a frozen dataclass tree built once by the CLI (or `LLM`) and
passed down; each component takes its own part. Environment variables are read
here and nowhere else.

A field declared with `setting(...)` (sluice/settings.py) is also a
command-line flag: sluice/cli_flags.py derives the flags from these fields,
so their defaults, types and help live here only. Its range is checked when
the dataclass is built: a value out of range is a `ConfigError` naming the
field, so the CLI, `LLM` and tests refuse the same values.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sluice.settings import ConfigError, check_settings, setting

EMBEDDED_MODEL = "embedded"

__all__ = [
    "EMBEDDED_MODEL", "CacheConfig", "ConfigError", "DataParallelConfig", "EngineConfig",
    "ModelConfig", "RequestLimits", "SchedulerConfig", "ServerConfig", "SpeculativeConfig",
    "default_cache_dir",
]  # fmt: skip


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
    model: str = setting(
        EMBEDDED_MODEL, "'embedded' (SmolLM2-135M-Instruct), an HF folder, or a .gguf file"
    )
    # "float32", "bfloat16", or "auto": bfloat16 where the hardware has it
    # (sluice/loader/choices.py).
    dtype: str = setting(
        "auto",
        "auto: bfloat16 where the hardware has it, else float32",
        choices=("auto", "float32", "bfloat16"),
    )
    device: str = setting("cpu", "cpu or cuda")
    # What the model is served for (vLLM's --task): "generate" (a decoder's
    # tokens), "embed" (/v1/embeddings), "score" (/v1/rerank, /v1/score), or
    # "auto": from its files (sluice/loader/pooling_model.py).
    task: str = setting(
        "auto",
        "what the model serves: generate, embed (/v1/embeddings) or score (/v1/rerank, "
        "/v1/score); auto: from its files (sentence-transformers' pooling config, a BERT "
        "architecture: embed; a sequence classifier: score; a decoder: generate)",
        choices=("auto", "generate", "embed", "score"),
    )
    # Cap on prompt + generated tokens; None means the model's own limit.
    max_model_len: int | None = setting(
        None, "cap on prompt + generated tokens (default: the model's own limit)", at_least=1
    )
    cache_dir: Path = setting(
        help_text="where converted GGUF models are kept", default_factory=default_cache_dir
    )
    # Bound of the converted models under cache_dir: after a conversion the
    # least recently used others are removed (sluice/loader/model_cache.py).
    cache_max_bytes: int = setting(
        20 << 30,
        "bound of the converted models kept in the cache dir, e.g. 20GiB (least recently "
        "used removed first; the model in use always stays)",
        at_least=0,
    )
    # Weight-only quantization of the decoder matrices, CPU only: "int8"
    # (per-row scales) or "int4" (groups of 32, like llama.cpp's Q4_1); None
    # keeps the model dtype. Small decode batches read the quantized copy
    # (int4: ~1.6x faster single-stream); prefill and large batches keep the
    # dense matmul on the same quantized values (sluice/models/quantization.py).
    # "auto": none where the row-invariant int8 scheme runs (with
    # activation_quantization auto: sluice/loader/choices.py), else int4 when
    # the weights came in 4 bits (a Q4 GGUF), else None; a GGUF of 512 MiB or
    # more keeps its blocks ("gguf": sluice/loader/block_default.py), and an HF
    # checkpoint that size in 4-bit blocks is quantized to them at load
    # ("q4_k_m"; "q8_0" asks for 8-bit blocks: sluice/loader/hf_blocks.py).
    quantization: str | None = setting(
        "auto",
        "weight-only quantization of the decoder matrices (CPU; giving it leaves the "
        "row-invariant default); auto: none where the row-invariant int8 matmuls run, else "
        "int4 when the weights came in 4 bits, else none, gguf for a GGUF of 512 MiB or "
        "more and q4_k_m for an HF checkpoint of 512 MiB or more in 4 bits; gguf: a GGUF's "
        "matrices stay in the file's 4-8 bit blocks (no copy in other bits; AVX512-VNNI); "
        "q4_k_m, q8_0: an HF checkpoint's matrices quantized at load to those GGUF blocks "
        "(llama-quantize's Q4_K_M mix; Q8_0), run as a GGUF's",
        choices=("auto", "int8", "int4", "gguf", "q4_k_m", "q8_0"),
        none_as="none",
    )
    # Int8 activations times int8 weights (W8A8), calibrated at load
    # (sluice/models/int8_activations.py): "int8", None, or "auto". With both
    # this and quantization at auto, on bfloat16 with the native VNNI kernel:
    # the row-invariant scheme (every matrix, every step). Otherwise "int8"
    # serves the steps of more than a few tokens in q/k/v, o and gate/up,
    # and auto means int8 on a CPU with VNNI when the weights are quantized.
    activation_quantization: str | None = setting(
        "auto",
        "int8 activations times int8 weights (CPU); auto: the row-invariant scheme "
        "(every matrix, every step: the same answer under any load) where the native VNNI "
        "int8 matmul runs in bfloat16, else int8 in steps of more than a few tokens when "
        "the weights are quantized",
        choices=("auto", "int8"),
        none_as="none",
    )
    # Which kernel runs prefill attention at which prompt lengths, native or
    # torch's SDPA, which runs decode attention, and which int8 matmul serves
    # which step sizes (sluice/models/kernel_plan.py): "auto" reads the plan kept
    # for this CPU, kernels and versions, or measures one at load and keeps
    # it; "measure" measures again; anything else is a plan file to pin.
    kernel_plan: str = setting(
        "auto",
        "prefill attention kernel per prompt length (native, AMX or torch's SDPA), the "
        "decode attention kernel and the int8 matmul per step size: auto reads the "
        "plan kept for this CPU or measures it at load (about 2 s, once); measure measures "
        "again; or a plan FILE to pin (the kept plan's JSON)",
    )
    # Kernels whose result for a token ignores the rest of its step: greedy
    # tokens and logprobs bitwise the same alone or in any batch, prefill
    # chunking, preemption or prefix-cache hit (sluice/models/llama.py). Costs
    # step time (docs/BENCHMARKS.md); quantization then only changes the values.
    batch_invariant: bool = setting(
        False,
        "greedy tokens and logprobs bitwise the same alone or in any batch, chunking, "
        "preemption or prefix-cache hit; slower decode steps (docs/BENCHMARKS.md)",
    )

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size_tokens: int = setting(16, "tokens per KV block", flag="--block-size", at_least=1)
    # Bytes for the KV pool; None means derive from gpu_memory_fraction / a CPU default.
    kv_cache_memory_bytes: int | None = setting(
        None,
        "bytes for the KV cache pool, e.g. 1GiB (CPU default 1GiB)",
        flag="--kv-cache-memory",
        at_least=1,
    )
    # Fraction of free device memory for the KV pool when no byte budget is given.
    memory_fraction: float = setting(
        0.5,
        "share of free GPU memory for the KV pool when no size is given",
        flag="--kv-cache-memory-fraction",
        above=0,
        at_most=1,
    )
    # Reuse the KV of full blocks whose tokens an earlier request computed
    # (sluice/engine/kv_cache.py).
    enable_prefix_caching: bool = setting(
        True,
        "compute every prompt in full (by default full KV blocks of earlier requests' "
        "tokens are reused)",
        flag="--no-prefix-caching",
    )

    # Host RAM for prefix blocks the pool evicts, reloaded on a later hit
    # instead of recomputed (sluice/engine/kv_tiers.py); None: min(8 GiB, a
    # quarter of the memory available at start); 0: off. --cache-ram is
    # llama.cpp's name, in MiB.
    kv_offload_bytes: int | None = setting(
        None,
        "host RAM for prefix-cache blocks the KV pool evicts, LRU, e.g. 4GiB; 0: off "
        "(default: min(8GiB, a quarter of the memory available at start); --cache-ram MiB "
        "is the same)",
        at_least=0,
    )
    # A folder where every full prefix block is also written, keyed by its
    # prefix hash and a fingerprint of what decides its bits, so a restarted
    # server or another on the same folder reuses it (sluice/engine/kv_disk.py).
    kv_cache_dir: Path | None = setting(
        None,
        "keep full prefix-cache blocks in DIR too: a restarted server (or another on the "
        "same DIR and model) reuses them; off by default",
    )
    kv_cache_dir_bytes: int = setting(
        16 << 30,
        "the most bytes --kv-cache-dir holds, least recently used files removed first",
        at_least=1,
    )
    # The KV pool's element type (vLLM's flag): int8 is a per-16-channel scheme
    # (sluice/models/kv_int8.py), 5/8 of the bytes of bf16; auto keeps the
    # model's dtype (docs/OPERATIONS.md, "KV sizing", says why).
    kv_cache_dtype: str = setting(
        "auto",
        "KV cache element type: auto (the model's dtype, bf16 on CPU), bf16, or int8 "
        "(1.6 times the tokens in the same bytes)",
        choices=("auto", "bf16", "int8", "fp8", "fp8_e4m3", "fp8_e5m2"),
    )

    def __post_init__(self) -> None:
        check_settings(self)
        if self.kv_cache_dtype.startswith("fp8"):
            raise ConfigError(
                CacheConfig, "kv_cache_dtype",
                f"{self.kv_cache_dtype}: no fp8 KV on CPU serving; it supports int8 (or bf16)",
            )  # fmt: skip
        if self.kv_cache_dtype not in ("auto", "bf16", "int8"):
            raise ConfigError(
                CacheConfig, "kv_cache_dtype",
                f"must be auto, bf16 or int8, got {self.kv_cache_dtype!r}",
            )  # fmt: skip


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    # Tokens computed in one step, summed over the batch (decodes + prefill
    # chunks). vLLM's CPU default: a 2,000-token prompt prefills 1.2x sooner
    # than in 512-token chunks (2.43 vs 2.91 s on the embedded model: fewer
    # masked attention passes over the prompt, larger matmuls), at the price
    # of one longer pause for the decodes sharing that step.
    max_num_batched_tokens: int = setting(
        2048, "tokens computed in one step, summed over the batch", at_least=1
    )
    # Requests running at once.
    max_num_seqs: int = setting(64, "requests running at once", at_least=1)
    # Split long prompts across steps so running decodes are never starved.
    enable_chunked_prefill: bool = setting(
        True, "prefill each prompt in one step", flag="--no-chunked-prefill"
    )
    # Requests allowed to wait for admission; beyond it new ones are refused.
    max_waiting_requests: int = setting(
        1024, "requests allowed to wait; beyond it new ones get 503", at_least=0
    )
    # "fcfs": arrival order. "priority": by each request's `priority` (lower
    # sooner), then arrival; a waiting request may preempt a running one it
    # outranks (sluice/engine/priority.py).
    scheduling_policy: Literal["fcfs", "priority"] = setting(
        "fcfs", "fcfs: arrival order; priority: by the requests' priority field, then arrival"
    )
    # Under "priority": a waiting request gains one level per this many steps
    # waited, so none starves (the bound: sluice/engine/priority.py).
    priority_aging_steps: int = setting(
        500, "engine steps of waiting that raise a request's priority by one level", at_least=1
    )

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """Speculative decoding without a draft model (sluice/engine/speculation.py):
    vLLM's `--speculative-config` JSON, method "ngram" (prompt lookup)."""

    method: Literal["ngram"] = setting("ngram", "how tokens are proposed")
    # The longest draft a request verifies in one step (a decode step then
    # computes up to 1 + k tokens); drafts start at 4 and grow or shrink with
    # what was accepted (speculation.py `next_draft_length`).
    num_speculative_tokens: int = setting(
        16, "the longest draft a request verifies in one step", at_least=1, at_most=64
    )
    # The n-gram lengths looked up (longest first) in the prompt and output
    # so far (ngram_proposer.lookup_lengths: each up to 4, then about 1.5x
    # apart). A long match tells which of many places is being copied; a
    # 1-gram still proposes where nothing longer recurs (the draft length
    # adapts to what is accepted). 1..16 against 2..4: 15-25% fewer steps on
    # the copy tasks of benchmarks/speculative.py (each answer to its end).
    prompt_lookup_min: int = setting(1, "shortest n-gram looked up", at_least=1, at_most=64)
    prompt_lookup_max: int = setting(16, "longest n-gram looked up", at_least=1, at_most=64)
    # No request proposes in a step with more running requests than this
    # (vLLM's name): a large batch is compute-bound, where verifying costs.
    disable_by_batch_size: int | None = setting(
        None, "no speculation while more requests than this run", at_least=1
    )

    def __post_init__(self) -> None:
        check_settings(self)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError(
                SpeculativeConfig,
                "prompt_lookup_min",
                f"must be at most prompt_lookup_max ({self.prompt_lookup_max}), "
                f"got {self.prompt_lookup_min}",
            )

    @classmethod
    def from_flag(cls, text: str) -> SpeculativeConfig | None:
        """The flag's JSON object, e.g. '{"method": "ngram", "num_speculative_tokens": 5}';
        "none" (or "off"): no speculation. Raises ValueError (ConfigError for
        a field out of range)."""
        if text.strip().lower() in ("none", "off"):
            return None
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"not JSON: {error}") from None
        if not isinstance(values, dict):
            raise ValueError("must be a JSON object")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown keys {unknown}; known: {sorted(known)}")
        if values.get("method", "ngram") != "ngram":
            raise ValueError(f"method {values['method']!r}: only 'ngram' is served")
        for name, value in values.items():
            if name != "method" and value is not None and type(value) is not int:
                raise ValueError(f"{name} must be an integer, got {value!r}")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # Run the engine core in its own process (default) or in this one (tests).
    multiprocess: bool = True
    # Seconds without any message from the engine process before it is declared
    # hung and killed. The engine sends one message per step, one a second
    # when idle, and one a second during a step while its decoder layers
    # progress (engine/progress_beat.py), so this must exceed the longest
    # single layer of one step, not the whole step.
    heartbeat_timeout_s: float = setting(
        60.0,
        "seconds of engine silence, with requests pending, before it is declared hung "
        "and restarted",
        flag="--engine-heartbeat-timeout",
        above=0,
    )
    # torch intra-op threads of the engine; None: torch's default (all cores).
    # On a small machine shared with the HTTP process, fewer threads avoid
    # OpenMP barriers waiting on a descheduled thread.
    num_threads: int | None = setting(
        None,
        "torch threads of the engine (default: all cores; 1 avoids contention on 2 cores)",
        at_least=1,
    )
    # OpenTelemetry traces, OTLP over HTTP, from the server and every engine
    # process and replica (sluice/tracing.py); None: no tracing at all.
    otlp_traces_endpoint: str | None = setting(
        None, "send OpenTelemetry traces here, OTLP over HTTP, e.g. http://localhost:4318"
    )
    # Speculative decoding (n-gram prompt lookup); None: off. On by default:
    # greedy output is bitwise the same with it (the engine speculates only
    # where rows are invariant: engine/startup.py `speculation_blocker`), a
    # request with no match drafts nothing, and a step speculates only where
    # the step times measured at load say verifying pays (speculation.py);
    # measured in benchmarks/speculative.py.
    speculative_config: SpeculativeConfig | None = setting(
        SpeculativeConfig(),
        "speculative decoding, vLLM's JSON: "
        '\'{"method": "ngram", "num_speculative_tokens": 16, "prompt_lookup_min": 1, '
        '"prompt_lookup_max": 16}\' (the default), or none',
    )

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True, slots=True)
class DataParallelConfig:
    """Engine replicas placed by Ray behind one frontend (sluice/scaleout, docs/SCALING.md)."""

    # Engine replicas, each a Ray actor running its own engine core.
    num_replicas: int = setting(
        1,
        "serve N engine replicas as Ray actors behind this endpoint (docs/SCALING.md)",
        flag="--data-parallel",
        at_least=1,
    )
    # A running Ray cluster ("auto", or the head's host:port); None starts a
    # local Ray instance in this process.
    ray_address: str | None = setting(
        None, "a running Ray cluster: 'auto' or the head's host:port (default: a local Ray)"
    )
    # Ray resources each replica asks for (where it may be placed). The
    # replica's engine runs that many torch threads unless num_threads is set.
    replica_cpus: float = setting(1.0, "Ray CPUs per replica", at_least=0)
    replica_gpus: float = setting(0.0, "Ray GPUs per replica", at_least=0)
    # Times Ray restarts a replica's crashed actor in place (-1: always).
    # Beyond them the frontend starts a new actor, backing off between tries.
    max_actor_restarts: int = -1

    def __post_init__(self) -> None:
        check_settings(self)


# HF generation_config names -> (type, lowest, highest) of the sampling field.
_GENERATION_FIELDS: dict[str, tuple[type, float, float]] = {
    "temperature": (float, 0.0, 2.0),
    "top_p": (float, 1e-9, 1.0),
    "top_k": (int, -1, 2**63 - 1),
    "min_p": (float, 0.0, 1.0),
    "repetition_penalty": (float, 1e-9, 2.0),
    "presence_penalty": (float, -2.0, 2.0),
    "frequency_penalty": (float, -2.0, 2.0),
    "max_new_tokens": (int, 1, 2**63 - 1),
}


# OpenAI's reasoning efforts that cap thinking ("none" turns it off).
REASONING_EFFORTS = ("minimal", "low", "medium", "high", "xhigh")


@dataclass(frozen=True, slots=True)
class ReasoningEffortBudgets:
    """The thinking budget, in tokens, of each `reasoning_effort` /
    `reasoning.effort` (sluice/apis/rules/reasoning_fields.py); None: unbounded."""

    minimal: int | None = 256
    low: int | None = 1024
    medium: int | None = 4096
    high: int | None = 16384
    xhigh: int | None = None

    def of(self, effort: str) -> int | None:
        assert effort in REASONING_EFFORTS, f"an effort the protocol checked, got {effort!r}"
        budget: int | None = getattr(self, effort)
        return budget

    @classmethod
    def from_flag(cls, text: str) -> ReasoningEffortBudgets:
        """'low=512,high=none': the efforts named change, the others keep
        their defaults. Raises ValueError naming what is wrong."""
        values: dict[str, int | None] = {}
        for pair in text.split(","):
            effort, is_pair, value = pair.strip().partition("=")
            if not is_pair or effort not in REASONING_EFFORTS:
                raise ValueError(f"expected EFFORT=TOKENS with EFFORT one of "
                                 f"{', '.join(REASONING_EFFORTS)}, got {pair.strip()[:40]!r}")  # fmt: skip
            if value == "none":
                values[effort] = None
            elif value.isascii() and value.isdigit() and len(value) <= 18:
                values[effort] = int(value)
            else:
                raise ValueError(f"{effort} takes a token count or none, got {value[:40]!r}")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class GenerationDefaults:
    """What a request that leaves a sampling field unset gets instead of the
    API's own default: vLLM's `--override-generation-config`, in the names of
    HF's generation_config.json. `max_new_tokens` is the max_tokens of a
    request that gives none; `stop_strings` the stop of one that gives none.
    None: the API's default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    max_new_tokens: int | None = None
    stop_strings: tuple[str, ...] = ()

    @classmethod
    def from_flag(cls, text: str) -> GenerationDefaults:
        """The flag's JSON object, e.g. '{"temperature": 0, "stop_strings": ["\\n"]}'.
        Raises ValueError naming what is wrong."""
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"not JSON: {error}") from None
        if not isinstance(values, dict):
            raise ValueError("must be a JSON object")
        known = {*_GENERATION_FIELDS, "stop_strings"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown keys {unknown}; known: {sorted(known)}")
        for name, value in values.items():
            if name == "stop_strings":
                if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
                    raise ValueError("stop_strings must be a list of non-empty strings")
                values[name] = tuple(value)
                continue
            kind, lowest, highest = _GENERATION_FIELDS[name]
            is_number = isinstance(value, int | float) and not isinstance(value, bool)
            if not is_number or (kind is int and not isinstance(value, int)):
                raise ValueError(f"{name} must be {'an integer' if kind is int else 'a number'}")
            if not lowest <= value <= highest:
                raise ValueError(f"{name} must be within [{lowest}, {highest}], got {value}")
            values[name] = kind(value)
        return cls(**values)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Per-request bounds the HTTP edge enforces with a 400 naming the field.

    The protocol's own caps (n <= 128, 16 stop strings, 20 logprobs) still
    apply; these can only be stricter. None means "no limit but the model's".
    """

    # Prompt tokens of one prompt (after the chat template); None: the context.
    max_prompt_tokens: int | None = setting(
        None, "the most tokens one prompt may have (default: the context)", at_least=1
    )
    max_n: int = setting(128, "the most choices (n) one request may ask for", at_least=1)
    # Largest max_tokens / max_completion_tokens a client may ask for.
    max_tokens: int | None = setting(
        None, "the largest max_tokens a client may ask for", flag="--max-tokens-limit", at_least=1
    )
    max_stop_strings: int = setting(16, "the most stop strings of one request", at_least=0)
    # Characters in one stop string: each choice follows every stop string
    # character by character, and holds back up to this much text.
    max_stop_string_chars: int = setting(
        1024, "the longest stop string a client may send, in characters", at_least=1
    )
    max_logit_bias_entries: int = setting(
        1024, "the most logit_bias entries of one request", flag="--max-logit-bias", at_least=0
    )
    # Messages of one chat request (counted before they are validated): each
    # costs ~10 us to validate, convert and render, off the loop.
    max_chat_messages: int = setting(
        10_000, "the most messages one chat request may hold", at_least=1
    )
    # Bodies beyond this are a 413: by their Content-Length before a byte is
    # read, or once that many bytes arrived. Besides the memory one connection
    # can pin, this bounds the few steps of a large body still done in one
    # call (copying ~2M prompt token ids into a tuple: ~5 ms; sluice/server/body/body.py).
    max_request_body_bytes: int = setting(
        4 * 1024 * 1024,
        "the largest request body, e.g. 4MiB (beyond it: 413)",
        flag="--max-request-body",
        at_least=1,
    )

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = setting("127.0.0.1", "the address to listen on")
    port: int = setting(8000, "the port to listen on (0: any free one)", at_least=0, at_most=65535)
    served_model_name: str | None = setting(
        None, "the model name clients send and see (default: the model's)"
    )
    # Keys clients must send (Bearer or x-api-key), named key1, key2... by
    # position, without limits; a single str is one key. Empty: no key needed
    # (unless api_key_file names some).
    api_key: tuple[str, ...] = setting(
        (), "comma-separated keys clients must send as a Bearer token (default: none)"
    )
    # One key per line with an optional name and limits (sluice/server/keys/api_keys.py,
    # docs/OPERATIONS.md); read again on SIGHUP.
    api_key_file: Path | None = setting(
        None, "a file of keys, one a line with optional name= and limits; reread on SIGHUP"
    )
    cors_allowed_origins: tuple[str, ...] = setting(
        (), "comma-separated origins; empty disables CORS"
    )
    # The Responses API's store (sluice/apis/responses/store.py) keeps at
    # most this much of stored responses, as JSON; the least recently used go first.
    responses_store_bytes: int = setting(
        256 * 1024 * 1024,
        "memory for stored Responses API responses, e.g. 256MiB (oldest evicted first)",
        flag="--responses-store-memory",
        at_least=1,
    )
    engine: EngineConfig = field(default_factory=EngineConfig)
    limits: RequestLimits = field(default_factory=RequestLimits)
    # Sampling defaults for fields a request leaves unset (vLLM's flag and keys).
    generation_defaults: GenerationDefaults | None = setting(
        None,
        "sampling defaults for fields a request leaves unset, as JSON in generation_config "
        "names: temperature, top_p, top_k, min_p, repetition_penalty, presence_penalty, "
        "frequency_penalty, max_new_tokens, stop_strings (e.g. '{\"temperature\": 0}')",
        flag="--override-generation-config",
    )
    # Open connections at once, a new one included; beyond it uvicorn answers a
    # plain-text 503 (None: unbounded).
    max_connections: int | None = setting(
        4096, "open connections at once; beyond it a plain-text 503", at_least=1
    )
    # A stream whose next chunk cannot be written for this long (the client
    # stopped reading) is cut and its engine requests aborted.
    send_timeout_s: float = setting(
        30.0,
        "seconds a stream's write may block before it is aborted",
        flag="--send-timeout",
        above=0,
    )
    # Per connection: the kernel's send buffer (SO_SNDBUF) and the transport's
    # high-water mark (None: the OS's and uvloop's own; Linux grows the send
    # buffer to 4 MiB). Bounded, a client that stops reading holds little
    # memory, and its stream coalesces in sluice (where deltas merge) instead
    # of queueing in buffers.
    send_buffer_bytes: int | None = setting(
        64 * 1024,
        "kernel send buffer and transport high-water mark per connection (0: the defaults)",
        at_least=1,
        none_as=0,
    )
    # The queue timeout: longest a request may wait for its first token, unless
    # its X-Sluice-Queue-Timeout header says otherwise (seconds); None: none.
    queue_timeout_s: float | None = setting(
        None,
        "default seconds a request may wait for its first token",
        flag="--queue-timeout",
        above=0,
    )
    # On SIGTERM, running requests get this long to finish before they are cut.
    drain_timeout_s: float = setting(
        30.0,
        "seconds running requests get to finish after SIGTERM",
        flag="--drain-timeout",
        at_least=0,
    )
    # When the engine dies: start a new one, or stop the server (exit status 1)
    # and leave the restart to a process supervisor.
    on_engine_death: Literal["restart", "exit"] = setting(
        "restart", "when the engine dies: start a new one, or stop the server (status 1)"
    )
    # Engine replicas on Ray (--data-parallel); None: one engine, no Ray.
    data_parallel: DataParallelConfig | None = None
    # Several models in one server (sluice/server/served_models/model_pool.py, docs/OPERATIONS.md):
    # every --model given, a NAME=PATH one served as NAME; empty: engine.model alone.
    models: tuple[str, ...] = ()
    models_dir: Path | None = setting(
        None, "serve every .gguf file and HF folder in DIR too, named by file stem or folder"
    )
    # Engines running at once; the least recently used idle one stops for a new one.
    models_max: int | None = setting(
        None, "most models loaded at once (default: as many as the memory budget holds)",
        at_least=1,
    )  # fmt: skip
    # What the running models may take, estimated from their weights' files and
    # KV pools; None: 90% of the memory available when the server starts.
    models_memory_bytes: int | None = setting(
        None,
        "memory the loaded models may take, estimated from their files and KV pools, "
        "e.g. 16GiB (default: 90%% of the memory available at start)",
        flag="--models-memory",
        at_least=1,
    )
    preload: bool = setting(
        False, "start every model's engine with the server (default: on its first request)"
    )
    # How chat outputs are read into tool calls: "hermes", "llama3_json" or
    # "mistral"; None: guessed from the model's chat template, else hermes,
    # which the server then shows the model in the system prompt
    # (sluice/tools/tool_format.py); "none": tool_choice "auto" is served as "none".
    tool_call_parser: str | None = setting(
        None,
        "how tool calls are read from outputs (default: guessed from the chat template, "
        "else hermes, shown to the model in the system prompt; none: auto is served as none)",
    )
    # "deepseek_r1" or "qwen3": <think>…</think> goes to reasoning_content;
    # "none": never split; None: guessed from the chat template
    # (sluice/tools/reasoning.py), off when the template shows no <think>.
    reasoning_parser: str | None = setting(
        None,
        "split <think>…</think> into reasoning_content (default: guessed from the chat "
        "template; none: never)",
    )
    # The thinking budget of each reasoning effort a request names
    # (sluice/apis/rules/reasoning_fields.py).
    reasoning_effort_budgets: ReasoningEffortBudgets = setting(
        default_factory=ReasoningEffortBudgets,
        help_text="the thinking budget in tokens of each reasoning_effort, e.g. "
        "'low=512,high=none' (default: minimal=256,low=1024,medium=4096,high=16384,xhigh=none)",
    )

    def __post_init__(self) -> None:
        if isinstance(self.api_key, str):  # one key, as `api_key="k"` always meant
            object.__setattr__(self, "api_key", (self.api_key,))
        check_settings(self)
