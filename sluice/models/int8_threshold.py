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
second of matmuls per load on 2 cores, once: the bands are kept beside the
calibration, keyed by the CPU's flags line, the kernels and the versions.

Note (issue 28): a row's numerics then depend on the band of the step it
shares (int8 activations in one band, bfloat16 in the next), as they
already do at the 4-row threshold: a request's answer can change with the
load.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from sluice.models.linear import Linear, RowBands

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
) -> RowBands:
    """The bands of `rows` (ascending lower edges) in which `w8a8(n)` ran
    faster than `dense(n)` at the band's edge n, merged where they touch.
    Each edge: one warm-up of each, then `repeats` runs alternating, medians
    compared; a tie is a loss (W8A8 must be faster to serve)."""
    edges = sorted(rows)
    won = [_w8a8_wins(dense, w8a8, n, repeats, clock) for n in edges]
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
) -> bool:
    dense(n)  # warm-ups
    w8a8(n)
    seconds: dict[Callable, list[float]] = {dense: [], w8a8: []}
    for _ in range(repeats):
        for run in (dense, w8a8):
            start = clock()
            run(n)
            seconds[run].append(clock() - start)
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
    layer: Sequence[Linear], targets: Sequence[Linear], kept_dir: Path | None = None
) -> RowBands:
    """Race W8A8 against the dense matmul over `layer` (one decoder layer's
    W8A8 matrices, summed), then serve W8A8 in the bands it won in every one
    of `targets` (`Linear.serve_int8_activations_in`; none won drops it).
    The bands won are kept in `kept_dir` (`bands_file`): a later load on
    this CPU, kernels and versions reads them instead of racing, so
    replicas agree. Returns the bands W8A8 serves."""
    path = None if kept_dir is None else bands_file(kept_dir, layer)
    bands = read_bands(path)
    if bands is None:
        bands = _race(layer)
        write_bands(path, bands)
    for linear in targets:
        linear.serve_int8_activations_in(bands)
    served = targets[0].int8_row_bands if targets else bands
    if served:
        logger.info("W8A8 at %s, the AMX bfloat16 matmul elsewhere (raced in every band)",
                    describe_bands(served))  # fmt: skip
    else:
        logger.info("W8A8 lost to the AMX bfloat16 matmul in every band at load: off")
    return served


def _race(layer: Sequence[Linear]) -> RowBands:
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

    return race_bands(dense, w8a8)


def bands_file(kept_dir: Path, layer: Sequence[Linear]) -> Path:
    """Where the race's bands for this CPU (model name and flags lines), these
    kernels, versions, thread count and matrix shapes are kept."""
    from sluice.models.native.build import cpu_identity, sources_digest

    shapes = ";".join(f"{tuple(linear.weight.shape)}{linear.weight.dtype}" for linear in layer)
    key = hashlib.sha256()
    for part in (cpu_identity(), sources_digest(), torch.__version__, str(RACE_ROWS), shapes,
                 str(torch.get_num_threads())):  # fmt: skip
        key.update(f"{part}\0".encode())
    return kept_dir / f"w8a8-bands-{key.hexdigest()[:24]}.json"


def read_bands(path: Path | None) -> RowBands | None:
    """The bands kept at `path` ([start, stop or null] pairs); None where
    there are none, or the file is damaged."""
    if path is None:
        return None
    try:
        pairs = json.loads(path.read_text(encoding="utf-8"))["int8_activation_bands"]
        bands = tuple(range(start, sys.maxsize if stop is None else stop) for start, stop in pairs)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return bands


def write_bands(path: Path | None, bands: RowBands) -> None:
    if path is None:
        return
    pairs = [[band.start, None if band.stop == sys.maxsize else band.stop] for band in bands]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written beside the target, then renamed: a reader never sees half a file.
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as scratch:
            json.dump({"int8_activation_bands": pairs}, scratch)
        os.replace(scratch.name, path)
    except OSError as error:
        logger.warning("W8A8 bands %s not written: %s", path, error)
