"""The GGUF-block matmul against the W8A8 int8 one, per call, alternating in one process.

    .venv/bin/python benchmarks/qblock_gemm.py [--rows 1,16,64] [--format Q4_K]
        [--shapes 2048x2048,2048x8192,8192x2048] [--calls 40] [--copies 1]
        [--clock wall|thread]

Shapes are IN x OUT (a Llama-3.2-1B's q/o, gate or up, down). For each shape
and row count, one call of each kernel alternates with the other's on the same
bfloat16 rows (random weights: `--format`'s block codes for qblock, int8 codes
for W8A8), so the machine's drift hits both alike; the figures are GOP/s
(2 * rows * in * out per call) from the median call, and their ratio. W8A8 runs
as the default configures it: plain int8 activations, and A13 pairs (two code
rows per row) where IN is the intermediate size (down_proj); `w8a8 plain` is
the same matrix without pairs.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import time
from itertools import cycle

import numpy as np
import torch

from sluice.loader.choices import cpu_flags
from sluice.models.block_codes import FORMATS, BlockCodes
from sluice.models.native.int8 import int8_gemm_kernels
from sluice.models.native.qblock import QBlockMatrix, qblock_matmul


def random_codes(name: str, n: int, k: int, rng: np.random.Generator) -> BlockCodes:
    """Random block codes of type `name` for W [n, k] (values of no meaning; speed only)."""
    fmt = FORMATS[name]
    n_sub, n_super = k // fmt.sub_block, k // fmt.super_block
    q = rng.integers(0, 1 << fmt.bits, (n, k), dtype=np.uint8)
    scales = rng.integers(1, 63, (n, n_sub), dtype=np.int8) if fmt.has_scales else None
    mins = (
        rng.integers(0, 63, (n, n_sub), dtype=np.int8) if fmt.has_scales and fmt.has_min else None
    )
    d = (rng.random((n, n_super)) * 1e-3).astype(np.float16)
    m = (rng.random((n, n_super)) * 1e-3).astype(np.float16) if fmt.has_min else None
    return BlockCodes(fmt, q, scales, mins, d, m)


def seconds(call, clock=time.perf_counter) -> float:
    start = clock()
    call()
    return clock() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,16,64")
    parser.add_argument("--format", default="Q4_K", choices=sorted(FORMATS))
    parser.add_argument("--shapes", default="2048x2048,2048x8192,8192x2048")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--clock", choices=["wall", "thread"], default="wall")
    args = parser.parse_args()
    kernels = int8_gemm_kernels()
    if kernels is None:
        raise SystemExit("no W8A8 kernel here (AVX512-VNNI and a C compiler)")
    flags = sorted(f for f in cpu_flags() if f.startswith(("avx512", "amx")))
    print(f"threads {torch.get_num_threads()}; {' '.join(flags)}")
    rng = np.random.default_rng(0)
    # thread: this thread's CPU time, which a loaded machine's preemptions do
    # not inflate (with OMP_NUM_THREADS=1 the kernels run on this thread).
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    print("GOP/s, median call (best call)")
    print("shape      rows        qblock           w8a8   ratio (best) |  w8a8 plain  ratio (best)")
    # Per row count, each path's median seconds summed over the shapes (a layer's mix).
    totals: dict[int, dict[str, float]] = {}
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        first = QBlockMatrix.from_codes(random_codes(args.format, n, k, rng))
        packed = kernels.pack(torch.randint(-127, 128, (n, k), dtype=torch.int8))
        # --copies: each call reads the next copy's bytes, as a model's layers do.
        matrices = cycle([dataclasses.replace(first, packed=first.packed.clone())
                          for _ in range(args.copies)])  # fmt: skip
        weights = cycle([dataclasses.replace(packed, packed=packed.packed.clone())
                         for _ in range(args.copies)])  # fmt: skip
        pairs = k == args.intermediate
        for rows in [int(r) for r in args.rows.split(",")]:
            times = alternate(kernels, matrices, weights, k, rows, pairs, args.calls, clock)
            for name, t in times.items():
                totals.setdefault(rows, {}).setdefault(name, 0.0)
                totals[rows][name] += statistics.median(t)
            med = {name: 2 * rows * n * k / statistics.median(t) / 1e9 for name, t in times.items()}
            best = {name: 2 * rows * n * k / min(t) / 1e9 for name, t in times.items()}
            print(f"{shape:<10} {rows:>4}  {med['qblock']:6.1f} ({best['qblock']:5.1f})  "
                  f"{med['w8a8']:6.1f} ({best['w8a8']:5.1f})  {med['qblock'] / med['w8a8']:5.2f} "
                  f"({best['qblock'] / best['w8a8']:4.2f}) | {med['plain']:6.1f} ({best['plain']:5.1f})"
                  f" {med['qblock'] / med['plain']:5.2f} ({best['qblock'] / best['plain']:4.2f})",
                  flush=True)  # fmt: skip
    print_totals(totals)


def print_totals(totals: dict[int, dict[str, float]]) -> None:
    for rows, seconds_of in totals.items():
        qblock = seconds_of["qblock"]
        print(f"all shapes {rows:>4}  median seconds summed: qblock {qblock * 1e3:.2f} ms, "
              f"w8a8 {seconds_of['w8a8'] * 1e3:.2f} ms ({seconds_of['w8a8'] / qblock:.2f}x), "
              f"plain {seconds_of['plain'] * 1e3:.2f} ms ({seconds_of['plain'] / qblock:.2f}x)")  # fmt: skip


def alternate(kernels, matrices, weights, k: int, rows: int, pairs: bool, calls: int, clock):
    """Seconds of each call, the three paths taking turns on the same rows."""
    x = torch.randn(rows, k).to(torch.bfloat16)
    inv_smooth = torch.ones(k, dtype=torch.float32)
    col_scales = torch.full((next(weights).out_features,), 1e-3, dtype=torch.float32)

    def w8a8(with_pairs: bool) -> None:
        kernels.linear(x, inv_smooth, next(weights), col_scales, None, with_pairs)

    paths = {
        "qblock": lambda: qblock_matmul(x, next(matrices)),
        "w8a8": functools.partial(w8a8, pairs),
        "plain": functools.partial(w8a8, False),
    }
    for call in paths.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(calls):
        for name, call in paths.items():
            times[name].append(seconds(call, clock))
    return times


if __name__ == "__main__":
    main()
