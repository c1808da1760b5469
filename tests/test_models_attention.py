"""Paged attention against dense attention over each whole sequence.

Every case scatters the sequences over shuffled, non-contiguous cache blocks,
pre-fills the cached context, then checks the batched output against a naive
per-sequence reference and checks the new K/V landed at the right slots.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.models import attention
from sluice.models.attention import (
    AttentionMetadata,
    allocate_kv_caches,
    kv_cache_bytes_per_block,
    paged_attention,
)
from sluice.models.decoder_config import DecoderConfig
from sluice.models.families.registry import parse_hf_config

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 6, 2, 8
BLOCK_SIZE = 4
NUM_BLOCKS = 64
SCALE = HEAD_DIM**-0.5


@dataclass(slots=True)
class Sequence:
    context_len: int
    query_len: int
    block_table: list[int]
    # The whole sequence, cached context then new tokens.
    keys: torch.Tensor  # [seq_len, Hkv, D]
    values: torch.Tensor  # [seq_len, Hkv, D]
    queries: torch.Tensor  # [query_len, Hq, D]

    @property
    def seq_len(self) -> int:
        return self.context_len + self.query_len

    def slot(self, position: int) -> int:
        return self.block_table[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE


def make_sequences(
    lengths: list[tuple[int, int]], seed: int = 0, dtype=torch.float32
) -> list[Sequence]:
    """(context_len, query_len) pairs -> sequences on shuffled blocks (block 0 unused)."""
    rng = random.Random(seed)
    free_blocks = list(range(1, NUM_BLOCKS))
    rng.shuffle(free_blocks)
    gen = torch.Generator().manual_seed(seed)
    sequences = []
    for context_len, query_len in lengths:
        seq_len = context_len + query_len
        num_blocks = -(-seq_len // BLOCK_SIZE)
        table = [free_blocks.pop() for _ in range(num_blocks)]
        kv_shape = (seq_len, NUM_KV_HEADS, HEAD_DIM)
        sequences.append(
            Sequence(
                context_len=context_len,
                query_len=query_len,
                block_table=table,
                keys=torch.randn(kv_shape, generator=gen).to(dtype),
                values=torch.randn(kv_shape, generator=gen).to(dtype),
                queries=torch.randn((query_len, NUM_HEADS, HEAD_DIM), generator=gen).to(dtype),
            )
        )
    return sequences


def make_cache(sequences: list[Sequence], dtype=torch.float32) -> torch.Tensor:
    """A cache holding each sequence's context (not its new tokens); noise elsewhere."""
    cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM).to(dtype)
    flat = cache.view(2, NUM_BLOCKS * BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    for seq in sequences:
        for pos in range(seq.context_len):
            flat[0, seq.slot(pos)] = seq.keys[pos]
            flat[1, seq.slot(pos)] = seq.values[pos]
    return cache


def reference_attention(seq: Sequence) -> torch.Tensor:  # [query_len, Hq, D] float32
    group = NUM_HEADS // NUM_KV_HEADS
    keys = seq.keys.float().repeat_interleave(group, dim=1)  # [seq_len, Hq, D]
    values = seq.values.float().repeat_interleave(group, dim=1)  # [seq_len, Hq, D]
    scores = torch.einsum("qhd,khd->hqk", seq.queries.float(), keys) * SCALE
    query_pos = torch.arange(seq.context_len, seq.seq_len)[:, None]
    visible = torch.arange(seq.seq_len)[None, :] <= query_pos  # [query_len, seq_len]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, values)


def run_batch(sequences: list[Sequence], dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    cache = make_cache(sequences, dtype)
    meta = AttentionMetadata.build(
        [s.query_len for s in sequences],
        [s.context_len for s in sequences],
        [s.block_table for s in sequences],
        BLOCK_SIZE,
        "cpu",
    )
    q = torch.cat([s.queries for s in sequences])
    k = torch.cat([s.keys[s.context_len :] for s in sequences])
    v = torch.cat([s.values[s.context_len :] for s in sequences])
    return paged_attention(q, k, v, cache, meta, SCALE), cache


def assert_matches_reference(sequences: list[Sequence], dtype=torch.float32, atol=1e-5) -> None:
    out, cache = run_batch(sequences, dtype)
    expected = torch.cat([reference_attention(s) for s in sequences])
    torch.testing.assert_close(out.float(), expected, atol=atol, rtol=atol)
    flat = cache.view(2, -1, NUM_KV_HEADS, HEAD_DIM)
    for seq in sequences:
        slots = [seq.slot(p) for p in range(seq.seq_len)]
        assert torch.equal(flat[0, slots], seq.keys), "new keys not stored at their slots"
        assert torch.equal(flat[1, slots], seq.values), "new values not stored at their slots"


def test_pure_prefill_matches_dense_attention():
    assert_matches_reference(make_sequences([(0, 7), (0, 13), (0, 4)]))


def test_chunked_prefill_sees_cached_context_and_is_causal_within_the_chunk():
    assert_matches_reference(make_sequences([(5, 9), (16, 16), (3, 2)], seed=1))


def test_a_long_chunk_behind_a_short_cached_prefix_and_the_reverse():
    """On CPU such a chunk attends to its context and to itself in two flash
    calls merged by log-sum-exp (attention._cached_prefix_then_chunk)."""
    assert_matches_reference(make_sequences([(16, 40), (1, 30), (33, 3), (9, 10)], seed=7))


def test_the_other_devices_masked_path_matches_the_cpu_split(monkeypatch):
    """Off the CPU a chunk behind cached context is one masked call
    (attention._cached_prefix_masked); run here, it gives the CPU path's values."""
    sequences = make_sequences([(16, 40), (1, 30), (33, 3), (9, 10)], seed=8)
    split, _ = run_batch(sequences)
    monkeypatch.setattr(
        attention,
        "_cached_prefix_then_chunk",
        lambda q, k, v, kv_cache, plan, scale: attention._cached_prefix_masked(
            q, kv_cache, plan, scale
        ),
    )
    masked, _ = run_batch(sequences)
    torch.testing.assert_close(masked, split, atol=1e-5, rtol=1e-5)
    expected = torch.cat([reference_attention(s) for s in sequences])
    torch.testing.assert_close(masked, expected, atol=1e-5, rtol=1e-5)


def test_decode_batch_of_different_lengths_matches_dense_attention():
    assert_matches_reference(make_sequences([(30, 1), (0, 1), (7, 1), (16, 1)], seed=2))


def test_decode_batch_of_equal_lengths_needs_no_padding_mask():
    sequences = make_sequences([(9, 1), (9, 1), (9, 1)], seed=6)
    assert_matches_reference(sequences)


def test_mixed_batch_with_decodes_between_prefills_matches_dense_attention():
    lengths = [(10, 1), (0, 12), (21, 1), (8, 5), (3, 1)]
    assert_matches_reference(make_sequences(lengths, seed=3))


def test_bfloat16_mixed_batch_is_close_to_float32_reference():
    lengths = [(10, 1), (0, 9), (6, 6), (25, 1)]
    assert_matches_reference(
        make_sequences(lengths, seed=4, dtype=torch.bfloat16), torch.bfloat16, 3e-2
    )


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(
        st.tuples(st.integers(0, 20), st.sampled_from([1, 1, 2, 3, 7])), min_size=1, max_size=6
    ),
    seed=st.integers(0, 1000),
)
def test_any_batch_matches_dense_attention(lengths, seed):
    assert_matches_reference(make_sequences(lengths, seed=seed))


def test_build_maps_each_new_token_to_its_block_slot():
    sequences = make_sequences([(5, 3), (0, 1), (9, 1)], seed=5)
    meta = AttentionMetadata.build(
        [s.query_len for s in sequences],
        [s.context_len for s in sequences],
        [s.block_table for s in sequences],
        BLOCK_SIZE,
        "cpu",
    )
    expected_slots = [s.slot(p) for s in sequences for p in range(s.context_len, s.seq_len)]
    assert meta.slot_mapping.tolist() == expected_slots
    assert meta.query_start_loc.tolist() == [0, 3, 4, 5]
    assert meta.seq_lens.tolist() == meta.seq_lens_list == [8, 1, 10]
    assert meta.block_tables.shape == (3, 3)
    assert meta.block_tables[1].tolist() == [sequences[1].block_table[0], 0, 0]
    assert not meta.is_decode_only


def test_build_flags_an_all_single_token_batch_as_decode_only():
    meta = AttentionMetadata.build([1, 1], [4, 0], [[3, 5], [2]], BLOCK_SIZE, "cpu")
    assert meta.is_decode_only
    assert meta.decode is not None and meta.decode.token_indices is None
    assert meta.decode.key_mask is not None, "lengths 5 and 1 need padding"
    assert meta.prefills == []


def test_build_refuses_a_block_table_too_short_for_its_sequence():
    with pytest.raises(AssertionError, match="too short"):
        AttentionMetadata.build([3], [4], [[1]], BLOCK_SIZE, "cpu")


def tiny_config(num_layers: int = 3) -> DecoderConfig:
    return parse_hf_config(
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 32,
            "hidden_size": NUM_HEADS * HEAD_DIM,
            "intermediate_size": 64,
            "num_hidden_layers": num_layers,
            "num_attention_heads": NUM_HEADS,
            "num_key_value_heads": NUM_KV_HEADS,
            "max_position_embeddings": 128,
        }
    )


