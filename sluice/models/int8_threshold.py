"""In which bands of rows W8A8 serves a step, on a CPU with AMX: raced at load.

Without AMX, the packed VNNI matmul (native/int8_gemm.c) beats oneDNN's
prepacked bfloat16 matmul from 4 rows on, on both CPUs measured (Zen 4, and
an Emerald Rapids Xeon whose VM hides AMX; docs/BENCHMARKS.md), so there
W8A8 serves every step from the layer's constant `min_rows` up. With AMX,
oneDNN runs bfloat16 on AMX tiles, whose multiply rate is several times
VNNI's int8 rate on large blocks, but not on small ones: measured on a
Sapphire Rapids (one layer's q/k/v, o and gate/up, medians of 7), W8A8 /
bfloat16 was 1.86 at 512 rows, 1.45 at 128, 1.01 at 64, then 0.91 at 32
down to 0.57 at 4. So there the model races the two paths at load, on one
decoder layer's W8A8 matrices, in EVERY band of `RACE_ROWS` (band i is
the row counts from RACE_ROWS[i] up to the next; the last has no end),
timed at its lower edge: W8A8 serves the bands it won, whatever it did in
the others (no monotonicity assumed: the first version stopped at its first
loss, at 512 rows, and threw away the small steps it wins). About half a
second of matmuls per load on 2 cores, once: the bands are kept in the
execution plan's one cache (plan_cache.py, field "w8a8_bands"), not where
the race's repeats disagreed (a busy machine).

Note (issue 28): a row's numerics then depend on the band of the step it
shares (int8 activations in one band, bfloat16 in the next), as they
already do at the 4-row threshold: a request's answer can change with the
load.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

from sluice.models.linear import Linear, RowBands, bands_from
from sluice.models.plan_cache import PlanStore, spread

logger = logging.getLogger(__name__)

# The lower edges of the bands raced, ascending.
RACE_ROWS = (4, 8, 16, 32, 64, 128, 256, 512)
_REPEATS = 7


def race_bands(
    dense: Callable[[int], object],
    w8a8: Callable[[int], object],
    rows: Sequence[int] = RACE_ROWS,
    repeats: int = _REPEATS,
    clock: Callable[[], float] = time.perf_counter,
    spreads: list[float] | None = None,
) -> RowBands:
    """The bands of `rows` (ascending lower edges) in which `w8a8(n)` ran
    faster than `dense(n)` at the band's edge n, merged where they touch.
    Each edge: one warm-up of each, then `repeats` runs alternating, medians
    compared; a tie is a loss (W8A8 must be faster to serve). `spreads`
    gets each path's slowest over fastest repeat at each edge."""
    edges = sorted(rows)
    won = [_w8a8_wins(dense, w8a8, n, repeats, clock, spreads) for n in edges]
    bands: list[range] = []
    for i, n in enumerate(edges):
        if not won[i]:
            continue
        end = edges[i + 1] if i + 1 < len(edges) else sys.maxsize
        if bands and bands[-1].stop == n:
            bands[-1] = range(bands[-1].start, end)
        else:
            bands.append(range(n, end))
    return tuple(bands)


def _w8a8_wins(
    dense: Callable[[int], object],
    w8a8: Callable[[int], object],
    n: int,
    repeats: int,
    clock: Callable[[], float],
    spreads: list[float] | None,
) -> bool:
    dense(n)  # warm-ups
    w8a8(n)
    seconds: dict[Callable, list[float]] = {dense: [], w8a8: []}
    for _ in range(repeats):
        for run in (dense, w8a8):
            start = clock()
            run(n)
            seconds[run].append(clock() - start)
    if spreads is not None:
        spreads.extend(spread(times) for times in seconds.values())
    return statistics.median(seconds[w8a8]) < statistics.median(seconds[dense])


def describe_bands(bands: RowBands) -> str:
    """The bands as the startup line says them: "4-63 rows", "4+ rows",
    "8-15 and 32+ rows"; "no rows" when empty."""
    if not bands:
        return "no rows"
    parts = [
        f"{band.start}+" if band.stop == sys.maxsize else f"{band.start}-{band.stop - 1}"
        for band in bands
    ]
    return " and ".join(parts) + " rows"


@torch.no_grad()
def race_against_amx(
    layer: Sequence[Linear],
    store: PlanStore | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> RowBands:
    """The bands of rows W8A8 is to serve: raced against the dense matmul
    over `layer` (one decoder layer's W8A8 matrices, summed), cut to the
    layer's own threshold (`bands_from`); empty where it won none. Nothing
    is rebound: the execution plan carries the bands and its apply serves
    them (plan_apply.py). The bands won are recorded in `store`
    (plan_cache.py): a later load on this CPU, kernels, versions and shapes
    reads them instead of racing, so replicas agree."""
    bands = None if store is None else bands_from_fields(store.kept)
    if bands is None:
        spreads: list[float] = []
        bands = _race(layer, clock, spreads)
        if store is not None:
            store.put(bands_to_fields(bands), spreads, "the W8A8 race")
    served = bands_from(bands, layer[0].int8_activations.min_rows)
    if served:
        logger.info("W8A8 at %s, the AMX bfloat16 matmul elsewhere (raced in every band)",
                    describe_bands(served))  # fmt: skip
    else:
        logger.info("W8A8 lost to the AMX bfloat16 matmul in every band at load: off")
    return served


def _race(layer: Sequence[Linear], clock: Callable[[], float], spreads: list[float]) -> RowBands:
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

    return race_bands(dense, w8a8, clock=clock, spreads=spreads)


def bands_to_fields(bands: RowBands) -> dict[str, object]:
    """The bands as the plan cache keeps them: [start, stop or null] pairs."""
    pairs = [[band.start, None if band.stop == sys.maxsize else band.stop] for band in bands]
    return {"w8a8_bands": pairs}


def bands_from_fields(value: dict[str, object]) -> RowBands | None:
    """The bands a plan's fields hold; None where there are none, or damaged."""
    pairs = value.get("w8a8_bands")
    if not isinstance(pairs, list) or not all(
        isinstance(p, list) and len(p) == 2 and type(p[0]) is int
        and (p[1] is None or type(p[1]) is int) for p in pairs
    ):  # fmt: skip
        return None
    return tuple(range(start, sys.maxsize if stop is None else stop) for start, stop in pairs)
