"""Which attention and int8 kernels serve this CPU: measured at load.

Attention is chunk-blind in every measured plan (issue 44): a row's bits
depend only on its own query and the keys and values at positions up to
it, never on the chunk that computed it, the rows beside it, or whether a
prefill or a decode step did. So one kernel family serves every attention
row of the process, prefill and decode alike: the AVX512 pair
(native/prefill_attention.c and native/paged_decode_attention.c, one
compiled per-row step, avx512_attention.c) or, where the CPU and OS grant
AMX tiles, the AMX pair (native/prefill_attention_amx.c and
native/decode_attention_amx.c, amx_attention.h). Both visit keys in blocks
at fixed absolute positions with an online softmax in a fixed order per
row. Where neither prefill kernel runs (heads other than 64 or 128,
float32), every prefill token is one row of the native decode kernel over
exactly its own keys (ROWS): chunk-blind too, slower on long prompts.

torch's flash SDPA is no candidate: its reduction follows the chunk (a
row's bits differ with how the prompt was cut), so a restored prefix would
not equal a cold recompute. It serves only where no native kernel runs at
all, or where a `--kernel-plan FILE` names it (the startup line then says
the attention is not chunk-blind). Mixing families by prompt length has the
same flaw (a chunk's kernel would follow its length), so the measurement
chooses one family for every length (`measure_attention`): AMX where its
times against the AVX512 pair's, at `PREFILL_LENGTHS` (whole prompts) and
`DECODE_ROWS` (one decode; a verification's nine rows, over DECODE_KEYS
keys), have a geometric mean below 1; a tie goes to AVX512. On Zen 4 there
is no AMX; on a Sapphire Rapids the AMX prefill kernel ran 1.6-1.9x torch's
flash SDPA from 2,000 to 8,000 keys and the AMX decode kernel 31 against 49
us a row (prefill_attention_amx.c, decode_attention_amx.c).

The plan is kept in the execution plan's one cache (plan_cache.py), so
later starts and replicas read it back instead of measuring (`to_fields`,
`plan_from_fields`); `--kernel-plan measure` measures again,
`--kernel-plan FILE` pins one (the cache file's format; its
`prefill_attention` bands may still name kernels by prompt length). Every
measurement here reports the spread of its repeats (`spreads`): a plan
timed on a busy machine is used but not kept.

The plan also says which int8 matmul serves which step sizes in the
row-invariant scheme (`int8_matmul`, bands of int8 code rows): the VNNI
kernel (native/int8_gemm.c) or AMX-INT8 tiles (native/int8_amx.c), timed
at load on one of the model's own matrices at `INT8_ROWS`. Both give the
same exact sums through one epilogue, so this choice never changes a row's
bits: only its speed, so replicas may choose apart and still agree.

The attention candidates compute the same attention within bfloat16
rounding (tests compare each with float32 attention); a native kernel that
disagrees with torch at load is not a candidate.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sluice.errors import ModelLoadError
from sluice.models.plan_cache import spread

logger = logging.getLogger(__name__)

NATIVE, TORCH = "native", "torch"
# Every prefill token one row of the native decode kernel (no prefill kernel for these heads).
ROWS = "rows"
VNNI, AMX = "vnni", "amx"
# Int8 code rows per step timed at load (a decode step's few rows up to a prefill chunk's).
INT8_ROWS = (1, 2, 4, 8, 16, 32, 64, 512)
# Rows of one sequence a decode attention step is timed at (one decode; a
# verification of 8 drafted tokens), over DECODE_KEYS keys.
DECODE_ROWS = (1, 9)
DECODE_KEYS = 1024
# The prompt lengths (keys per chunk) timed at load: a short prompt, a page, an agent's.
PREFILL_LENGTHS = (256, 1024, 4096)
_REPEATS = 3
# (first length in tokens, kernel), ascending; the first from 0.
Bands = tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class KernelPlan:
    """The kernel each band of prefill lengths runs on (module docstring)."""

    # (first number of keys, NATIVE, AMX, ROWS or TORCH), ascending; the
    # first from 0. A measured plan has one band, of decode_attention's family.
    prefill_attention: Bands = ((0, NATIVE),)
    # How the plan came: "measured at load", "cached", "from FILE", or why none was measured.
    source: str = "native kernel wherever it runs"
    # (first int8 code rows, VNNI or AMX), ascending, the first from 0; empty
    # where there was nothing to choose (no AMX, not the row-invariant scheme).
    int8_matmul: Bands = ()
    # (rows, seconds) of the row-invariant scheme's int8 matmul on the
    # model's gate/up matrix, on the kernel its band chose, at INT8_ROWS:
    # how a step's cost grows with its rows, which speculation's rule reads
    # (sluice/engine/speculation.py); empty outside that scheme.
    step_seconds: tuple[tuple[int, float], ...] = ()
    # The decode attention kernel of every decode row (NATIVE: the AVX512
    # kernel, native/paged_decode_attention.c; AMX: native/decode_attention_amx.c,
    # whose rows get the bits the AMX prefill kernel gives their queries).
    # One for the process: a row's bits must not depend on its step.
    decode_attention: str = NATIVE

    def prefill_kernel(self, num_keys: int) -> str:
        """The kernel (NATIVE, AMX, ROWS or TORCH) of a prefill chunk over `num_keys` keys."""
        return band_of(self.prefill_attention, num_keys)

    @property
    def is_chunk_blind(self) -> bool:
        """Whether every attention row gets the same bits in any chunk and as
        a decode row: one family for every length, prefill and decode."""
        names = {name for _, name in self.prefill_attention}
        if len(names) != 1:
            return False
        (kernel,) = names
        if kernel == ROWS:
            return self.decode_attention == NATIVE
        return kernel in (NATIVE, AMX) and kernel == self.decode_attention

    def describe(self) -> str:
        """For the startup line: "kernel plan (measured at load): prefill
        attention native below 1024 tokens, torch from 1024"."""
        bands = self.prefill_attention
        if len(bands) == 1:
            where = f"{bands[0][1]} at every length"
        else:
            parts = [f"{bands[0][1]} below {bands[1][0]} tokens"]
            parts += [f"{name} from {start}" for start, name in bands[1:]]
            where = ", ".join(parts)
        line = f"kernel plan ({self.source}): prefill attention {where}"
        if self.int8_matmul:
            line += f"; int8 matmul {_describe(self.int8_matmul, 'rows')}"
        if self.decode_attention == AMX:
            line += "; decode attention on AMX tiles"
        if not self.is_chunk_blind:
            line += "; attention not chunk-blind (a row's bits follow its chunk)"
        return line

    def to_fields(self) -> dict[str, object]:
        """The plan's fields as the cache file keeps them (plan_cache.py)."""
        return {
            "prefill_attention": [list(band) for band in self.prefill_attention],
            "int8_matmul": [list(band) for band in self.int8_matmul],
            "step_seconds": [list(point) for point in self.step_seconds],
            "decode_attention": self.decode_attention,
        }


