"""What the engine core decides once, from the config and the loaded model,
before it builds its parts: how many KV blocks the pool has, how many
recurrent-state slots a hybrid model gets, what salts the prefix cache's
block names, whether the model may speculate, and the startup line that
says what was chosen.
"""

from __future__ import annotations

import dataclasses

import torch

from sluice.config import CacheConfig, ConfigError, EngineConfig, SpeculativeConfig
from sluice.engine.speculation import pays_off
from sluice.errors import ModelLoadError
from sluice.loader import LoadedModel, memory_plan
from sluice.models import kv_int8
from sluice.models.attention import kv_cache_bytes_per_block
from sluice.models.linear import row_dependence
from sluice.models.sequence_state import state_bytes_per_sequence


def fit_max_model_len(
    config: EngineConfig, loaded: LoadedModel, dtype: torch.dtype, device: torch.device
) -> int | None:
    """On a CPU with no --max-model-len and no --kv-cache-memory, the context
    that fits when the model's own limit does not (loader/memory_plan.py);
    None where nothing is fitted."""
    if config.model.max_model_len is not None or config.cache.kv_cache_memory_bytes is not None:
        return None
    if device.type != "cpu":
        return None
    return memory_plan.fitted_max_model_len(
        bytes_per_block_of(config, loaded, dtype), config.cache.block_size_tokens,
        loaded.max_model_len, memory_plan.available_memory_bytes(),
        _workspace(config, loaded, dtype),
    )  # fmt: skip


