"""8-bit KV cache (`--kv-cache-dtype int8`, issue 44): a fixed per-group scheme.

Layout: an int8 pool per attention layer, `[2, num_blocks, block_size,
num_kv_heads, row_width(head_dim)]`. Each (token, KV head) row holds its K
(or V) vector as int8 values, then one float32 scale per GROUP (16)
channels: a group's values are q = round(x / s), clamped to [-127, 127],
with s = absmax(group) / 127 (0 for an all-zero group), so a row is
head_dim * 5 / 4 bytes (80 for heads of 64, 160 for 128). The value read
back is bf16(float(q) * s), rounded to nearest even. Scales per 16 channels
and not per row because keys have outlier channels: one scale per row
cost +1.14% perplexity on tests/data/quality_text.txt, one per 16 channels
+0.18% (docs/OPERATIONS.md, "KV sizing", has the measurements). So:

- a token's stored bytes depend only on its own K/V, and the bits read back
  only on those bytes: whatever chunk, batch or step computed the token, the
  attention kernels see the same keys and values, and keep their own
  guarantees (chunk-blind, row-invariant: sluice/models/attention.py);
- a new token's own K/V, which a prefill kernel reads straight from the step
  and not from the cache, go through the same round trip (`prepare`): the
  chunk's rows then read exactly what a later step reads from the pool;
- the scales live inside the row, so a block's bytes are the whole block:
  the RAM and disk tiers (sluice/engine/kv_tiers.py, kv_disk.py) carry int8
  blocks with their scales as they carry bf16 ones.

Reading: a step whose every token is a decode row, where the plan's decode
kernel is the AVX512 one, reads the int8 pool in place
(native/paged_decode_attention.c dequantizes each 32-key step as it packs
it, to the same bf16 words). Every other step (prefill chunks, mixed
batches, AMX plans, heads the fixed-block kernels do not take) goes through
`prepare`, which dequantizes every block the step's block tables name into a
pool shaped like a bf16 one, at the same block ids, which every kernel
(AVX512, AMX, torch's) reads unchanged: the plan picks the same kernels for
int8 KV as for bf16, and a decode row gets the same bits either way. That
pass costs a read of the step's blocks per layer, amortised over a prefill
chunk's rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Channels that share one float32 scale; the scales follow a row's values.
GROUP = 16
SCALE_BYTES = 4  # per group
INT8_MAX = 127.0
# What --kv-cache-dtype takes; the fp8 names are refused with a line saying why.
KV_CACHE_DTYPES = ("auto", "bf16", "int8")
FP8_NAMES = ("fp8", "fp8_e4m3", "fp8_e5m2")


def kv_torch_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The pool's dtype for --kv-cache-dtype `name`: auto keeps the model's
    dtype (bf16 KV on CPU's bfloat16 default: int8 costs +0.2% perplexity and
    decodes as fast, but prefills a 3,000-token prompt 13% slower through
    `prepare`'s torch pass, docs/OPERATIONS.md), int8 is this module's layout."""
    if name == "int8":
        return torch.int8
    if name == "bf16" and model_dtype != torch.bfloat16:
        raise ValueError(f"bf16: needs a bfloat16 model (--dtype bfloat16), not {model_dtype}")
    return model_dtype


def row_width(head_dim: int, kv_dtype: torch.dtype) -> int:
    """Elements of one (token, KV head) row of the pool."""
    if kv_dtype != torch.int8:
        return head_dim
    if head_dim % GROUP:
        raise ValueError(f"int8 KV needs heads of a multiple of {GROUP} channels, not {head_dim}")
    return head_dim + head_dim // GROUP * SCALE_BYTES


def head_dim_of(width: int) -> int:
    """The head_dim of an int8 row of `width` bytes (row_width's inverse)."""
    return width * GROUP // (GROUP + SCALE_BYTES)


def quantize_rows(x: Tensor) -> Tensor:  # [..., D] -> [..., D * 5 / 4] int8
    """Each vector of the last dimension as int8 values and a float32 scale
    per GROUP channels."""
    head_dim = x.shape[-1]
    row_width(head_dim, torch.int8)  # refuses a head_dim the groups do not divide
    values = x.float().reshape(*x.shape[:-1], head_dim // GROUP, GROUP)  # [..., G, 16]
    scale = values.abs().amax(dim=-1, keepdim=True) / INT8_MAX  # [..., G, 1]
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(values / divisor).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    scale_bytes = scale.contiguous().view(torch.int8)  # [..., G, 4]
    return torch.cat([q.flatten(-2), scale_bytes.flatten(-2)], dim=-1)


def dequantize_rows(rows: Tensor, dtype: torch.dtype) -> Tensor:  # [..., D * 5 / 4] -> [..., D]
    """The values a quantized row stands for, rounded once to `dtype`."""
    head_dim = head_dim_of(rows.shape[-1])
    groups = head_dim // GROUP
    scale = rows[..., head_dim:].contiguous().view(torch.float32)  # [..., G]
    values = rows[..., :head_dim].float().reshape(*rows.shape[:-1], groups, GROUP)
    return (values * scale[..., None]).flatten(-2).to(dtype)


def write_kv(kv_cache: Tensor, k: Tensor, v: Tensor, slot_mapping: Tensor) -> None:
    """Quantize the new K/V ([T, Hkv, D]) into the int8 pool at their slots."""
    two, num_blocks, block_size, num_kv_heads, width = kv_cache.shape
    slots = kv_cache.view(two, num_blocks * block_size, num_kv_heads, width)
    slots[0].index_copy_(0, slot_mapping, quantize_rows(k))
    slots[1].index_copy_(0, slot_mapping, quantize_rows(v))


def round_trip(x: Tensor) -> Tensor:
    """`x` as the pool gives it back: what a later step reads for these rows."""
    return dequantize_rows(quantize_rows(x), x.dtype)


def readable_pool(kv_cache: Tensor, block_ids: Tensor, dtype: torch.dtype) -> Tensor:
    """A `[2, num_blocks, block_size, Hkv, D]` pool of `dtype` whose blocks
    `block_ids` hold the int8 pool's blocks dequantized (the others are never
    read: every kernel reads only blocks its tables name)."""
    two, num_blocks, block_size, num_kv_heads, width = kv_cache.shape
    shape = (two, num_blocks, block_size, num_kv_heads, head_dim_of(width))
    pool = torch.empty(shape, dtype=dtype, device=kv_cache.device)
    ids = torch.unique(block_ids)  # [n] int64
    pool.index_copy_(1, ids, dequantize_rows(kv_cache.index_select(1, ids), dtype))
    return pool


def prepare(
    k: Tensor,  # [T, Hkv, D]
    v: Tensor,  # [T, Hkv, D]
    kv_cache: Tensor,  # [2, num_blocks, block_size, Hkv, D * 5 / 4] int8
    slot_mapping: Tensor,  # [T] int64
    block_tables: Tensor,  # [B, max_num_blocks] int64
    *,
    kv_written: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Store the step's K/V quantized (unless a kernel did), and give back
    what attention reads instead: the step's K/V as the pool will return
    them, and a readable pool of the step's blocks."""
    if not kv_written:
        write_kv(kv_cache, k, v, slot_mapping)
    return round_trip(k), round_trip(v), readable_pool(kv_cache, block_tables, k.dtype)