def measured_lengths(max_model_len: int) -> list[int]:
    """The prompt lengths timed for a model of `max_model_len` positions."""
    return [n for n in PREFILL_LENGTHS if n <= max_model_len] or [max_model_len]


def band_of(bands: Bands, size: int) -> str:
    """The kernel of the band `size` falls in (bands ascending, the first from 0)."""
    kernel = bands[0][1]
    for start, name in bands:
        if size >= start:
            kernel = name
    return kernel


def _describe(bands: Bands, unit: str) -> str:
    if len(bands) == 1:
        return f"{bands[0][1]} at every size"
    parts = [f"{bands[0][1]} below {bands[1][0]} {unit}"]
    return ", ".join(parts + [f"{name} from {start}" for start, name in bands[1:]])


def measure_bands(
    candidates: Sequence[tuple[str, Callable[[int], object]]],
    sizes: Sequence[int],
    repeats: int = _REPEATS,
    clock: Callable[[], float] = time.perf_counter,
    fastest: list[tuple[int, float]] | None = None,
    spreads: list[float] | None = None,
) -> Bands:
    """The fastest of the named candidates at each of `sizes`, as bands (each
    from its size; the first from 0), neighbours of one candidate merged, no
    monotonicity assumed. Each size: one warm-up of each, `repeats` runs
    alternating, medians compared; a tie goes to the later candidate.
    `fastest` gets (size, the fastest's median seconds) for each size;
    `spreads` each candidate's repeat spread at each size."""
    bands: list[tuple[int, str]] = []
    for i, n in enumerate(sorted(sizes)):
        seconds = _medians(candidates, n, repeats, clock, spreads)
        best = min(seconds)
        faster = [name for (name, _), t in zip(candidates, seconds, strict=True) if t == best][-1]
        if fastest is not None:
            fastest.append((n, best))
        if not bands or bands[-1][1] != faster:
            bands.append((0 if i == 0 else n, faster))
    return tuple(bands)


def _medians(
    candidates: Sequence[tuple[str, Callable[[int], object]]],
    n: int,
    repeats: int,
    clock: Callable[[], float],
    spreads: list[float] | None = None,
) -> list[float]:
    """Each candidate's median seconds at size n: one warm-up of each, then
    `repeats` runs alternating between them; `spreads` gets each one's
    slowest over fastest repeat."""
    for _, run in candidates:
        run(n)  # warm-up
    seconds: list[list[float]] = [[] for _ in candidates]
    for _ in range(repeats):
        for times, (_, run) in zip(seconds, candidates, strict=True):
            start = clock()
            run(n)
            times.append(clock() - start)
    if spreads is not None:
        spreads.extend(spread(times) for times in seconds)
    return [statistics.median(times) for times in seconds]


