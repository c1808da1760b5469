"""Which prefill attention kernel serves which prompt lengths on this CPU: measured at load.

Two candidates compute a prefill chunk's attention: the native flash kernel
(native/prefill_attention.c, AVX512-BF16) and torch's flash SDPA. Which is
faster depends on the CPU, not on the code: on Zen 4 the native kernel wins;
on a Sapphire Rapids with AMX torch's SDPA runs on AMX tiles through oneDNN
and wins long prompts by 2.4-3.8x (issue 27: 512 tokens native 2.49 ms
against 1.04 ms, 2,000 tokens 33.98 against 8.96 ms per layer). So the load
times both on the model's own head shapes at `PREFILL_LENGTHS` and gives
each band of lengths (from one measured length to the next; the first from
0, the last without end) to the faster, no monotonicity assumed; a tie goes
to torch (the native kernel must win to serve). The plan is kept in the
cache beside the calibration (`plan_file`), keyed by the CPU's model name
and flags lines, the kernels' sources, torch's and sluice's versions, the
head shapes and the thread count, so later starts and replicas read it back
instead of measuring; `--kernel-plan measure` measures again, `--kernel-plan
FILE` pins one (the cache file's format).

Both candidates compute the same attention within bfloat16 rounding (tests
compare each with float32 attention); a native kernel that disagrees with
torch at load is not a candidate. Note (issue 28): a chunk's kernel follows
its sequence's length, so a row's bits can differ with how its prompt was
chunked, as they already do between flash reductions of different chunks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch

from sluice.errors import ModelLoadError
from sluice.models.config import LlamaConfig

logger = logging.getLogger(__name__)

NATIVE, TORCH = "native", "torch"
# The prompt lengths (keys per chunk) timed at load: a short prompt, a page, an agent's.
PREFILL_LENGTHS = (256, 1024, 4096)
# `--kernel-plan` values other than a file's path.
AUTO, MEASURE = "auto", "measure"
_REPEATS = 3
# (first length in tokens, kernel), ascending; the first from 0.
Bands = tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class KernelPlan:
    """The kernel each band of prefill lengths runs on (module docstring)."""

    # (first number of keys, NATIVE or TORCH), ascending; the first from 0.
    prefill_attention: Bands = ((0, NATIVE),)
    # How the plan came: "measured at load", "cached", "from FILE", or why none was measured.
    source: str = "native kernel wherever it runs"

    def is_native_prefill(self, num_keys: int) -> bool:
        """Whether a prefill chunk over `num_keys` keys takes the native kernel."""
        kernel = self.prefill_attention[0][1]
        for start, name in self.prefill_attention:
            if num_keys >= start:
                kernel = name
        return kernel == NATIVE

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
        return f"kernel plan ({self.source}): prefill attention {where}"

    def to_json(self) -> str:
        return json.dumps({"prefill_attention": [list(band) for band in self.prefill_attention]})


def measure_prefill(
    native: Callable[[int], object],
    sdpa: Callable[[int], object],
    lengths: Sequence[int] = PREFILL_LENGTHS,
    repeats: int = _REPEATS,
    clock: Callable[[], float] = time.perf_counter,
) -> Bands:
    """The faster of `native(n)` and `sdpa(n)` at each of `lengths`, as bands
    (each from its length; the first from 0), neighbours of one kernel
    merged. Each length: one warm-up of each, `repeats` runs alternating,
    medians compared; a tie goes to torch."""
    bands: list[tuple[int, str]] = []
    for i, n in enumerate(sorted(lengths)):
        native(n), sdpa(n)  # warm-ups
        seconds: dict[Callable, list[float]] = {native: [], sdpa: []}
        for _ in range(repeats):
            for run in (native, sdpa):
                start = clock()
                run(n)
                seconds[run].append(clock() - start)
        faster = (
            NATIVE
            if statistics.median(seconds[native]) < statistics.median(seconds[sdpa])
            else TORCH
        )
        if not bands or bands[-1][1] != faster:
            bands.append((0 if i == 0 else n, faster))
    return tuple(bands)


def parse_bands(value: object) -> Bands | None:
    """Bands from a plan file's JSON; None unless well formed (ascending, from 0)."""
    if not isinstance(value, dict) or not isinstance(value.get("prefill_attention"), list):
        return None
    bands = value["prefill_attention"]
    if not bands or not all(
        isinstance(band, list) and len(band) == 2 and type(band[0]) is int
        and band[1] in (NATIVE, TORCH) for band in bands
    ):  # fmt: skip
        return None
    starts = [band[0] for band in bands]
    if starts[0] != 0 or starts != sorted(set(starts)):
        return None
    return tuple((start, name) for start, name in bands)


def plan_file(
    cache_dir: Path, config: LlamaConfig, dtype: torch.dtype, lengths: Sequence[int]
) -> Path:
    """Where the plan of this CPU, these kernels and versions, and these head shapes is kept."""
    from sluice.models.native.build import cpu_identity, sources_digest

    key = hashlib.sha256()
    for part in (
        cpu_identity(), sources_digest(), torch.__version__, _sluice_version(), str(dtype),
        f"{config.num_attention_heads}/{config.num_key_value_heads}/{config.head_dim}",
        ",".join(map(str, lengths)), str(torch.get_num_threads()),
    ):  # fmt: skip
        key.update(f"{part}\0".encode())
    return cache_dir / "calibration" / f"kernel-plan-{key.hexdigest()[:24]}.json"


def read_plan(path: Path, source: str) -> KernelPlan | None:
    """The plan kept at `path`; None where it is missing or damaged."""
    try:
        bands = parse_bands(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None
    return None if bands is None else KernelPlan(bands, source)


def write_plan(path: Path, plan: KernelPlan) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written beside the target, then renamed: a reader never sees half a file.
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as scratch:
            scratch.write(plan.to_json())
        os.replace(scratch.name, path)
    except OSError as error:
        logger.warning("kernel plan %s not written: %s", path, error)


def _sluice_version() -> str:
    try:
        return metadata.version("sluice")
    except metadata.PackageNotFoundError:
        return "unknown"


def pinned_plan(path: str) -> KernelPlan:
    """`--kernel-plan FILE`: the plan it holds; ModelLoadError naming the flag if none."""
    plan = read_plan(Path(path), f"from {path}")
    if plan is None:
        raise ModelLoadError(
            f"--kernel-plan {path}: not a kernel plan file (JSON: "
            '{"prefill_attention": [[0, "native"], [1024, "torch"]]}; or choose auto or measure)'
        )
    return plan
