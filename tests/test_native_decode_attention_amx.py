"""The AMX-BF16 decode attention kernel (native/decode_attention_amx.c).

What it promises, bit for bit: a decode row's result is the one its query
gets in a prefill chunk on the AMX prefill kernel (so decode rows, the rows
of a speculative verification and prompt chunks agree on that plan), and a
row gets the same bits alone as among the rows of its sequence that share
the packed keys (a verification) or among other sequences. And closeness:
within what the native decode kernel errs by against float32 attention.
Paged tables with blocks out of order, block sizes that split its 16-key
tiles, heads of 64 and 128, grouped-query and plain heads.

Skipped only where the CPU has no AMX-BF16; where it has and a compiler
exists, the kernel must be there (a failed build fails here).
"""

from __future__ import annotations

import pytest
import torch

from sluice.loader.choices import cpu_flags
from sluice.models.native import (
    decode_attention_amx_kernel,
    decode_attention_kernel,
    find_compiler,
)
from sluice.models.native.prefill import prefill_attention_amx_kernel

pytestmark = pytest.mark.skipif(
    find_compiler() is None or not {"amx_tile", "amx_bf16"} <= cpu_flags(),
    reason="no C compiler or no AMX-BF16 here",
)


@pytest.fixture
def kernel():
    kernel = decode_attention_amx_kernel(torch.bfloat16)
    assert kernel is not None, "the CPU has AMX-BF16 but the kernel was not built or not granted"
    return kernel


def paged(seed, num_keys, heads, kv_heads, head_dim, block_size):
    """A cache whose blocks hold one sequence's keys out of order: (cache,
    table [blocks], slots of positions 0..num_keys-1)."""
    generator = torch.Generator().manual_seed(seed)
    blocks = -(-num_keys // block_size) + 3
    cache = torch.randn(2, blocks, block_size, kv_heads, head_dim, generator=generator)
    table = torch.randperm(blocks, generator=generator)
    slots = (table[:, None] * block_size + torch.arange(block_size)).reshape(-1)[:num_keys]
    return cache.to(torch.bfloat16), table, slots


def float32_attention(q, keys, values, scale):
    """One query row [H, D] over keys/values [n, Hkv, D], in float32."""
    heads, kv_heads = q.shape[0], keys.shape[1]
    grouped = q.float().view(kv_heads, heads // kv_heads, -1)
    scores = torch.einsum("hgd,khd->hgk", grouped, keys.float()) * scale
    return torch.einsum("hgk,khd->hgd", scores.softmax(-1), values.float()).reshape(heads, -1)


SHAPES = [  # (query heads, KV heads, head_dim, block_size, keys of the first row)
    (9, 3, 64, 16, 1300),
    (4, 4, 128, 16, 200),
    (6, 2, 64, 7, 131),
    (8, 2, 64, 32, 64),
    (3, 1, 64, 16, 1),
]


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "block_size", "first"), SHAPES)
def test_a_verification_gets_the_bits_of_its_rows_alone_and_of_prefill(
    kernel, heads, kv_heads, head_dim, block_size, first
):
    rows = 17
    cache, table, slots = paged(first, first + rows - 1, heads, kv_heads, head_dim, block_size)
    q = torch.randn(rows, heads, head_dim).to(torch.bfloat16)
    ids = table.repeat(rows, 1)
    lens = torch.arange(first, first + rows)
    scale = head_dim**-0.5
    together = kernel(q, cache, ids, lens, scale)
    for r in range(rows):
        alone = kernel(q[r : r + 1], cache, ids[r : r + 1], lens[r : r + 1], scale)
        assert torch.equal(alone[0], together[r]), f"row {r}"
    keys = cache[0].reshape(-1, kv_heads, head_dim)[slots]
    values = cache[1].reshape(-1, kv_heads, head_dim)[slots]
    prefill = prefill_attention_amx_kernel(torch.bfloat16)
    assert torch.equal(prefill(q, keys, values, scale), together)
    native = decode_attention_kernel(torch.bfloat16)(q, cache, ids, lens, scale)
    for r in range(rows):
        reference = float32_attention(q[r], keys[: lens[r]], values[: lens[r]], scale)
        error = (together[r].float() - reference).abs().max().item()
        native_error = (native[r].float() - reference).abs().max().item()
        assert error <= max(2 * native_error, 2e-3), f"row {r}: {error} against {native_error}"


def test_rows_of_other_sequences_do_not_change_a_rows_bits(kernel):
    """A step of single decodes and a verification, the sequences' blocks apart."""
    heads, kv_heads, head_dim, block_size = 9, 3, 64, 16
    cache, table, _ = paged(5, 64 * 40, heads, kv_heads, head_dim, block_size)
    generator = torch.Generator().manual_seed(2)
    per_seq = table[: (len(table) // 8) * 8].view(8, -1)
    lens = [3, 310, 64, 65, 191, 300, 300, 17]
    ids, seq_lens = [], []
    for s, length in enumerate(lens):
        for extra in range(5 if s == 4 else 1):  # sequence 4 verifies 4 drafted tokens
            ids.append(per_seq[s])
            seq_lens.append(length + extra)
    ids, seq_lens = torch.stack(ids), torch.tensor(seq_lens)
    q = torch.randn(len(seq_lens), heads, head_dim, generator=generator).to(torch.bfloat16)
    step = kernel(q, cache, ids, seq_lens, 0.125)
    for r in range(len(seq_lens)):
        alone = kernel(q[r : r + 1], cache, ids[r : r + 1], seq_lens[r : r + 1], 0.125)
        assert torch.equal(alone[0], step[r]), f"row {r}"


def test_a_block_id_outside_the_cache_is_refused(kernel):
    cache, table, _ = paged(1, 40, 4, 2, 64, 16)
    q = torch.randn(1, 4, 64).to(torch.bfloat16)
    ids = table.clone()[None]
    ids[0, 1] = 10_000
    with pytest.raises(ValueError):
        kernel(q, cache, ids, torch.tensor([40]), 0.125)
