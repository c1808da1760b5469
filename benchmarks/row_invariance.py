"""Which matmul paths give a row the same bits whatever the rows beside it, on this CPU, and how fast.

    .venv/bin/python benchmarks/row_invariance.py [--rows 1,2,...] [--shapes 960x576,...]

The evidence behind issue 28 (the same answer under any load): for each of
the embedded model's matrix shapes (q/k/v, o, gate/up, down, lm_head) and
each path the default can take, a batch of random rows is multiplied at
every row count of `--rows`, and every row of the result is compared with
the same row multiplied alone. A path is row-invariant on this CPU when no
row ever differs. Then each path is timed at 1, 8, 64 and 2,048 rows
(median of alternating runs) beside the prepacked bfloat16 matmul.

Paths: `dense` (bfloat16, prepacked for oneDNN, as the default's large
steps), `plain` (F.linear, no prepacking), `int4` (weight-only, torch's
kernel, as the default's steps of up to 8 rows), `w8a8` (int8 activations,
one scale per row, times int8 weights: the native VNNI kernel where the CPU
has one), `w8a8_int_mm` (the same codes through torch._int_mm, oneDNN: AMX
tiles where the CPU has AMX-INT8). Integer sums are exact, so the two W8A8
paths must agree bit for bit with each other at every row count: that is
checked too.

Prints the CPU's flags of interest first; paste them with any figure.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from sluice.models.int8_activations import Int8ActivationLinear
from sluice.models.quantization import Int4Linear

# The embedded model's matrices [out, in]: q/k/v, o, gate/up, down, lm_head.
SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576))
ROWS = (1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 31, 32, 33, 48, 64, 65, 100, 128, 256, 511, 2048)
TIMED_ROWS = (1, 8, 64, 2048)
FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")

Matmul = Callable[[torch.Tensor], torch.Tensor]


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            line = next(line for line in cpuinfo if line.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    have = set(line.split(":", 1)[1].split())
    return " ".join(flag for flag in FLAGS if flag in have) or "none of " + " ".join(FLAGS)


def paths(weight: torch.Tensor) -> dict[str, Matmul]:
    """Each path's matmul of bfloat16 rows by `weight` [out, in] (float32 values)."""
    int4 = Int4Linear.quantize(weight, None)
    dense_values = int4.dequantized.to(torch.bfloat16)
    packed = torch.ops.mkldnn._reorder_linear_weight(dense_values, 1)
    linear_pointwise = torch.ops.mkldnn._linear_pointwise
    found: dict[str, Matmul] = {
        "dense": lambda x: linear_pointwise(x, packed, None, "none", [], ""),
        "plain": lambda x: F.linear(x, dense_values),
        "int4": int4.layer.matmul_for(torch.bfloat16),
    }
    absmax = torch.rand(weight.shape[1]) * 4 + 0.1  # a calibration's max |x| per column
    w8a8 = Int8ActivationLinear.quantize(dense_values, None, absmax, torch.bfloat16)
    if w8a8.packed is not None:
        found["w8a8"] = w8a8.forward
        codes = _codes_of(dense_values, absmax, w8a8)
        found["w8a8_int_mm"] = _int_mm_path(codes, w8a8)
    return found


def _codes_of(weight: torch.Tensor, absmax: torch.Tensor, w8a8: Int8ActivationLinear):
    # The int8 codes the packed kernel holds (it keeps only its own layout):
    # `Int8ActivationLinear.quantize`'s steps, in its order.
    from sluice.models.int8_activations import _TINY, SMOOTHING_ALPHA

    w = weight.to(torch.float32, copy=True)
    column_max = w.abs().amax(dim=0).clamp(min=_TINY)
    smooth = absmax.float().clamp(min=_TINY).pow(SMOOTHING_ALPHA)
    smooth = smooth.div_(column_max.pow(1 - SMOOTHING_ALPHA)).clamp(min=_TINY)
    w.mul_(smooth)
    return w.div_(w8a8.weight_scales[:, None]).round_().clamp_(-127, 127).to(torch.int8)


def _int_mm_path(codes: torch.Tensor, w8a8: Int8ActivationLinear) -> Matmul:
    from sluice.models.native.int8 import int8_row_kernels

    quantize, dequantize = int8_row_kernels(torch.bfloat16)
    codes_t = codes.t()

    def matmul(x: torch.Tensor) -> torch.Tensor:
        q, scales = quantize(x, w8a8.inv_smooth)
        return dequantize(torch._int_mm(q, codes_t), scales, w8a8.weight_scales, None)

    return matmul


def rows_that_differ(matmul: Matmul, x: torch.Tensor, counts: tuple[int, ...]) -> list[int]:
    """The row counts at which some row's result differs from that row alone."""
    alone = torch.cat([matmul(x[i : i + 1].clone()) for i in range(max(counts))])
    return [m for m in counts if not torch.equal(matmul(x[:m].clone()), alone[:m])]


def median_ms(runs: dict[str, Matmul], x: torch.Tensor, repeats: int) -> dict[str, float]:
    """Median milliseconds per call of each run, the runs alternating."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for matmul in runs.values():
        matmul(x)  # warm-up
    for _ in range(repeats):
        for name, matmul in runs.items():
            start = time.perf_counter()
            matmul(x)
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) * 1e3 for name, values in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--shapes", default=",".join(f"{o}x{i}" for o, i in SHAPES))
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    counts = tuple(sorted(int(n) for n in args.rows.split(",")))
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    torch.manual_seed(0)
    print(f"CPU flags: {cpu_flags()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    for out_features, in_features in shapes:
        found = paths(torch.randn(out_features, in_features) * 0.05)
        x = torch.randn(max(max(counts), max(TIMED_ROWS)), in_features).bfloat16()
        print(f"\n[{out_features} x {in_features}]")
        for name, matmul in found.items():
            differ = rows_that_differ(matmul, x, counts)
            verdict = "row-invariant" if not differ else f"rows differ at {differ}"
            print(f"  {name:12s} {verdict}")
        if "w8a8" in found:
            same = all(
                torch.equal(found["w8a8"](x[:m].clone()), found["w8a8_int_mm"](x[:m].clone()))
                for m in counts
            )
            print(f"  w8a8 native == w8a8 through torch._int_mm at every row count: {same}")
        for m in TIMED_ROWS:
            repeats = args.repeats if m < 2048 else max(3, args.repeats // 3)
            times = median_ms(found, x[:m].clone(), repeats)
            shown = "  ".join(f"{name} {ms:.3f}" for name, ms in times.items())
            print(f"  {m:5d} rows, ms: {shown}")


if __name__ == "__main__":
    main()
