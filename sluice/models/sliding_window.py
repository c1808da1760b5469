"""Attention over the last `window` positions only, for Gemma 3's local layers.

The KV cache keeps every block of a sliding layer, as it does a global
layer's: the engine's block accounting, prefix cache and preemption stay
exactly those of full attention, and a sliding layer simply reads less. The
price is memory: a sliding layer's old blocks are kept though never read
again (vLLM frees them; sluice does not yet).

Query at position p sees keys p - window < j <= p (transformers'
`sliding_window_overlay` on top of the causal mask). Each sequence of a step
runs as one SDPA call over the blocks its window touches, with that mask:
the torch path, since the native decode and prefill kernels read a
sequence's keys from position 0. In batch-invariant mode every token is its
own call over exactly its own keys, so its bits are the same in any batch,
chunking or prefix-cache hit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sluice.models.attention import AttentionMetadata, _sdpa, _write_kv


def sliding_window_attention(
    q: Tensor,  # [num_tokens, num_heads, head_dim]
    k: Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    meta: AttentionMetadata,
    scale: float,
    kv_written: bool = False,
    *,
    window: int,
    is_batch_invariant: bool = False,
) -> Tensor:  # [num_tokens, num_heads, head_dim]
    """Store the new K/V (unless already written), then attend each query
    over the keys of its window."""
    if not kv_written:
        _write_kv(kv_cache, k, v, meta.slot_mapping)
    out = torch.empty_like(q)
    token_start = 0
    for b, (query_len, seq_len) in enumerate(zip(meta.query_lens, meta.seq_lens_list, strict=True)):
        table = meta.block_tables[b]
        if is_batch_invariant:
            spans = [(seq_len - query_len + i, 1) for i in range(query_len)]
        else:
            spans = [(seq_len - query_len, query_len)]
        for first_position, num_queries in spans:
            rows = slice(token_start, token_start + num_queries)
            out[rows] = _window_span(q[rows], kv_cache, table, first_position, window, scale)
            token_start += num_queries
    return out


def _window_span(
    q: Tensor,  # [num_queries, num_heads, head_dim], positions first_position...
    kv_cache: Tensor,
    table: Tensor,  # [max_blocks] int64, the sequence's blocks
    first_position: int,
    window: int,
    scale: float,
) -> Tensor:  # [num_queries, num_heads, head_dim]
    num_queries = q.shape[0]
    end = first_position + num_queries  # keys [first_key, end)
    first_key = max(0, first_position - window + 1)
    keys, values = _keys_between(kv_cache, table, first_key, end)  # [S, Hkv, D] each
    key_pos = torch.arange(first_key, end, device=q.device)  # [S]
    query_pos = torch.arange(first_position, end, device=q.device)[:, None]  # [L, 1]
    # Always a mask: without one _sdpa is causal from the top left (L < S here).
    mask = (key_pos <= query_pos) & (key_pos > query_pos - window)  # [L, S]
    return _sdpa(q, keys, values, mask, scale)


def _keys_between(kv_cache: Tensor, table: Tensor, start: int, end: int) -> tuple[Tensor, Tensor]:
    """Cached keys and values of positions [start, end), [end - start, Hkv, D] each,
    gathered from only the blocks that hold them."""
    block_size = kv_cache.shape[2]
    first_block = start // block_size
    blocks = kv_cache.index_select(1, table[first_block : -(-end // block_size)])
    offset = first_block * block_size
    kv = blocks.flatten(1, 2)[:, start - offset : end - offset]  # [2, end - start, Hkv, D]
    return kv[0], kv[1]
