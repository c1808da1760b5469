"""The execution plan: what this process runs each row on, decided at load, as one value.

A row's numerics and speed depend on its band: which attention kernel
serves a prefill chunk of its length and a decode row (kernel_plan.py),
which int8 matmul serves a step of its size, in which bands of rows W8A8
serves against AMX bfloat16 (int8_threshold.py), whether a decode step runs
as one native call per layer (fused_decode.py) and whether the GGUF file's
blocks (or others quantized at load) were kept. `ExecutionPlan` holds all of it with the step times it
was decided from, and `describe` says it whole in one clause: the startup
line and the `sluice:kernel_plan` metric print exactly that text. Its
measured parts are kept in one cache (plan_cache.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.models.int8_threshold import describe_bands
from sluice.models.kernel_plan import KernelPlan
from sluice.models.linear import RowBands


@dataclass(frozen=True, slots=True)
class ExecutionPlan:
    """The load's decisions about every row's path (module docstring)."""

    # The attention kernel per band (prefill, decode), the int8 matmul per
    # band of step sizes and its step times; None where no plan applies
    # (batch-invariant mode keeps its own attention path).
    kernels: KernelPlan | None
    # The bands of rows W8A8 serves after racing AMX bfloat16 (empty: it
    # lost every band); None where no race ran.
    w8a8_bands: RowBands | None = None
    # (decoder layers that run a decode step in one native call, all layers).
    fused_decode_layers: tuple[int, int] = (0, 0)
    # The blocks the weights stay in ("gguf": the GGUF file's); "" for none.
    blocks: str = ""
    # Why this run's measurement was not kept (a busy machine); "" otherwise.
    not_kept: str = ""

    @property
    def step_seconds(self) -> tuple[tuple[int, float], ...]:
        """(rows, seconds) of one int8 matmul per step size (speculation's cost rule)."""
        return () if self.kernels is None else self.kernels.step_seconds

    def describe(self) -> str:
        """The whole plan in one clause: "kernel plan (cached): prefill
        attention native at every length; W8A8 at 4-63 rows; decode steps:
        2 of 2 decoder layers in one native call each"; "" where nothing was
        planned."""
        parts = [] if self.kernels is None else [self.kernels.describe()]
        if self.w8a8_bands is not None:
            parts.append(f"W8A8 at {describe_bands(self.w8a8_bands)}")
        if self.step_seconds:
            times = ", ".join(
                f"{rows}: {seconds * 1e6:.0f} us" for rows, seconds in self.step_seconds
            )
            parts.append(f"int8 step times by rows {times}")
        fused, layers = self.fused_decode_layers
        if fused:
            parts.append(
                f"decode steps: {fused} of {layers} decoder layers in one native call each"
            )
        if self.blocks:
            parts.append(f"weights kept in {self.blocks} blocks")
        if self.not_kept:
            parts.append(self.not_kept)
        return "; ".join(parts)
