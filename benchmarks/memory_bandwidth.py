"""The machine's memory read bandwidth, and what a decode speed makes of it.

    .venv/bin/python benchmarks/memory_bandwidth.py [--gib 2] [--threads 2]
        [--weights-bytes N --tokens-per-s T ...]

Reads a `--gib` GiB tensor with `--threads` threads (torch's sum: one pass,
no writes) and reports the best of five in GB/s, with the CPU flags. Given a
model's weight bytes read per token and single-stream decode speeds, it says
what fraction of that bandwidth each speed streams: the decode efficiency
of issue 41 (llama-server reads a 1B Q4_K_M at ~94% on a Zen 5).
"""

from __future__ import annotations

import argparse
import time

import torch

from sluice.loader.choices import cpu_flags


def read_bandwidth_gbs(gib: float, threads: int, repeats: int = 5) -> float:
    torch.set_num_threads(threads)
    values = torch.ones(int(gib * (1 << 30)) // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        values.sum()
        best = min(best, time.perf_counter() - start)
    return values.numel() * 4 / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--weights-bytes", type=float, default=None)
    parser.add_argument("--tokens-per-s", type=float, nargs="*", default=[])
    args = parser.parse_args()
    flags = sorted(flag for flag in cpu_flags() if flag.startswith(("avx512", "amx")))
    bandwidth = read_bandwidth_gbs(args.gib, args.threads)
    print(f"read bandwidth: {bandwidth:.1f} GB/s ({args.threads} threads; {' '.join(flags)})")
    for speed in args.tokens_per_s:
        if args.weights_bytes:
            streamed = args.weights_bytes * speed / 1e9
            print(f"{speed:.1f} tok/s: {streamed:.1f} GB/s of weights, {streamed / bandwidth:.0%}")


if __name__ == "__main__":
    main()
