"""The engine's memory: weights, KV pool and step workspace, planned at startup.

    weights    the model's tensors as loaded (packed GGUF blocks, int8 copies, norms)
    KV         the paged pool (model/attention.py: K and V of every attention
               layer, a hybrid's state snapshots)
    workspace  the most one step allocates: the activations of
               max_num_batched_tokens rows and the float32 logits of the
               sampled rows

On a CPU, with no `--kv-cache-memory`, the pool takes `DEFAULT_CPU_KV_BYTES`,
or more where one request of max_model_len needs more, and never more than
the memory available once the weights are in, less the workspace and a
reserve for the server process: a pool that cannot fit is refused with the
figures, not swapped to death. Where no --max-model-len was asked and the
model's own limit does not fit, the context is fitted to half the usable
memory instead (`fitted_max_model_len`), and the startup line says so. Before anything is loaded, a model whose
weights alone exceed the available memory is refused the same way
(`check_weights_fit`). Every decision takes the available bytes as an
argument, so tests give it any machine's figures.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from dataclasses import dataclass

import psutil

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import DecoderConfig

# The CPU pool when no size is given and one max_model_len request fits in it.
DEFAULT_CPU_KV_BYTES = 1 << 30
# Kept free for the server process, the tokenizer, the allocator's slack.
RESERVE_BYTES = 1 << 30
# A context fitted to memory (`fitted_max_model_len`): whole multiples of
# this, never below the minimum.
FITTED_LEN_STEP = 1024
MIN_FITTED_LEN = 4096
_MIB = 1 << 20
_GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """What the startup line says of memory."""

    weights_bytes: int
    kv_bytes: int
    workspace_bytes: int
    # What the system could still give once all of it was allocated.
    available_bytes: int
    # A CPU pool is reserved address space whose pages become resident as
    # blocks are first written (models/zero_pages.py); a GPU's is committed.
    is_kv_resident_as_used: bool = False

    def describe(self) -> str:
        kv = f"{self.kv_bytes / _MIB:.0f} MiB"
        if self.is_kv_resident_as_used:
            kv = f"reserved {kv} (resident as used)"
        return (
            f"memory: weights {self.weights_bytes / _MIB:.0f} MiB, KV {kv}, workspace "
            f"{self.workspace_bytes / _MIB:.0f} MiB ({self.available_bytes / _GIB:.1f} GiB still "
            "available)"
        )


def available_memory_bytes() -> int:
    """Memory the system can give without swapping (MemAvailable)."""
    return int(psutil.virtual_memory().available)


def workspace_bytes(
    config: DecoderConfig, max_num_batched_tokens: int, max_num_seqs: int, itemsize: int
) -> int:
    """An upper estimate of one step's activations: per row the hidden state
    and its norms, q/k/v and the attention output, the MLP's gate, up and
    product; float32 logits for every sampled row."""
    heads = config.num_attention_heads * config.head_dim
    kv = 2 * config.num_key_value_heads * config.head_dim
    per_row = 4 * config.hidden_size + 2 * heads + kv + 3 * config.intermediate_size
    logits = 4 * config.vocab_size * max_num_seqs
    return max_num_batched_tokens * per_row * itemsize + logits


def cpu_kv_budget(
    bytes_per_block: int,
    block_size_tokens: int,
    max_model_len: int,
    available_bytes: int,
    workspace: int,
) -> int:
    """The CPU pool's bytes when none were asked: the default, or one
    max_model_len request's blocks where that is more; ModelLoadError with
    the figures where that does not fit in what is available."""
    blocks_per_request = -(-max_model_len // block_size_tokens)
    needed = blocks_per_request * bytes_per_block
    budget = max(DEFAULT_CPU_KV_BYTES, needed)
    usable = available_bytes - workspace - RESERVE_BYTES
    if needed > usable:
        fits = max(usable, 0) // bytes_per_block * block_size_tokens
        raise ModelLoadError(
            f"one request of max_model_len {max_model_len} needs {needed / _GIB:.1f} GiB of KV "
            f"cache, but {available_bytes / _GIB:.1f} GiB of memory is available after the "
            f"weights (less {workspace / _GIB:.1f} GiB of workspace and {RESERVE_BYTES / _GIB:.0f}"
            f" GiB kept free): pass --max-model-len {fits} or less, or free memory"
        )
    return min(budget, usable)


def fitted_max_model_len(
    bytes_per_block: int,
    block_size_tokens: int,
    max_model_len: int,
    available_bytes: int,
    workspace: int,
) -> int | None:
    """Where no --max-model-len was asked and one request of the model's own
    limit does not fit (an 8B file declaring 131,072 tokens needs 16 GiB of
    bf16 KV): the context that half of the usable memory holds, in whole
    multiples of `FITTED_LEN_STEP`, so the default command starts instead of
    refusing. None where the model's limit fits, or where not even
    `MIN_FITTED_LEN` does (then `cpu_kv_budget` refuses with the figures)."""
    usable = available_bytes - workspace - RESERVE_BYTES
    if -(-max_model_len // block_size_tokens) * bytes_per_block <= usable:
        return None
    tokens = max(usable, 0) // 2 // bytes_per_block * block_size_tokens
    fitted = min(tokens // FITTED_LEN_STEP * FITTED_LEN_STEP, max_model_len)
    return fitted if fitted >= MIN_FITTED_LEN else None


def release_free_heap() -> bool:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim).

    A load leaves holes in the heap: the packing's temporaries (numpy arrays
    up to 32 MiB come from the heap, not their own mappings) freed between
    the packed matrices that stay. glibc returns only the heap's top on its
    own, so those pages stay resident: 835 MiB after a 3B Q4_K_M
    load. Called once the engine is built; True where pages went back.
    False where the C library has no malloc_trim (not glibc)."""
    trim = _malloc_trim()
    return trim is not None and bool(trim(0))


@functools.cache
def _malloc_trim():
    library = ctypes.util.find_library("c")
    function = getattr(ctypes.CDLL(library), "malloc_trim", None) if library else None
    if function is not None:
        function.argtypes = [ctypes.c_size_t]
        function.restype = ctypes.c_int
    return function


def check_weights_fit(name: str, weights_bytes: int, available_bytes: int) -> None:
    """Refuse, before loading, weights that cannot fit in memory at all."""
    if weights_bytes + RESERVE_BYTES > available_bytes:
        raise ModelLoadError(
            f"{name} needs about {weights_bytes / _GIB:.1f} GiB for its weights, but "
            f"{available_bytes / _GIB:.1f} GiB of memory is available (and "
            f"{RESERVE_BYTES / _GIB:.0f} GiB is kept free): use a smaller quantization "
            "(a Q4_K_M GGUF with --quantization gguf keeps the file's 4-bit blocks) or free memory"
        )
