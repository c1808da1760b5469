"""The native attention kernels against what they replaced, on the embedded model's heads.

    .venv/bin/python benchmarks/attention_kernels.py [--against fbd1744] [--prefill 512,2000]

1. Decode attention (native/paged_decode_attention.c), bfloat16, 9 query and
   3 KV heads of 64, 16-token blocks scattered over the pool: 64 sequences
   of 100 and 160 tokens, 16 of 100, 1 of 1,000. Per layer, two ways: the
   same cache every call (it stays in L3), and 30 layers' caches in turn (as
   a step reads them). Against the decode kernel of git revision `--against`
   (compiled from that revision's source into a temporary library), or
   without it against the torch path (a gathered copy and SDPA).
2. Prefill attention (native/prefill_attention.c, and where the CPU grants
   AMX tiles native/prefill_attention_amx.c) against torch's CPU flash SDPA,
   causal, per layer, for each `--prefill` length: ms and GFLOPS.

The kernels compared alternate call by call; figures are medians.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from sluice.models.attention import AttentionMetadata, decode_attention_torch
from sluice.models.native import _DecodeAttention, abi, decode_attention_kernel
from sluice.models.native.prefill import prefill_attention_amx_kernel, prefill_attention_kernel

ROOT = Path(__file__).resolve().parents[1]
NATIVE = "sluice/models/native"
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
LAYERS = 30


def old_decode_kernel(revision: str):
    """The decode kernel as it was at `revision`, built into a temporary library."""
    scratch = Path(tempfile.mkdtemp(prefix="sluice-old-kernel-"))
    for name in (
        "paged_decode_attention.c",
        "sluice_abi.h",
        "bf16.h",
        "vector_exp.h",
        "paged_tables.h",
    ):
        try:
            source = subprocess.run(["git", "show", f"{revision}:{NATIVE}/{name}"], cwd=ROOT,
                                    check=True, capture_output=True).stdout  # fmt: skip
        except subprocess.CalledProcessError:
            continue  # a header that revision did not have
        (scratch / name).write_bytes(source)
    flags = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-ffast-math", "-fno-finite-math-only"]
    obj, lib = scratch / "old.o", scratch / "old.so"
    subprocess.run(
        ["cc", *flags, "-c", "-o", obj, scratch / "paged_decode_attention.c"], check=True
    )
    subprocess.run(["cc", "-shared", "-fopenmp", "-o", lib, obj, "-lm"], check=True)
    function = ctypes.CDLL(str(lib)).decode_attention_bf16
    declared = abi.FUNCTIONS["decode_attention_bf16"]
    function.argtypes, function.restype = declared.argtypes(), declared.restype()
    return _DecodeAttention(function)


def torch_decode(q, cache, block_ids, seq_lens, scale):
    tables = [
        row[: -(-int(n) // BLOCK)].tolist() for row, n in zip(block_ids, seq_lens, strict=True)
    ]
    meta = AttentionMetadata.build([1] * len(tables), [int(n) - 1 for n in seq_lens], tables,
                                   BLOCK, "cpu")  # fmt: skip
    return decode_attention_torch(q, cache, meta.decode, scale)


def partial(**bound):
    """f -> a call of f on one layer's cache (`cache`) or on every layer's (`caches`)."""

    def bind(function):
        if "caches" in bound:
            rest = {k: v for k, v in bound.items() if k != "caches"}
            return lambda: [
                function(rest["q"], c, rest["block_ids"], rest["seq_lens"], 0.125)
                for c in bound["caches"]
            ]
        return functools.partial(function, bound["q"], bound["cache"], bound["block_ids"],
                                 bound["seq_lens"], 0.125)  # fmt: skip

    return bind


def alternate(*functions, calls: int) -> tuple[float, ...]:
    """Median seconds of each, called in turn."""
    times: list[list[float]] = [[] for _ in functions]
    for _ in range(3):
        for function in functions:
            function()
    for _ in range(calls):
        for spent, function in zip(times, functions, strict=True):
            start = time.perf_counter()
            function()
            spent.append(time.perf_counter() - start)
    return tuple(statistics.median(spent) for spent in times)


def decode_rows(baseline, baseline_name: str) -> None:
    kernel = decode_attention_kernel(torch.bfloat16)
    print(f"decode attention, per layer: native (tiled) against {baseline_name}")
    for batch, context in ((64, 100), (64, 160), (16, 100), (1, 1000)):
        blocks_per_seq = -(-context // BLOCK)
        num_blocks = batch * blocks_per_seq
        caches = [torch.randn(2, num_blocks, BLOCK, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
                  for _ in range(LAYERS)]  # fmt: skip
        block_ids = torch.randperm(num_blocks).view(batch, blocks_per_seq)
        seq_lens = torch.full((batch,), context, dtype=torch.int64)
        q = torch.randn(batch, HEADS, HEAD_DIM, dtype=torch.bfloat16)
        got = kernel(q, caches[0], block_ids, seq_lens, 0.125).float()
        want = baseline(q, caches[0], block_ids, seq_lens, 0.125).float()
        error = (got - want).abs().max().item()
        one = partial(q=q, cache=caches[0], block_ids=block_ids, seq_lens=seq_lens)
        hot = alternate(one(kernel), one(baseline), calls=40)
        every = partial(q=q, caches=caches, block_ids=block_ids, seq_lens=seq_lens)
        cold = alternate(every(kernel), every(baseline), calls=5)
        cold = (cold[0] / LAYERS, cold[1] / LAYERS)
        kv_bytes = batch * context * KV_HEADS * HEAD_DIM * 2 * 2
        print(f"  {batch:>2} x {context:>4} tokens: cache in L3 {hot[0] * 1e6:6.0f} us against "
              f"{hot[1] * 1e6:6.0f} ({hot[1] / hot[0]:.2f}x); 30 layers in turn "
              f"{cold[0] * 1e6:6.0f} us ({kv_bytes / cold[0] / 1e9:.1f} GB/s) against "
              f"{cold[1] * 1e6:6.0f} ({cold[1] / cold[0]:.2f}x); max |difference| {error:.4f}",
              flush=True)  # fmt: skip


def prefill_rows(lengths: list[int]) -> None:
    kernel = prefill_attention_kernel(torch.bfloat16)
    amx = prefill_attention_amx_kernel(torch.bfloat16)
    print("prefill attention, causal, per layer: native against torch's flash SDPA")
    if amx is None:
        print("  (no AMX tiles here: no AMX kernel)")
    for length in lengths:
        qkv = torch.randn(length, HEADS + 2 * KV_HEADS, HEAD_DIM).to(torch.bfloat16)
        q, v = qkv[:, :HEADS], qkv[:, HEADS + KV_HEADS :]
        k = qkv[:, HEADS : HEADS + KV_HEADS].contiguous()

        flash = functools.partial(
            F.scaled_dot_product_attention, *(x.transpose(0, 1)[None] for x in (q, k, v)),
            is_causal=True, scale=0.125, enable_gqa=True,
        )  # fmt: skip
        kernels = [functools.partial(kernel, q, k, v, 0.125), flash]
        if amx is not None:
            kernels.append(functools.partial(amx, q, k, v, 0.125))
        native_s, torch_s, *amx_s = alternate(*kernels, calls=6)
        flops = 4 * length * length / 2 * HEADS * HEAD_DIM
        line = (f"  {length:>5} tokens: native {native_s * 1e3:7.2f} ms "
                f"({flops / native_s / 1e9:.0f} GFLOPS), torch {torch_s * 1e3:7.2f} ms "
                f"({flops / torch_s / 1e9:.0f} GFLOPS), {torch_s / native_s:.2f}x")  # fmt: skip
        for seconds in amx_s:
            line += (f"; AMX {seconds * 1e3:7.2f} ms ({flops / seconds / 1e9:.0f} GFLOPS), "
                     f"{torch_s / seconds:.2f}x torch")  # fmt: skip
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="REV", help="git revision of the older decode kernel")
    parser.add_argument("--prefill", default="512,2000")
    args = parser.parse_args()
    if decode_attention_kernel(torch.bfloat16) is None or prefill_attention_kernel(
        torch.bfloat16
    ) is None:  # fmt: skip
        raise SystemExit("no native bfloat16 attention kernels on this machine")
    if args.against:
        decode_rows(old_decode_kernel(args.against), f"the kernel of {args.against}")
    else:
        decode_rows(torch_decode, "the torch path")
    prefill_rows([int(n) for n in args.prefill.split(",")])


if __name__ == "__main__":
    main()
