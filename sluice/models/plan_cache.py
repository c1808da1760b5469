"""The execution plan's one cache: one key, one file, one atomic writer.

What a load measures about this CPU to decide its execution plan (the
attention family, the int8 matmul per step size and its step times:
kernel_plan.py; the bands of rows W8A8 serves against AMX bfloat16:
int8_threshold.py) is kept in ONE JSON file per key (`plan_path`): the
CPU's model name and flags lines, the kernels' sources, torch's and
sluice's versions, the thread count, and the model's shapes, dtypes and
quantization choices (`model_key`). A load reads it once (`PlanStore.open`),
each measurement it lacks records its part (`PlanStore.put`), and the load
writes it once (`PlanStore.save`, written beside and renamed: a reader never
sees half a file). Files of the older separate caches (kernel-plan-*.json,
w8a8-bands-*.json) are ignored.

A measurement taken on a busy machine is not kept: where any candidate's
repeat timings at one size spread beyond `BUSY_SPREAD` (slowest over
fastest, and apart by more than a preemption costs: BUSY_FLOOR_S), the plan serves this run only, the startup line says so, and the
next start measures again.

`--kernel-plan auto` reads the kept file and measures what it lacks;
`measure` measures everything again (and keeps it where steady); FILE pins
the plan a file of this format holds (never written; a part it lacks is
measured for this run).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO

import torch

logger = logging.getLogger(__name__)

# `--kernel-plan` values other than a file's path.
AUTO, MEASURE = "auto", "measure"
# Slowest over fastest of one candidate's repeats at one size beyond which
# the machine was busy while measuring: a preempted run takes several times
# an undisturbed one, while undisturbed repeats stay well within this.
BUSY_SPREAD = 2.0
# A preempted run loses at least a scheduler slice (about a millisecond):
# repeats closer than this are timer and cache jitter, not a busy machine.
BUSY_FLOOR_S = 5e-4


def is_steady(spreads: Sequence[float]) -> bool:
    """Whether every (candidate, size)'s repeats agreed within BUSY_SPREAD."""
    return max(spreads, default=1.0) <= BUSY_SPREAD


def spread(seconds: Sequence[float]) -> float:
    """Slowest over fastest of one candidate's repeat timings; 1.0 where
    they differ by less than BUSY_FLOOR_S."""
    slowest, fastest = max(seconds), min(seconds)
    if slowest - fastest < BUSY_FLOOR_S:
        return 1.0
    return slowest / max(fastest, 1e-12)


def model_key(middle: torch.nn.Module, dtype: torch.dtype, *choices: object) -> str:
    """The model's part of the key: its dtype, the shapes and dtypes of its
    middle decoder layer's parameters (heads, widths, experts), and
    `choices` (quantization, activations, the lengths measured...)."""
    shapes = [f"{name}{tuple(p.shape)}{p.dtype}" for name, p in middle.named_parameters()]
    return "\0".join([str(dtype), ";".join(shapes), *map(str, choices)])


def plan_path(cache_dir: Path, model_part: str) -> Path:
    """Where the plan of this CPU, these kernels, versions and threads, and
    this model (`model_key`) is kept."""
    from sluice.models.native.build import cpu_identity, sources_digest

    key = hashlib.sha256()
    for part in (cpu_identity(), sources_digest(), torch.__version__, _sluice_version(),
                 str(torch.get_num_threads()), model_part):  # fmt: skip
        key.update(f"{part}\0".encode())
    return cache_dir / "calibration" / f"execution-plan-{key.hexdigest()[:24]}.json"


def read_json(path: Path) -> dict[str, object] | None:
    """The JSON object kept at `path`; None where it is missing or damaged."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_atomically(path: Path, write: Callable[[IO[bytes]], object], what: str) -> bool:
    """Write `path` through `write` beside it, then rename it into place: a
    reader never sees half a file (the one writer of the load's caches, the
    calibration's maxima too); False (logged) where it cannot be written."""
    scratch_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as scratch:
            scratch_name = scratch.name
            write(scratch)
        os.replace(scratch_name, path)
    except OSError as error:
        logger.warning("%s %s not written: %s", what, path, error)
        if scratch_name is not None:
            Path(scratch_name).unlink(missing_ok=True)
        return False
    return True


def write_json(path: Path, value: dict[str, object]) -> bool:
    """Keep `value` at `path` atomically; False (logged) where it cannot be written."""
    text = json.dumps(value).encode()
    return write_atomically(path, lambda scratch: scratch.write(text), "execution plan")


@dataclass(slots=True)
class PlanStore:
    """One load's view of its kept plan: what the file held, what this load
    measured, and whether every measurement was steady."""

    # Where the plan is kept; None: nowhere (a pinned file, or no cache).
    path: Path | None
    # The kept (or pinned) plan's fields; empty when measuring afresh.
    kept: dict[str, object]
    # The file `--kernel-plan FILE` pins; "" for the cache.
    pinned: str = ""
    # Fields measured by this load, by name.
    measured: dict[str, object] = field(default_factory=dict)
    # The names of measurements whose repeats disagreed (a busy machine).
    unsteady: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, setting: str, cache_dir: Path | None, model_part: str) -> PlanStore:
        """The store `--kernel-plan setting` gives (module docstring); a
        pinned file that holds no JSON object keeps nothing (its reader
        says what is wrong)."""
        if setting not in (AUTO, MEASURE):
            return cls(None, read_json(Path(setting)) or {}, setting)
        path = None if cache_dir is None else plan_path(Path(cache_dir), model_part)
        kept = read_json(path) if setting == AUTO and path is not None else None
        return cls(path, kept or {})

    @property
    def source(self) -> str:
        """How a plan read from `kept` came, for the startup line."""
        return f"from {self.pinned}" if self.pinned else "cached"

    def put(self, fields: dict[str, object], spreads: Sequence[float], what: str) -> None:
        """Record `fields` measured by this load; `spreads` of their repeats."""
        self.measured.update(fields)
        if not is_steady(spreads):
            self.unsteady.append(what)

    def save(self) -> str:
        """Keep what this load measured beside what it read, once; a note
        for the startup line where it was not kept ("" where nothing new)."""
        if not self.measured:
            return ""
        if self.unsteady:
            logger.warning("%s timed on a busy machine: used for this run, not kept",
                           " and ".join(self.unsteady))  # fmt: skip
            return f"plan not kept: {' and '.join(self.unsteady)} timed on a busy machine"
        if self.path is None:
            return ""
        if write_json(self.path, {**self.kept, **self.measured}):
            logger.info("execution plan kept in %s (pin it with --kernel-plan FILE)", self.path)
        return ""


def _sluice_version() -> str:
    try:
        return metadata.version("sluice")
    except metadata.PackageNotFoundError:
        return "unknown"
