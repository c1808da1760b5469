"""Sliding-window attention over the paged cache against a dense reference:
every query sees exactly the keys p - window < j <= p, whatever the batch's
mix of decodes and chunks after cached context, and in batch-invariant mode
a token's bits do not depend on the chunk it came in."""

from __future__ import annotations

import torch

from sluice.models.attention import AttentionMetadata
from sluice.models.sliding_window import sliding_window_attention

BLOCK_SIZE, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, WINDOW = 4, 4, 2, 8, 5


def dense_reference(q, k, v, window, scale, sinks=None):  # one sequence, all its positions
    n = q.shape[0]
    pos = torch.arange(n)
    mask = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)
    k = k.repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1)
    v = v.repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:  # exp(sink) joins each head's denominator, attends to nothing
        sink = sinks[:, None, None].expand(-1, n, 1)
        weights = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
    else:
        weights = scores.softmax(-1)
    return torch.einsum("hqk,khd->qhd", weights, v)


def sequence(length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(length, NUM_HEADS, HEAD_DIM, generator=g)
    k = torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=g)
    return q, k, torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=g)


def run_in_steps(seqs, steps, is_batch_invariant=False, sinks=None):
    """steps: per step, per sequence, how many new tokens (0: not in that step)."""
    kv_cache = torch.zeros(2, 64, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    tables = [list(range(60 - 8 * i, 52 - 8 * i, -1)) for i in range(len(seqs))]  # reversed
    done = [0] * len(seqs)
    outs = [[] for _ in seqs]
    for step in steps:
        rows = [(i, n) for i, n in enumerate(step) if n]
        meta = AttentionMetadata.build(
            [n for _, n in rows], [done[i] for i, _ in rows], [tables[i] for i, _ in rows],
            BLOCK_SIZE, "cpu",
        )  # fmt: skip
        parts = [[t[done[i] : done[i] + n] for t in seqs[i]] for i, n in rows]
        q, k, v = (torch.cat([p[j] for p in parts]) for j in range(3))
        out = sliding_window_attention(
            q, k, v, kv_cache, meta, 0.3, window=WINDOW, is_batch_invariant=is_batch_invariant,
            sinks=sinks,
        )  # fmt: skip
        start = 0
        for i, n in rows:
            outs[i].append(out[start : start + n])
            start += n
            done[i] += n
    return [torch.cat(o) for o in outs]


def test_chunks_and_decodes_in_one_batch_see_exactly_their_window():
    # Decodes of different lengths together, some shorter than the window.
    seqs = [sequence(14, 0), sequence(9, 1), sequence(5, 3)]
    steps = [(6, 3, 1), (1, 4, 1), (4, 1, 1), (1, 1, 1), (2, 0, 1)]
    for got, (q, k, v) in zip(run_in_steps(seqs, steps), seqs, strict=True):
        torch.testing.assert_close(got, dense_reference(q, k, v, WINDOW, 0.3))


def test_batch_invariant_mode_gives_each_token_the_same_bits_in_any_chunking():
    seqs = [sequence(13, 2)]
    whole = run_in_steps(seqs, [(13,)], is_batch_invariant=True)[0]
    pieces = run_in_steps(seqs, [(3,), (1,), (7,), (2,)], is_batch_invariant=True)[0]
    assert torch.equal(whole, pieces)
    torch.testing.assert_close(whole, dense_reference(*seqs[0], WINDOW, 0.3))


def test_attention_sinks_join_each_heads_denominator_in_every_path():
    """gpt-oss: a logit per head beside the keys; decodes, chunks and the
    batch-invariant path all divide by it."""
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    seqs = [sequence(14, 0), sequence(9, 1)]
    steps = [(6, 3), (1, 4), (4, 1), (1, 1), (2, 0)]
    for is_batch_invariant in (False, True):
        got = run_in_steps(seqs, steps, is_batch_invariant, sinks)
        for out, (q, k, v) in zip(got, seqs, strict=True):
            torch.testing.assert_close(out, dense_reference(q, k, v, WINDOW, 0.3, sinks))
            assert not torch.allclose(out, dense_reference(q, k, v, WINDOW, 0.3))
