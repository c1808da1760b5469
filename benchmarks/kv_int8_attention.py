"""Decode attention over an int8 KV pool against a bf16 one (issue 44's default).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/kv_int8_attention.py [--repeats 7]

One layer of the embedded model's heads (9 query, 3 KV heads of 64), 16-token
blocks scattered over the pool, `rows` decode sequences of `keys` keys each
(16 and 64 rows x 3,000 keys): `paged_attention` as a decode step calls it,
the int8 pool's dequantizing pass (models/kv_int8.py) included. Thread CPU
time, one thread; the two dtypes alternate call by call and the figure is
the median of the per-pair ratios, since on a shared machine only ratios of
interleaved repeats mean anything.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import time

import torch

from sluice.models import kv_int8
from sluice.models.attention import AttentionMetadata, paged_attention

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16


def decode_case(rows: int, keys: int, seed: int = 0):
    """(q, k, v, bf16 pool, int8 pool, metadata) for one decode step."""
    rng = random.Random(seed)
    blocks_per_row = -(-keys // BLOCK)
    num_blocks = rows * blocks_per_row + 1
    ids = list(range(1, num_blocks))
    rng.shuffle(ids)
    tables = [ids[r * blocks_per_row : (r + 1) * blocks_per_row] for r in range(rows)]
    meta = AttentionMetadata.build([1] * rows, [keys - 1] * rows, tables, BLOCK, "cpu")
    shape = (2, num_blocks, BLOCK, KV_HEADS, HEAD_DIM)
    bf16 = torch.randn(shape).to(torch.bfloat16)
    int8 = kv_int8.quantize_rows(bf16)
    q = torch.randn(rows, HEADS, HEAD_DIM).to(torch.bfloat16)
    k = torch.randn(rows, KV_HEADS, HEAD_DIM).to(torch.bfloat16)
    v = torch.randn(rows, KV_HEADS, HEAD_DIM).to(torch.bfloat16)
    return q, k, v, bf16, int8, meta


def cpu_seconds(call) -> float:
    start = time.thread_time()
    call()
    return time.thread_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--keys", type=int, default=3000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"threads {torch.get_num_threads()}, {args.keys} keys, heads 9/3 x 64, blocks of 16")
    for rows in (16, 64):
        q, k, v, bf16, int8, meta = decode_case(rows, args.keys)
        runs = [
            functools.partial(paged_attention, q, k, v, pool, meta, HEAD_DIM**-0.5)
            for pool in (bf16, int8)
        ]
        for run in runs:
            run()  # warm
        pairs = [(cpu_seconds(runs[0]), cpu_seconds(runs[1])) for _ in range(args.repeats)]
        ratios = [i / b for b, i in pairs]
        bf16_ms = statistics.median(b for b, _ in pairs) * 1e3
        int8_ms = statistics.median(i for _, i in pairs) * 1e3
        print(
            f"{rows} rows: bf16 {bf16_ms:.2f} ms, int8 {int8_ms:.2f} ms CPU per layer; "
            f"int8 / bf16 median {statistics.median(ratios):.2f} "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f}); pool bytes per token and layer: "
            f"bf16 {2 * KV_HEADS * HEAD_DIM * 2}, int8 {2 * KV_HEADS * kv_int8.row_width(HEAD_DIM, torch.int8)}"
        )


if __name__ == "__main__":
    main()