def test_allocated_caches_are_zeroed_and_shaped_per_layer():
    caches = allocate_kv_caches(tiny_config(), 10, BLOCK_SIZE, torch.bfloat16, "cpu")
    assert len(caches) == 3
    assert caches[0].shape == (2, 10, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    assert caches[0].dtype == torch.bfloat16
    assert all(not c.any() for c in caches)


def test_bytes_per_block_counts_k_and_v_of_every_layer():
    config = tiny_config(num_layers=3)
    expected = 3 * 2 * BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM * 4
    assert kv_cache_bytes_per_block(config, BLOCK_SIZE, torch.float32) == expected
    assert kv_cache_bytes_per_block(config, BLOCK_SIZE, torch.bfloat16) == expected // 2


@pytest.mark.parametrize("head_dim", [64, 8])
def test_the_default_gives_every_row_batch_invariant_modes_bits(head_dim):
    """Chunk-blind attention (issue 44): in bfloat16, a batch of a 700-token
    chunk behind 100 cached tokens (past position 512: the native prefill
    kernel for heads of 64, decode-kernel rows for heads of 8), a 40-token
    chunk and two decodes gives each row the bits batch-invariant mode's
    attention gives it (every token one decode row over its own keys)."""
    if attention.decode_attention_kernel(torch.bfloat16) is None:
        pytest.skip("no native decode kernel here")
    if head_dim == 64 and attention.prefill_attention_kernel(torch.bfloat16) is None:
        pytest.skip("no native prefill kernel (AVX512-BF16) here")
    generator = torch.Generator().manual_seed(head_dim)
    lengths = [(100, 700), (600, 40), (900, 1), (5, 1)]  # (context, new tokens)
    block, heads, kv_heads = 16, 6, 2
    tables, first = [], 1
    for context, new in lengths:
        count = -(-(context + new) // block)
        tables.append(list(range(first, first + count)))
        first += count
    cache = torch.randn(2, first, block, kv_heads, head_dim, generator=generator).bfloat16()
    num_tokens = sum(new for _, new in lengths)
    q = torch.randn(num_tokens, heads, head_dim, generator=generator).bfloat16()
    k = torch.randn(num_tokens, kv_heads, head_dim, generator=generator).bfloat16()
    v = torch.randn(num_tokens, kv_heads, head_dim, generator=generator).bfloat16()

    def run(attend):
        meta = AttentionMetadata.build([n for _, n in lengths], [c for c, _ in lengths], tables,
                                       block, "cpu")  # fmt: skip
        return attend(q, k, v, cache.clone(), meta, 0.125)

    default = run(paged_attention)
    invariant = run(attention.batch_invariant_attention)
    differing = (default.view(torch.int16) != invariant.view(torch.int16)).flatten(1).any(1)
    assert not differing.any(), f"rows {differing.nonzero().flatten()[:8].tolist()} differ"


def test_heads_the_decode_kernel_does_not_take_prefill_on_torch():
    # Heads of 320 (over paged_decode_attention.c's 256): a chunk past position
    # 512 (no decode-kernel rows) keeps torch's attention rather than failing.
    generator = torch.Generator().manual_seed(0)
    context, new = 600, 100
    keys_all, values_all = torch.randn(2, context + new, 1, 320, generator=generator)
    q = torch.randn(new, 2, 320, generator=generator)
    cache = torch.zeros(2, 45, 16, 1, 320)  # 44 blocks: 704 positions
    table = list(range(1, 45))
    cache[:, 1:].flatten(1, 2)[0, :context] = keys_all[:context]
    cache[:, 1:].flatten(1, 2)[1, :context] = values_all[:context]
    meta = AttentionMetadata.build([new], [context], [table], 16, "cpu")
    out = paged_attention(q, keys_all[context:], values_all[context:], cache, meta, 0.05)
    keys, values = (x.repeat_interleave(2, dim=1).transpose(0, 1) for x in (keys_all, values_all))
    visible = torch.arange(context + new)[None, :] <= torch.arange(context, context + new)[:, None]
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), keys, values, attn_mask=visible, scale=0.05
    ).transpose(0, 1)  # fmt: skip
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
