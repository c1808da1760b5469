"""Paged attention over a block-table KV cache, for one mixed batch of sequences.

Cache layout, per layer: one tensor `[2, num_blocks, block_size, num_kv_heads,
head_dim]` (index 0 = K, 1 = V), allocated zeroed by `allocate_kv_caches`.
Position p of a sequence lives in block `block_table[p // block_size]` at
offset `p % block_size`, i.e. flat slot `block * block_size + offset`.

A batch holds B sequences; sequence b adds `query_lens[b]` new tokens after
`context_len[b]` tokens already in the cache. Its new tokens sit contiguously
in the flat token dimension, from `query_start_loc[b]` to `query_start_loc[b + 1]`.

Invariants of `paged_attention`:
- the batch's new K/V are written at `slot_mapping` before anything is read,
  so each query sees its whole context: cached tokens plus the new ones;
- query i of a sequence's chunk attends to keys 0 .. context_len + i (causal);
- sequences with one new token (decodes, the hot path) run together: on CPU
  in one call of a C kernel reading the cache in place (sluice/models/native),
  elsewhere (or without a C compiler) as one block gather and one batched
  SDPA call, padded to the longest with a mask;
  longer chunks (prefills) run one call each: on CPU in bfloat16 (heads of
  64 or 128) a flash-attention C kernel (native/prefill_attention.c or its
  AMX twin, causal over the cached context and the chunk together), the
  family the kernel plan measured at load (kernel_plan.py); on CPU with
  other heads or dtypes every token one row of the native decode kernel
  over exactly its own keys (`_prefill_rows`); torch's SDPA only where no
  native kernel runs or a pinned plan names it;
- the gather plans and masks depend on the batch only, not the layer: they
  are built once per step, in `AttentionMetadata.__post_init__`.

Chunk-blind attention (issue 44): on CPU with the native kernels, a token's
attention bits depend only on its own query and the keys and values at
positions up to it, whatever its batch, its prefill chunk, whether its
context came from a cache tier, or whether a decode step computed it. The
prefill and decode kernels of one family visit keys in blocks at fixed
absolute positions, through one per-row step (native/avx512_attention.h,
native/amx_attention.h), so a row gets the same bits from either kernel; the
kernel plan keeps torch's flash SDPA (whose reduction follows the chunk)
out of its measured plans. Which kernel computes a row is then a matter of
speed only: tokens of a multi-token chunk at positions below
`DECODE_ROW_POSITIONS`, and every token of a chunk of at most
`MAX_DECODE_ROW_CHUNK` (a speculative step's verification), run in the
decode kernel's call, the others in the prefill kernel.

`batch_invariant_attention` is the batch-invariant mode's: every new token,
prefill or decode, is one row of the decode kernel over exactly its own
keys. Chunk-blind attention gives the same bits, so for attention the mode
only repeats the default (its other kernels, matmuls and norms, still
differ).

Padding reads real (zeroed or stale) cache rows and masks them out, which is
safe because the cache never holds NaN or inf: it starts zeroed and only ever
receives finite K/V.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from sluice.models import kv_int8
from sluice.models.attention_metadata import (
    DECODE_ROW_POSITIONS,
    MAX_DECODE_ROW_CHUNK,
    AttentionMetadata,
    DecodePlan,
    PrefillPlan,
    TokenRows,
    _num_row_tokens,
)
from sluice.models.decoder_config import DecoderConfig
from sluice.models.kernel_plan import AMX, NATIVE, TORCH, KernelPlan
from sluice.models.native import (
    decode_attention_amx_kernel,
    decode_attention_int8kv_kernel,
    decode_attention_kernel,
    merge_attention_kernel,
)
from sluice.models.native.prefill import HEAD_DIMS as PREFILL_HEAD_DIMS
from sluice.models.native.prefill import prefill_attention_amx_kernel, prefill_attention_kernel
from sluice.models.sequence_state import (
    allocate_layer_state,
    state_bytes_per_sequence,
    state_layer_indices,
)
from sluice.models.zero_pages import zeros_on_touch

# Without a plan measured at load (kernel_plan.py): the native prefill kernel
# wherever it runs.
NATIVE_WHERE_IT_RUNS = KernelPlan()
# The per-step plans (attention_metadata.py), re-exported where callers found them.
__all__ = [
    "DECODE_ROW_POSITIONS", "MAX_DECODE_ROW_CHUNK", "NATIVE_WHERE_IT_RUNS", "AttentionMetadata",
    "DecodePlan", "PrefillPlan", "TokenRows", "_num_row_tokens", "allocate_kv_caches",
    "batch_invariant_attention", "decode_attention_torch", "decode_kernel", "decodes_on_amx",
    "kv_cache_bytes_per_block", "paged_attention", "prefill_attention_torch",
]  # fmt: skip


def allocate_kv_caches(
    config: DecoderConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device,
    num_state_slots: int = 1,
    with_snapshots: bool = True,
    kv_dtype: torch.dtype | None = None,
) -> list[Tensor]:
    """One zeroed `[2, num_blocks, block_size, num_kv_heads, head_dim]` pool per
    attention layer (its own heads: Gemma 4's full layers differ), the very
    pool of its source for a KV-shared layer (Gemma 4); a conv layer (hybrids)
    gets its state rows instead: one snapshot per block (`with_snapshots`: the
    prefix cache's) and `num_state_slots` live states (sequence_state.py).
    `kv_dtype` int8: the attention pools hold kv_int8.py's rows (head_dim * 5 / 4
    bytes: a scale per 16 channels); None: `dtype`."""
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    num_snapshots = num_blocks if with_snapshots else 0
    stateful = set(state_layer_indices(config))
    caches: list[Tensor] = []
    for index in range(config.num_hidden_layers):
        if index in stateful:
            caches.append(
                allocate_layer_state(config, index, num_snapshots, num_state_slots, dtype, device)
            )
        elif (source := config.kv_source_layer(index)) != index:
            caches.append(caches[source])
        else:
            heads, head_dim = config.layer_kv_shape(index)
            shape = (2, num_blocks, block_size, heads, kv_int8.row_width(head_dim, kv_dtype))
            caches.append(zeros_on_touch(shape, kv_dtype, device))
    return caches


def kv_cache_bytes_per_block(
    config: DecoderConfig,
    block_size: int,
    dtype: torch.dtype,
    with_snapshots: bool = True,
    kv_dtype: torch.dtype | None = None,
) -> int:
    """Bytes one block index costs summed over all layers (K and V of the
    attention layers in `kv_dtype`, `dtype` if None, and with snapshots the
    conv layers' state at its end)."""
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    stateful = set(state_layer_indices(config))
    owners = [
        index for index in range(config.num_hidden_layers)
        if index not in stateful and config.kv_source_layer(index) == index
    ]  # fmt: skip
    shapes = [config.layer_kv_shape(index) for index in owners]
    kv_values = sum(
        2 * block_size * heads * kv_int8.row_width(size, kv_dtype) for heads, size in shapes
    )
    snapshot = state_bytes_per_sequence(config, dtype) if with_snapshots else 0
    return kv_values * kv_dtype.itemsize + snapshot


def paged_attention(
    q: Tensor,  # [num_tokens, num_heads, head_dim]
    k: Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    meta: AttentionMetadata,
    scale: float,
    kv_written: bool = False,
    kernels: KernelPlan = NATIVE_WHERE_IT_RUNS,
) -> Tensor:  # [num_tokens, num_heads, head_dim]
    """Store the new K/V (unless the caller's RoPE kernel already did:
    `kv_written`), then attend each query over its sequence's context, each
    prefill chunk on the kernel `kernels` gives its length (kernel_plan.py)."""
    decode = meta.decode
    if kv_cache.dtype == torch.int8:  # the kernels read int8 rows dequantized (kv_int8.py)
        if not kv_written:
            kv_int8.write_kv(kv_cache, k, v, meta.slot_mapping)
        if decode is not None and decode.token_indices is None:  # every token a decode row
            out = _int8_decode_attention(q, kv_cache, decode, scale, kernels)
            if out is not None:
                return out
        k, v, kv_cache = kv_int8.prepare(
            k, v, kv_cache, meta.slot_mapping, meta.block_tables, kv_written=True
        )
    elif not kv_written:
        _write_kv(kv_cache, k, v, meta.slot_mapping)
    if decode is not None and decode.token_indices is None:  # every token a decode row
        return _decode_attention(q, kv_cache, decode, scale, kernels)
    out = torch.empty_like(q)  # [num_tokens, num_heads, head_dim]
    if decode is not None:
        decoded = _decode_attention(q[decode.token_indices], kv_cache, decode, scale, kernels)
        out.index_copy_(0, decode.token_indices, decoded)
    for plan in meta.prefills:
        chunk = slice(plan.token_start, plan.token_end)
        out[chunk] = _prefill_attention(
            q[chunk], k[chunk], v[chunk], kv_cache, plan, scale, kernels
        )
    return out


def batch_invariant_attention(
    q: Tensor,  # [num_tokens, num_heads, head_dim]
    k: Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    meta: AttentionMetadata,
    scale: float,
) -> Tensor:  # [num_tokens, num_heads, head_dim]
    """`paged_attention` with every token as one decode row (module docstring)."""
    if kv_cache.dtype == torch.int8:  # the kernels read int8 rows dequantized (kv_int8.py)
        k, v, kv_cache = kv_int8.prepare(
            k, v, kv_cache, meta.slot_mapping, meta.block_tables, kv_written=False
        )
    else:
        _write_kv(kv_cache, k, v, meta.slot_mapping)
    rows = meta.token_rows()
    if q.device.type == "cpu" and (kernel := decode_attention_kernel(q.dtype)) is not None:
        return kernel(q, kv_cache, rows.block_ids, rows.seq_lens, scale)
    out = torch.empty_like(q)  # [num_tokens, num_heads, head_dim]
    for token, seq_len in enumerate(rows.seq_lens.tolist()):
        # One token per call: the shapes, so the reduction, depend on that token only.
        num_blocks = -(-seq_len // meta.block_size)
        plan = DecodePlan(
            token_indices=None,
            block_ids=rows.block_ids[token, :num_blocks],
            num_blocks=num_blocks,
            num_keys=seq_len,
            key_mask=None,
            seq_lens=rows.seq_lens[token : token + 1],
        )
        out[token] = decode_attention_torch(q[token : token + 1], kv_cache, plan, scale)[0]
    return out


def _write_kv(kv_cache: Tensor, k: Tensor, v: Tensor, slot_mapping: Tensor) -> None:
    two, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    slots = kv_cache.view(two, num_blocks * block_size, num_kv_heads, head_dim)
    slots[0].index_copy_(0, slot_mapping, k)
    slots[1].index_copy_(0, slot_mapping, v)


def _decode_attention(
    q: Tensor,  # [num_decodes, num_heads, head_dim]
    kv_cache: Tensor,
    plan: DecodePlan,
    scale: float,
    kernels: KernelPlan = NATIVE_WHERE_IT_RUNS,
) -> Tensor:  # [num_decodes, num_heads, head_dim]
    if (
        q.device.type == "cpu"
        and (kernel := decode_kernel(q.dtype, q.shape[2], kernels)) is not None
    ):
        # The C kernel reads K/V in place: no gathered copy (sluice/models/native).
        block_ids = plan.block_ids.view(q.shape[0], plan.num_blocks)  # contiguous
        return kernel(q, kv_cache, block_ids, plan.seq_lens, scale)
    return decode_attention_torch(q, kv_cache, plan, scale)


def _int8_decode_attention(
    q: Tensor,  # [num_decodes, num_heads, head_dim]
    kv_cache: Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim * 5 / 4] int8
    plan: DecodePlan,
    scale: float,
    kernels: KernelPlan,
) -> Tensor | None:  # [num_decodes, num_heads, head_dim]
    """Decode rows straight over the int8 pool (paged_decode_attention.c
    dequantizes each 32-key step as it packs it), where the plan's decode
    kernel is the AVX512 one, whose bits it gives; None elsewhere (an AMX
    plan, other heads or dtypes): the caller dequantizes the step's blocks."""
    native_rows = decode_attention_kernel(torch.bfloat16)
    if (
        q.device.type != "cpu"
        or q.dtype != torch.bfloat16
        or native_rows is None
        or decode_kernel(q.dtype, q.shape[2], kernels) is not native_rows
        or (kernel := decode_attention_int8kv_kernel()) is None
    ):
        return None
    block_ids = plan.block_ids.view(q.shape[0], plan.num_blocks)  # contiguous
    return kernel(q, kv_cache, block_ids, plan.seq_lens, scale)


def decode_kernel(dtype: torch.dtype, head_dim: int, kernels: KernelPlan):
    """The native decode attention kernel the plan names for every decode row
    (the AMX one, where it runs: the AMX prefill kernel's head sizes), or
    None: torch's path."""
    amx = decode_attention_amx_kernel(dtype) if kernels.decode_attention == AMX else None
    if amx is not None and head_dim in PREFILL_HEAD_DIMS:
        return amx
    return decode_attention_kernel(dtype)


def decodes_on_amx(attend: object, head_dim: int) -> bool:
    """Whether a layer's `attend` (paged_attention, bound to a plan or not)
    runs its bfloat16 decode rows on decode_attention_amx.c."""
    kernels = attend.keywords.get("kernels") if isinstance(attend, functools.partial) else None
    amx = decode_attention_amx_kernel(torch.bfloat16)
    return (
        kernels is not None
        and amx is not None
        and decode_kernel(torch.bfloat16, head_dim, kernels) is amx
    )


def decode_attention_torch(
    q: Tensor,  # [num_decodes, num_heads, head_dim]
    kv_cache: Tensor,
    plan: DecodePlan,
    scale: float,
) -> Tensor:  # [num_decodes, num_heads, head_dim]
    """Decode attention in torch ops: gather the blocks, one batched SDPA call."""
    num_decodes, num_heads, head_dim = q.shape
    num_kv_heads = kv_cache.shape[3]
    blocks = kv_cache.index_select(1, plan.block_ids)  # [2, num_decodes * num_blocks, bs, Hkv, D]
    kv = blocks.view(2, num_decodes, -1, num_kv_heads, head_dim)[:, :, : plan.num_keys]
    # Grouped-query: the G query heads of one KV head are the "query positions"
    # of one attention row, so KV heads are never copied G times (query head h
    # uses KV head h // G, as in transformers' repeat_kv).
    grouped = q.reshape(num_decodes, num_kv_heads, -1, head_dim)  # [num_decodes, Hkv, G, D]
    out = F.scaled_dot_product_attention(
        grouped,
        kv[0].transpose(1, 2),  # [num_decodes, Hkv, num_keys, D]
        kv[1].transpose(1, 2),  # [num_decodes, Hkv, num_keys, D]
        attn_mask=plan.key_mask,
        scale=scale,
    )  # [num_decodes, Hkv, G, D]
    return out.reshape(num_decodes, num_heads, head_dim)


def _prefill_attention(
    q: Tensor,  # [query_len, num_heads, head_dim]
    k: Tensor,  # [query_len, num_kv_heads, head_dim]
    v: Tensor,  # [query_len, num_kv_heads, head_dim]
    kv_cache: Tensor,
    plan: PrefillPlan,
    scale: float,
    kernels: KernelPlan = NATIVE_WHERE_IT_RUNS,
) -> Tensor:  # [query_len, num_heads, head_dim]
    if (kernel := _native_prefill_kernel(q, kernels, plan.seq_len)) is not None:
        # native/prefill_attention.c or its AMX twin: causal over the chunk's
        # keys, with the cached context's before them (read back from the
        # cache, where the chunk's own were written first).
        if plan.block_ids is None:
            return kernel(q, k, v, scale)
        keys, values = _cached_kv(kv_cache, plan.block_ids, plan.seq_len)
        return kernel(q, keys, values, scale)
    # A plan that names torch for this length gets torch (a pinned --kernel-plan).
    if (
        kernels.prefill_kernel(plan.seq_len) != TORCH
        and (rows := _rows_kernel(q, kv_cache, kernels)) is not None
    ):
        return _prefill_rows(q, kv_cache, plan, scale, rows)
    if plan.block_ids is None:  # nothing cached before this chunk: it is the whole sequence
        return _sdpa(q, k, v, None, scale)
    if q.device.type == "cpu":
        return _cached_prefix_then_chunk(q, k, v, kv_cache, plan, scale)
    return _cached_prefix_masked(q, kv_cache, plan, scale)


# The head sizes and query heads per KV head native/paged_decode_attention.c
# takes (MAX_HEAD_DIM, MAX_GROUP there): larger ones keep torch's attention.
ROWS_MAX_HEAD_DIM, ROWS_MAX_GROUP = 256, 16


def _rows_kernel(q: Tensor, kv_cache: Tensor, kernels: KernelPlan):
    """The native decode kernel where it can run a prefill chunk's rows; else None."""
    group = q.shape[1] // kv_cache.shape[3]
    if q.device.type != "cpu" or q.shape[2] > ROWS_MAX_HEAD_DIM or group > ROWS_MAX_GROUP:
        return None
    return decode_kernel(q.dtype, q.shape[2], kernels)


def _prefill_rows(
    q: Tensor,  # [query_len, num_heads, head_dim]
    kv_cache: Tensor,
    plan: PrefillPlan,
    scale: float,
    kernel,
) -> Tensor:  # [query_len, num_heads, head_dim]
    """Every token of a chunk one row of the native decode kernel over exactly
    its own keys (the chunk's K/V are in the cache already): chunk-blind where
    no prefill kernel runs on these heads or this dtype."""
    assert plan.seq_blocks is not None, "a step's plans carry their blocks"
    seq_lens = torch.arange(plan.context_len + 1, plan.seq_len + 1)  # [query_len]
    block_ids = plan.seq_blocks.expand(q.shape[0], -1)  # [query_len, num_blocks]
    return kernel(q, kv_cache, block_ids, seq_lens, scale)


def _native_prefill_kernel(q: Tensor, kernels: KernelPlan, num_keys: int):
    """The native kernel the plan's band of `num_keys` names, where it runs
    on q; None: torch's flash attention."""
    if q.device.type != "cpu" or q.shape[2] not in PREFILL_HEAD_DIMS:
        return None
    name = kernels.prefill_kernel(num_keys)
    if name == AMX:
        return prefill_attention_amx_kernel(q.dtype)
    return prefill_attention_kernel(q.dtype) if name == NATIVE else None


def _cached_prefix_masked(
    q: Tensor,  # [query_len, num_heads, head_dim]
    kv_cache: Tensor,
    plan: PrefillPlan,
    scale: float,
) -> Tensor:  # [query_len, num_heads, head_dim]
    """A chunk after cached context in one call over all its keys (from the
    cache, where the chunk's own were written first), causal by a mask."""
    keys, values = _cached_kv(kv_cache, plan.block_ids, plan.seq_len)  # [seq_len, Hkv, D]
    key_pos = torch.arange(plan.seq_len, device=q.device)  # [seq_len]
    query_pos = key_pos[plan.context_len :]  # [query_len]
    mask = key_pos[None, :] <= query_pos[:, None]  # [query_len, seq_len]: j <= context + i
    return _sdpa(q, keys, values, mask, scale)


def prefill_attention_torch(q: Tensor, keys: Tensor, values: Tensor, scale: float) -> Tensor:
    """Causal attention of a whole prompt ([L, Hq, D] over [L, Hkv, D]) on
    torch's flash SDPA: the native kernel's rival (kernel_plan.py)."""
    return _sdpa(q, keys, values, None, scale)


def _sdpa(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """[query_len, Hq, D] over [seq_len, Hkv, D] keys and values; causal when
    `mask` is None (then query_len == seq_len)."""
    # 4-d inputs: with 3-d ones torch's CPU dispatch takes the unfused math
    # path (4x slower at 1,000 tokens); 4-d ones get the flash kernel.
    out = F.scaled_dot_product_attention(
        _heads_first(q),  # [1, Hq, query_len, D]
        _heads_first(keys),  # [1, Hkv, seq_len, D]
        _heads_first(values),  # [1, Hkv, seq_len, D]
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=True,
    )  # [1, Hq, query_len, D]
    return out[0].transpose(0, 1)


def _cached_prefix_then_chunk(
    q: Tensor,  # [query_len, num_heads, head_dim]
    k: Tensor,  # [query_len, num_kv_heads, head_dim]
    v: Tensor,  # [query_len, num_kv_heads, head_dim]
    kv_cache: Tensor,
    plan: PrefillPlan,
    scale: float,
) -> Tensor:  # [query_len, num_heads, head_dim]
    """A chunk after cached context, on CPU: attention over the context (every
    key visible) and causal attention over the chunk itself, merged by their
    log-sum-exps. One masked call over all keys (the other devices' path)
    computes the masked half of the chunk's square too, and builds the mask:
    a 2,000-token prompt behind a cached system prompt (16 tokens) prefilled
    in 3.1 s that way, 2.2 s without a cached prefix."""
    context_keys, context_values = _cached_kv(kv_cache, plan.block_ids, plan.context_len)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    query = _heads_first(q)  # [1, Hq, query_len, D]
    # Grouped-query heads broadcast inside the kernel (Hq a multiple of Hkv).
    context_out, context_lse = flash(
        query, _heads_first(context_keys), _heads_first(context_values), 0.0, False, scale=scale
    )  # [1, Hq, query_len, D], [1, Hq, query_len] float32
    chunk_out, chunk_lse = flash(query, _heads_first(k), _heads_first(v), 0.0, True, scale=scale)
    if q.dtype == torch.bfloat16 and (merge := merge_attention_kernel()) is not None:
        # One native pass (rows.c): the outputs [1, Hq, L, D] and log-sum-exps
        # [1, Hq, L] are [L, Hq, D] and [L, Hq] in memory.
        out = torch.empty_like(q)  # [query_len, num_heads, head_dim]
        merge(context_out[0].transpose(0, 1), context_lse[0].t(), chunk_out[0].transpose(0, 1),
              chunk_lse[0].t(), out)  # fmt: skip
        return out
    top = torch.maximum(context_lse, chunk_lse)
    context_weight = (context_lse - top).exp_()[..., None]  # [1, Hq, query_len, 1]
    chunk_weight = (chunk_lse - top).exp_()[..., None]
    merged = context_out.float().mul_(context_weight).add_(chunk_out.float().mul_(chunk_weight))
    merged = merged.div_(context_weight + chunk_weight).to(q.dtype)
    return merged[0].transpose(0, 1)


def _cached_kv(kv_cache: Tensor, block_ids: Tensor, num_tokens: int) -> tuple[Tensor, Tensor]:
    """The first `num_tokens` cached keys and values of a sequence on `block_ids`,
    gathered into [num_tokens, Hkv, D] each."""
    block_size = kv_cache.shape[2]
    blocks = kv_cache.index_select(1, block_ids[: -(-num_tokens // block_size)])
    kv = blocks.flatten(1, 2)[:, :num_tokens]  # [2, num_tokens, Hkv, D]
    return kv[0], kv[1]


def _heads_first(x: Tensor) -> Tensor:  # [tokens, heads, D] -> [1, heads, tokens, D]
    return x.transpose(0, 1)[None]