def num_kv_blocks(
    config: EngineConfig, loaded: LoadedModel, dtype: torch.dtype, device: torch.device
) -> int:
    """Size the KV pool from the byte budget, a share of free GPU memory, or on
    a CPU the default pool grown to one max_model_len request and bounded by
    the available memory (loader/memory_plan.py). Raises ModelLoadError if it
    cannot hold one request of max_model_len."""
    cache = config.cache
    bytes_per_block = bytes_per_block_of(config, loaded, dtype)
    if cache.kv_cache_memory_bytes is not None:
        budget = cache.kv_cache_memory_bytes
    elif device.type == "cuda":
        free_bytes, _total = torch.cuda.mem_get_info(device)
        budget = int(free_bytes * cache.memory_fraction)
    else:
        budget = memory_plan.cpu_kv_budget(
            bytes_per_block, cache.block_size_tokens, loaded.max_model_len,
            memory_plan.available_memory_bytes(), _workspace(config, loaded, dtype),
        )  # fmt: skip
    num_blocks = int(budget // bytes_per_block)
    if num_blocks < 1:
        raise ValueError(
            f"the KV cache budget of {budget} bytes holds no block of {bytes_per_block} bytes"
        )
    num_tokens = num_blocks * cache.block_size_tokens
    if num_tokens < loaded.max_model_len:
        raise ModelLoadError(
            f"the KV cache holds {num_tokens} tokens, less than one request of max_model_len "
            f"{loaded.max_model_len}: raise --kv-cache-memory or lower --max-model-len"
        )
    return num_blocks


def num_state_slots(config: EngineConfig, loaded: LoadedModel) -> int:
    """A hybrid model's recurrent-state slots: one per seat (max_num_seqs), so
    an admitted request always finds one; 0 for a model without such layers.
    They sit beside the KV budget, as fixed as the weights."""
    return config.scheduler.max_num_seqs if loaded.model_config.has_sequence_state else 0


def prefix_caching_blocker(
    config: EngineConfig, loaded: LoadedModel, dtype: torch.dtype
) -> str | None:
    """Why a hybrid runs without the prefix caching asked for; None where it
    keeps it. A hit needs the state snapshot at its block's end, and there is
    one in every KV block: it may cost at most what the block's K/V would if
    every layer attended (LFM2-1.2B: 80 KiB of 512 KiB), so a hybrid's block
    never outweighs a dense model's. Gated DeltaNet states are larger (the
    default Qwen3.5 shape: 50 MiB against 2 MiB a 16-token block): snapshots
    at sparser block ends are not built yet."""
    model_config = loaded.model_config
    if not config.cache.enable_prefix_caching or not model_config.has_sequence_state:
        return None
    snapshot = state_bytes_per_sequence(model_config, dtype)
    per_token = 2 * model_config.num_key_value_heads * model_config.head_dim * dtype.itemsize
    per_token *= model_config.num_hidden_layers  # the K/V of a token were every layer attention
    block_size = config.cache.block_size_tokens
    if snapshot <= per_token * block_size:
        return None
    return (
        f"no prefix caching: a state snapshot in every KV block would cost "
        f"{snapshot / 2**20:.2f} MiB, more than a {block_size}-token block's K/V in an "
        f"all-attention model ({per_token * block_size / 2**20:.2f} MiB); blocks of "
        f"{-(-snapshot // per_token)} tokens or more keep it (--block-size)"
    )


def without_prefix_caching(config: EngineConfig) -> EngineConfig:
    return dataclasses.replace(
        config, cache=dataclasses.replace(config.cache, enable_prefix_caching=False)
    )


def describe_state_cache(config: EngineConfig, loaded: LoadedModel, dtype: torch.dtype) -> str:
    """The startup line's words for a hybrid model's state cache (its slots,
    their bytes, the snapshot each KV block holds); "" for the others."""
    num_slots = num_state_slots(config, loaded)
    if not num_slots:
        return ""
    per_sequence = state_bytes_per_sequence(loaded.model_config, dtype)
    slots = (
        f", state cache {num_slots} slots of {per_sequence / 1024:.0f} KiB "
        f"({num_slots * per_sequence / 2**20:.1f} MiB), "
    )
    if not config.cache.enable_prefix_caching:
        return slots + "no snapshots (prefix caching off)"
    return slots + (
        f"a {per_sequence / 1024:.0f} KiB snapshot in every KV block (the prefix cache's "
        "states at block ends)"
    )


def cache_salt(
    loaded: LoadedModel, dtype: torch.dtype, kv_dtype: torch.dtype | None = None
) -> bytes:
    """Anything that changes a block's contents for the same tokens."""
    choices = loaded.choices
    kv = dtype if kv_dtype is None else kv_dtype
    return f"{loaded.name}\0{dtype}\0{choices.quantization}\0{choices.activations}\0{kv}".encode()


def kv_dtype_of(config: EngineConfig, dtype: torch.dtype) -> torch.dtype:
    """The KV pool's element type: --kv-cache-dtype over the model's `dtype`."""
    try:
        return kv_int8.kv_torch_dtype(config.cache.kv_cache_dtype, dtype)
    except ValueError as error:
        raise ConfigError(CacheConfig, "kv_cache_dtype", str(error)) from error


def startup_line(
    config: EngineConfig,
    loaded: LoadedModel,
    device: torch.device,
    num_blocks: int,
    dtype: torch.dtype = torch.float32,
) -> str:
    """One line: the model, its numeric choices and why, and the pool and batch sizes."""
    choices = loaded.choices
    weights = f" + {choices.quantization}" if choices.quantization else ""
    activations = f" + {choices.activations} activations" if choices.activations else ""
    block_size = config.cache.block_size_tokens
    blocker = speculation_blocker(loaded)
    return (
        f"engine ready: model {loaded.name}, {choices.dtype}{weights}{activations} on {device} "
        f"with {torch.get_num_threads()} threads ({choices.reason}), max_model_len "
        f"{loaded.max_model_len}, {num_blocks} KV blocks of {block_size} tokens "
        f"({num_blocks * block_size} tokens, {_kv_mib(config, loaded, dtype, num_blocks)} of "
        f"{_kv_name(kv_dtype_of(config, dtype))} KV)"
        f"{describe_state_cache(config, loaded, dtype)}, max_num_batched_tokens "
        f"{config.scheduler.max_num_batched_tokens}, max_num_seqs {config.scheduler.max_num_seqs}, "
        f"{describe_speculation(config.speculative_config, loaded.step_seconds, blocker)}, "
        f"{memory_figures(config, loaded, num_blocks, dtype, device).describe()}"
    )


def memory_figures(
    config: EngineConfig,
    loaded: LoadedModel,
    num_blocks: int,
    dtype: torch.dtype,
    device: torch.device,
) -> memory_plan.MemoryPlan:
    """Weights, KV pool and step workspace as built, and what is still free."""
    bytes_per_block = bytes_per_block_of(config, loaded, dtype)
    return memory_plan.MemoryPlan(
        weights_bytes=loaded.model.weight_bytes(),
        kv_bytes=num_blocks * bytes_per_block,
        workspace_bytes=_workspace(config, loaded, dtype),
        available_bytes=memory_plan.available_memory_bytes(),
        is_kv_resident_as_used=device.type == "cpu",
    )


def _workspace(config: EngineConfig, loaded: LoadedModel, dtype: torch.dtype) -> int:
    scheduler = config.scheduler
    return memory_plan.workspace_bytes(
        loaded.model_config, scheduler.max_num_batched_tokens, scheduler.max_num_seqs,
        dtype.itemsize,
    )  # fmt: skip


def bytes_per_block_of(config: EngineConfig, loaded: LoadedModel, dtype: torch.dtype) -> int:
    """A KV block's bytes over all layers; a hybrid's state snapshot counts
    with prefix caching only (nothing reads it without)."""
    cache = config.cache
    return kv_cache_bytes_per_block(
        loaded.model_config, cache.block_size_tokens, dtype, cache.enable_prefix_caching,
        kv_dtype_of(config, dtype),
    )  # fmt: skip


def _kv_name(kv_dtype: torch.dtype) -> str:
    return {torch.int8: "int8", torch.bfloat16: "bf16", torch.float32: "float32"}.get(
        kv_dtype, str(kv_dtype)
    )


def _kv_mib(config: EngineConfig, loaded: LoadedModel, dtype: torch.dtype, num_blocks: int) -> str:
    return f"{num_blocks * bytes_per_block_of(config, loaded, dtype) / 2**20:.0f} MiB"


def speculation_blocker(loaded: LoadedModel) -> str | None:
    """Why this model never speculates, whatever --speculative-config says;
    None where it may. A verification computes 1 + k rows of a request where
    a plain decode step computes one, so its tokens are those without
    speculation only where a row's bits ignore how many rows share its step:
    the row-invariant scheme (the default where the VNNI kernel runs) and
    --batch-invariant. Elsewhere the kernel, or its blocking, follows the row
    count, and greedy output would change (issue 40: int4 weights for one
    row, W8A8 for a verification's four)."""
    how = row_dependence(loaded.model)
    if how is None:
        return None
    return (
        f"no speculation: a row's bits follow its step's row count here ({how}), so "
        "verifying drafts would change greedy outputs; it runs with the row-invariant "
        "default or --batch-invariant"
    )


def describe_speculation(
    speculative: SpeculativeConfig | None,
    step_seconds: tuple[tuple[int, float], ...],
    blocker: str | None = None,
) -> str:
    """ "n-gram speculation (k=4, n 2..4) in steps of up to 16 running requests
    (measured at load)", or "no speculation" and why (`blocker`: the model's
    reason, `speculation_blocker`)."""
    if speculative is None:
        return "no speculation (--speculative-config none)"
    if blocker is not None:
        return blocker
    k = speculative.num_speculative_tokens
    what = f"n-gram speculation (k={k}, n {speculative.prompt_lookup_min}.."
    what += f"{speculative.prompt_lookup_max})"
    if speculative.disable_by_batch_size is not None:
        return f"{what} in steps of up to {speculative.disable_by_batch_size} running requests"
    if not step_seconds:
        return f"{what} in every step (no step times measured)"
    on = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if pays_off(step_seconds, b, k)]
    if not on:
        return f"{what} in no step: verifying costs more than it saves here (measured at load)"
    return f"{what} in steps of up to about {on[-1]} running requests (measured at load)"
