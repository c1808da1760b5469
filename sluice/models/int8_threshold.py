"""From how many rows W8A8 serves a step, on a CPU with AMX: raced at load.

Without AMX, the packed VNNI matmul (native/int8_gemm.c) beats oneDNN's
prepacked bfloat16 matmul from 4 rows on, on both CPUs measured (Zen 4, and
an Emerald Rapids Xeon whose VM hides AMX; docs/BENCHMARKS.md), so the
threshold there is the layer's constant `min_rows`. With AMX, oneDNN runs
bfloat16 on AMX tiles, whose multiply rate is several times VNNI's int8
rate, and no such CPU was at hand to measure. So there the model races the
two paths at load, on one decoder layer's W8A8 matrices, at row counts from
512 down to 4: W8A8 serves steps from the fewest rows at which it won, and
won at every larger count; if it lost at 512 it serves none, and the layers
drop it. About half a second of matmuls per load on 2 cores. Run on the
Xeon without AMX (where it does not run by default), the race picked 4 rows
three times out of three: the constant measured there from whole steps.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

from sluice.models.linear import Linear

logger = logging.getLogger(__name__)

RACE_ROWS = (512, 256, 128, 64, 32, 16, 8, 4)
# W8A8 at no step size: it lost at the largest.
NEVER = sys.maxsize
_REPEATS = 7


def race_min_rows(
    dense: Callable[[int], object],
    w8a8: Callable[[int], object],
    rows: Sequence[int] = RACE_ROWS,
    repeats: int = _REPEATS,
    clock: Callable[[], float] = time.perf_counter,
) -> int:
    """The fewest of `rows` (largest first) down to which `w8a8(n)` ran faster
    than `dense(n)` at every count; NEVER if it lost at the first. Each count:
    one warm-up of each, then `repeats` runs alternating, medians compared."""
    threshold = NEVER
    for n in rows:
        dense(n)  # warm-ups
        w8a8(n)
        seconds: dict[Callable, list[float]] = {dense: [], w8a8: []}
        for _ in range(repeats):
            for run in (dense, w8a8):
                start = clock()
                run(n)
                seconds[run].append(clock() - start)
        if statistics.median(seconds[w8a8]) >= statistics.median(seconds[dense]):
            break
        threshold = n
    return threshold


@torch.no_grad()
def race_against_amx(layer: Sequence[Linear], targets: Sequence[Linear]) -> int:
    """Race W8A8 against the dense matmul over `layer` (one decoder layer's
    W8A8 matrices, summed), then start every one of `targets` at the winner
    (`Linear.start_int8_activations_at`). Returns the rows, or NEVER."""
    inputs: dict[int, list[torch.Tensor]] = {}

    def batch(n: int) -> list[torch.Tensor]:
        if n not in inputs:
            inputs[n] = [
                torch.randn(n, linear.int8_activations.inv_smooth.shape[0]).to(linear.weight.dtype)
                for linear in layer
            ]
        return inputs[n]

    def dense(n: int) -> None:
        for linear, x in zip(layer, batch(n), strict=True):
            linear.dense_matmul(x)

    def w8a8(n: int) -> None:
        for linear, x in zip(layer, batch(n), strict=True):
            linear.int8_activations(x)

    rows = race_min_rows(dense, w8a8)
    for linear in targets:
        linear.start_int8_activations_at(rows)
    if rows == NEVER:
        logger.info("W8A8 lost to the AMX bfloat16 matmul at %d rows at load: off", RACE_ROWS[0])
    else:
        logger.info("W8A8 from %d rows: raced against the AMX bfloat16 matmul at load", rows)
    return rows
