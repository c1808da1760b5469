"""The fixed key blocks of the AVX512-BF16 attention kernels (native/avx512_attention.c):
a query row's bits depend only on its own q and the keys and values up to
its position (issue 44).

- a whole prompt in one prefill call, the same prompt cut into random
  chunks (each after its cached context), and every position as a decode
  row over a paged cache with scattered blocks give bitwise the same rows;
- for heads of 64 and 128, plain, grouped (3 and 8 query heads a KV head)
  and wide groups (12: two row states a KV head), lengths on and off the
  32-key steps, one sequence alone and beside others of other lengths;
- the outputs stay as close to float32 attention as before.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from sluice.loader.choices import cpu_flags
from sluice.models.native import decode_attention_kernel, find_compiler
from sluice.models.native.prefill import prefill_attention_kernel

requires_kernels = pytest.mark.skipif(
    find_compiler() is None or "avx512_bf16" not in cpu_flags(),
    reason="no C compiler or no AVX512-BF16 here",
)
SCALE = 0.125
BLOCK = 16
HEADS = [((9, 3), 64), ((8, 1), 128), ((4, 4), 128), ((16, 2), 64), ((24, 2), 64)]


def sequence(num_keys: int, heads, head_dim: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    num_heads, num_kv_heads = heads
    q = torch.randn(num_keys, num_heads, head_dim, generator=generator).bfloat16()
    k = torch.randn(num_keys, num_kv_heads, head_dim, generator=generator).bfloat16()
    v = torch.randn(num_keys, num_kv_heads, head_dim, generator=generator).bfloat16()
    return q, k, v


def paged(k, v, seed: int):
    """K/V in a cache of scattered 16-token blocks, and the sequence's table."""
    num_keys, num_kv_heads, head_dim = k.shape
    num_blocks = -(-num_keys // BLOCK)
    table = torch.randperm(num_blocks + 5, generator=torch.Generator().manual_seed(seed))
    table = table[:num_blocks]
    cache = torch.zeros(2, num_blocks + 5, BLOCK, num_kv_heads, head_dim, dtype=torch.bfloat16)
    slots = table.repeat_interleave(BLOCK)[:num_keys] * BLOCK + torch.arange(num_keys) % BLOCK
    flat = cache.view(2, -1, num_kv_heads, head_dim)
    flat[0, slots], flat[1, slots] = k, v
    return cache, table


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@requires_kernels
@pytest.mark.parametrize(("heads", "head_dim"), HEADS)
@pytest.mark.parametrize("num_keys", [1, 31, 33, 100, 517])
def test_a_row_gets_the_same_bits_in_any_chunk_and_as_a_decode_row(heads, head_dim, num_keys):
    prefill = prefill_attention_kernel(torch.bfloat16)
    decode = decode_attention_kernel(torch.bfloat16)
    q, k, v = sequence(num_keys, heads, head_dim, seed=num_keys)
    whole = prefill(q, k, v, SCALE)  # [num_keys, Hq, D]
    rng = random.Random(num_keys)
    start = 0
    while start < num_keys:
        end = min(num_keys, start + rng.randint(1, 80))
        chunk = prefill(q[start:end], k[:end], v[:end], SCALE)
        assert same_bits(chunk, whole[start:end]), (start, end)
        start = end
    cache, table = paged(k, v, seed=num_keys)
    rows = decode(q, cache, table.repeat(num_keys, 1), torch.arange(1, num_keys + 1), SCALE)
    differing = (rows.view(torch.int16) != whole.view(torch.int16)).flatten(1).any(1)
    assert not differing.any(), f"decode rows differ at {differing.nonzero().flatten()[:8]}"


@requires_kernels
def test_a_decode_row_is_the_same_beside_other_sequences():
    decode = decode_attention_kernel(torch.bfloat16)
    heads, head_dim = (9, 3), 64
    lengths = [700, 5, 64, 300, 1, 129, 33, 450, 96]  # enough sequences for whole-sequence tasks
    alone, caches = [], []
    for i, n in enumerate(lengths):
        q, k, v = sequence(n, heads, head_dim, seed=100 + i)
        cache, table = paged(k, v, seed=100 + i)
        alone.append(decode(q[-1:], cache, table[None], torch.tensor([n]), SCALE)[0])
        caches.append((q[-1], cache, table))
    # One pool holding every sequence's blocks, each table offset into it.
    pool = torch.cat([cache for _, cache, _ in caches], dim=1)
    offsets = [0]
    for _, cache, _ in caches:
        offsets.append(offsets[-1] + cache.shape[1])
    width = max(len(table) for _, _, table in caches)
    tables = torch.zeros(len(lengths), width, dtype=torch.int64)
    for i, (_, _, table) in enumerate(caches):
        tables[i, : len(table)] = table + offsets[i]
    together = decode(torch.stack([q for q, _, _ in caches]), pool, tables,
                      torch.tensor(lengths), SCALE)  # fmt: skip
    for i in range(len(lengths)):
        assert same_bits(together[i], alone[i]), lengths[i]


@requires_kernels
@pytest.mark.parametrize(("heads", "head_dim"), HEADS[:3])
def test_the_rows_stay_as_close_to_float32_attention_as_bfloat16_allows(heads, head_dim):
    q, k, v = sequence(300, heads, head_dim, seed=3)
    got = prefill_attention_kernel(torch.bfloat16)(q, k, v, SCALE).float()
    exact = F.scaled_dot_product_attention(
        *(x.float().transpose(0, 1)[None] for x in (q, k, v)),
        is_causal=True, scale=SCALE, enable_gqa=True,
    )[0].transpose(0, 1)  # fmt: skip
    assert (got - exact).abs().max() <= 2**-6
