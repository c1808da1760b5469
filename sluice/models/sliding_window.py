"""Attention over the last `window` positions only, for Gemma 3's local layers
(and every gpt-oss layer: its attention sinks run here, sluice/models/gpt_oss.py).

The KV cache keeps every block of a sliding layer, as it does a global
layer's: the engine's block accounting, prefix cache and preemption stay
exactly those of full attention, and a sliding layer simply reads less. The
price is memory: a sliding layer's old blocks are kept though never read
again (vLLM frees them; sluice does not yet).

Query at position p sees keys p - window < j <= p (transformers'
`sliding_window_overlay` on top of the causal mask). The one-token sequences
of a step (decodes) run together as one SDPA call, each over the blocks its
window touches; each longer chunk runs as its own call with that mask: the
torch path, since the native decode and prefill kernels read a sequence's
keys from position 0. In batch-invariant mode every token is its
own call over exactly its own keys, so its bits are the same in any batch,
chunking or prefix-cache hit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from sluice.models import kv_int8
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
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> Tensor:  # [num_tokens, num_heads, head_dim]
    """Store the new K/V (unless already written), then attend each query
    over the keys of its window (scores capped at `softcap` first, if set;
    `sinks` [num_heads], if set: one more logit per head in the softmax's
    denominator, gpt-oss's attention sinks, which attend to nothing)."""
    if kv_cache.dtype == torch.int8:  # read dequantized (kv_int8.py)
        k, v, kv_cache = kv_int8.prepare(
            k, v, kv_cache, meta.slot_mapping, meta.block_tables, kv_written=kv_written
        )
    elif not kv_written:
        _write_kv(kv_cache, k, v, meta.slot_mapping)
    out = torch.empty_like(q)
    decodes = [] if is_batch_invariant else [b for b, n in enumerate(meta.query_lens) if n == 1]
    if decodes:
        _decode_windows(q, out, kv_cache, meta, decodes, window, scale, softcap, sinks)
    for b, (query_len, seq_len) in enumerate(zip(meta.query_lens, meta.seq_lens_list, strict=True)):
        if not is_batch_invariant and query_len == 1:
            continue  # done above
        # (first query's position, its row, number of queries) per SDPA call.
        first_position, first_row = seq_len - query_len, meta.query_start_loc[b].item()
        if is_batch_invariant:
            spans = [(first_position + i, first_row + i, 1) for i in range(query_len)]
        else:
            spans = [(first_position, first_row, query_len)]
        for position, row, num_queries in spans:
            rows = slice(row, row + num_queries)
            table = meta.block_tables[b]
            out[rows] = _window_span(
                q[rows], kv_cache, table, position, window, scale, softcap, sinks
            )
    return out


def _decode_windows(
    q: Tensor,  # [num_tokens, num_heads, head_dim]
    out: Tensor,  # [num_tokens, num_heads, head_dim], written at the decodes' rows
    kv_cache: Tensor,
    meta: AttentionMetadata,
    decodes: list[int],  # sequences of the batch with one new token
    window: int,
    scale: float,
    softcap: float | None,
    sinks: Tensor | None = None,
) -> None:
    """Every one-token sequence in one SDPA call: each gathers the blocks its
    window touches (padded to the most any needs), a mask keeps the window."""
    block_size = kv_cache.shape[2]
    device = q.device
    rows = torch.tensor(decodes, dtype=torch.int64, device=device)  # [n]
    seq_lens = meta.seq_lens[rows]  # [n]
    first_keys = (seq_lens - window).clamp_(min=0)  # [n]: position p sees p - window < j
    first_blocks = first_keys // block_size  # [n]
    num_blocks = int(((seq_lens + block_size - 1) // block_size - first_blocks).max())
    tables = F.pad(meta.block_tables[rows], (0, num_blocks))  # [n, W + num_blocks]
    offsets = torch.arange(num_blocks, device=device)  # [num_blocks]
    block_ids = tables.gather(1, first_blocks[:, None] + offsets)  # [n, num_blocks]
    num_kv_heads, head_dim = kv_cache.shape[3], kv_cache.shape[4]
    kv = kv_cache.index_select(1, block_ids.view(-1)).view(2, len(decodes), -1, num_kv_heads,
                                                          head_dim)  # fmt: skip
    key_pos = first_blocks[:, None] * block_size + torch.arange(kv.shape[2], device=device)
    mask = (key_pos >= first_keys[:, None]) & (key_pos < seq_lens[:, None])  # [n, K]
    token_rows = meta.query_start_loc[rows]  # [n]
    if softcap is not None or sinks is not None:
        keys, values = kv[0].transpose(1, 2), kv[1].transpose(1, 2)  # [n, Hkv, K, D]
        capped = _capped_attention(q[token_rows][:, :, None], keys, values,
                                   mask[:, None, None, :], scale, softcap, sinks)  # fmt: skip
        out[token_rows] = capped[:, :, 0]  # [n, Hq, D]
        return
    # Grouped-query heads as query positions of their KV head (decode_attention_torch).
    grouped = q[token_rows].reshape(len(decodes), num_kv_heads, -1, head_dim)  # [n, Hkv, G, D]
    attended = F.scaled_dot_product_attention(
        grouped,
        kv[0].transpose(1, 2),  # [n, Hkv, K, D]
        kv[1].transpose(1, 2),  # [n, Hkv, K, D]
        attn_mask=mask[:, None, None, :],
        scale=scale,
    )  # [n, Hkv, G, D]
    out[token_rows] = attended.reshape(len(decodes), -1, head_dim)


def _window_span(
    q: Tensor,  # [num_queries, num_heads, head_dim], positions first_position...
    kv_cache: Tensor,
    table: Tensor,  # [max_blocks] int64, the sequence's blocks
    first_position: int,
    window: int,
    scale: float,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> Tensor:  # [num_queries, num_heads, head_dim]
    num_queries = q.shape[0]
    end = first_position + num_queries  # keys [first_key, end)
    first_key = max(0, first_position - window + 1)
    keys, values = _keys_between(kv_cache, table, first_key, end)  # [S, Hkv, D] each
    key_pos = torch.arange(first_key, end, device=q.device)  # [S]
    query_pos = torch.arange(first_position, end, device=q.device)[:, None]  # [L, 1]
    # Always a mask: without one _sdpa is causal from the top left (L < S here).
    mask = (key_pos <= query_pos) & (key_pos > query_pos - window)  # [L, S]
    if softcap is not None or sinks is not None:
        heads_first = [x.transpose(0, 1)[None] for x in (q, keys, values)]  # [1, H, L|S, D]
        return _capped_attention(*heads_first, mask, scale, softcap, sinks)[0].transpose(0, 1)
    return _sdpa(q, keys, values, mask, scale)


def _capped_attention(
    q: Tensor,  # [B, Hq, L, D]
    keys: Tensor,  # [B, Hkv, S, D]
    values: Tensor,  # [B, Hkv, S, D]
    mask: Tensor,  # bool, broadcast to [B, Hq, L, S]
    scale: float,
    softcap: float | None,
    sinks: Tensor | None = None,  # [Hq]
) -> Tensor:  # [B, Hq, L, D]
    """Attention with scores capped at softcap * tanh(scores / softcap), as
    transformers' Gemma 2 computes it, and/or with a sink logit per head
    beside the keys, dropped after the softmax, as its gpt-oss does (no fused
    kernel here does either)."""
    groups = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(groups, dim=1)  # [B, Hq, S, D]
    values = values.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, keys.transpose(2, 3)) * scale  # [B, Hq, L, S]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        weights = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
    else:
        sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        with_sink = torch.cat([scores, sink], dim=-1)  # [B, Hq, L, S + 1]
        weights = with_sink.softmax(dim=-1, dtype=torch.float32)[..., :-1].to(q.dtype)
    return torch.matmul(weights, values)


def _keys_between(kv_cache: Tensor, table: Tensor, start: int, end: int) -> tuple[Tensor, Tensor]:
    """Cached keys and values of positions [start, end), [end - start, Hkv, D] each,
    gathered from only the blocks that hold them."""
    block_size = kv_cache.shape[2]
    first_block = start // block_size
    blocks = kv_cache.index_select(1, table[first_block : -(-end // block_size)])
    offset = first_block * block_size
    kv = blocks.flatten(1, 2)[:, start - offset : end - offset]  # [2, end - start, Hkv, D]
    return kv[0], kv[1]