def measure_int8(
    amx: Callable[[int], object] | None,
    vnni: Callable[[int], object],
    rows: Sequence[int] = INT8_ROWS,
    repeats: int = _REPEATS,
    clock: Callable[[], float] = time.perf_counter,
    spreads: list[float] | None = None,
) -> tuple[Bands, tuple[tuple[int, float], ...]]:
    """The faster int8 matmul at each count of code rows (a tie goes to VNNI;
    no bands without AMX), and the (rows, seconds) of the faster."""
    if amx is None:  # VNNI alone: only its times
        only = ((VNNI, vnni),)
        return (), tuple((n, _medians(only, n, repeats, clock, spreads)[0]) for n in sorted(rows))
    seconds: list[tuple[int, float]] = []
    bands = measure_bands(((AMX, amx), (VNNI, vnni)), rows, repeats, clock, seconds, spreads)
    return bands, tuple(seconds)


def measure_attention(
    native: tuple[Callable[[int], object], Callable[[int], object]],
    amx: tuple[Callable[[int], object], Callable[[int], object]] | None,
    lengths: Sequence[int] = PREFILL_LENGTHS,
    sizes: Sequence[int] = DECODE_ROWS,
    repeats: int = _REPEATS,
    clock: Callable[[], float] = time.perf_counter,
    spreads: list[float] | None = None,
) -> str:
    """The attention family of every row (module docstring): AMX where its
    (prefill, decode) candidates' times against the AVX512 pair's, prefill
    at each of `lengths` (`prefill(n)`: a whole prompt of n tokens) and
    decode at each of `sizes` (`decode(n)`: n rows of one sequence), have a
    geometric mean below 1; else NATIVE (a tie too)."""
    if amx is None:
        return NATIVE
    log_ratio = 0.0
    for kind, points in ((0, lengths), (1, sizes)):
        candidates = ((AMX, amx[kind]), (NATIVE, native[kind]))
        for n in points:
            amx_seconds, native_seconds = _medians(candidates, n, repeats, clock, spreads)
            log_ratio += math.log(max(amx_seconds, 1e-12) / max(native_seconds, 1e-12))
    return AMX if log_ratio < 0 else NATIVE


def parse_bands(value: object, key: str = "prefill_attention") -> Bands | None:
    """Bands from a plan file's JSON; None unless well formed (ascending, from 0).
    A file without int8 bands (older, or measured without AMX) has none: ()."""
    if isinstance(value, dict) and key == "int8_matmul" and key not in value:
        return ()
    if not isinstance(value, dict) or not isinstance(value.get(key), list):
        return None
    bands = value[key]
    names = (NATIVE, AMX, ROWS, TORCH) if key == "prefill_attention" else (VNNI, AMX)
    if not all(
        isinstance(band, list) and len(band) == 2 and type(band[0]) is int
        and band[1] in names for band in bands
    ):  # fmt: skip
        return None
    if key == "prefill_attention" and not bands:
        return None
    starts = [band[0] for band in bands]
    if bands and (starts[0] != 0 or starts != sorted(set(starts))):
        return None
    return tuple((start, name) for start, name in bands)


def plan_from_fields(value: dict[str, object], source: str) -> KernelPlan | None:
    """The plan a cache file's fields hold; None where they are missing or damaged."""
    bands, int8 = parse_bands(value), parse_bands(value, "int8_matmul")
    seconds = _parse_seconds(value)
    decode = value.get("decode_attention", NATIVE)
    if bands is None or int8 is None or seconds is None or decode not in (NATIVE, AMX):
        return None
    return KernelPlan(bands, source, int8, seconds, str(decode))


def _parse_seconds(value: object) -> tuple[tuple[int, float], ...] | None:
    """A plan file's step_seconds ((rows, seconds) ascending); () if absent, None if bad."""
    points = value.get("step_seconds", []) if isinstance(value, dict) else None
    if not isinstance(points, list) or not all(
        isinstance(p, list) and len(p) == 2 and type(p[0]) is int and p[0] > 0
        and isinstance(p[1], float) and p[1] > 0 for p in points
    ):  # fmt: skip
        return None
    rows = [p[0] for p in points]
    return tuple((n, t) for n, t in points) if rows == sorted(set(rows)) else None


def pinned_plan(path: str, value: dict[str, object]) -> KernelPlan:
    """`--kernel-plan FILE`: the plan its fields `value` hold; ModelLoadError
    naming the flag if none."""
    plan = plan_from_fields(value, f"from {path}")
    if plan is None:
        raise ModelLoadError(
            f"--kernel-plan {path}: not a kernel plan file (JSON: "
            '{"prefill_attention": [[0, "amx"]], "int8_matmul": '
            '[[0, "vnni"], [8, "amx"]], "decode_attention": "amx"}; or choose auto or measure)'
        )
    return plan
