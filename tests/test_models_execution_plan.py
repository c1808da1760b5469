"""The execution plan as one value (sluice/models/execution_plan.py).

- `describe` says the whole plan in one clause (the startup line's and the
  `sluice:kernel_plan` metric's text): the kernel plan, the W8A8 bands raced
  against AMX (or none won), the int8 step times, the fused decode layers,
  the kept blocks and why a busy machine's plan was not kept;
- nothing planned says nothing; the step times come from the kernel plan.
"""

from __future__ import annotations

import sys

from sluice.models.execution_plan import ExecutionPlan
from sluice.models.kernel_plan import AMX, NATIVE, VNNI, KernelPlan

MEASURED = KernelPlan(
    ((0, AMX),), "measured at load", ((0, VNNI), (8, AMX)), ((1, 2e-5), (8, 3e-5)), AMX
)


def test_the_whole_plan_is_one_clause_in_a_fixed_order():
    plan = ExecutionPlan(
        MEASURED,
        w8a8_bands=(range(4, 64), range(512, sys.maxsize)),
        fused_decode_layers=(2, 3),
        blocks="gguf",
        not_kept="plan not kept: the kernel plan timed on a busy machine",
    )
    assert plan.describe() == (
        "kernel plan (measured at load): prefill attention amx at every length; "
        "int8 matmul vnni below 8 rows, amx from 8; decode attention on AMX tiles; "
        "W8A8 at 4-63 and 512+ rows; int8 step times by rows 1: 20 us, 8: 30 us; "
        "decode steps: 2 of 3 decoder layers in one native call each; "
        "weights kept in gguf blocks; plan not kept: the kernel plan timed on a busy machine"
    )
    assert plan.step_seconds == MEASURED.step_seconds


def test_a_race_lost_everywhere_says_so_and_no_race_says_nothing():
    lost = ExecutionPlan(KernelPlan(((0, NATIVE),), "cached"), w8a8_bands=())
    assert lost.describe().endswith("; W8A8 at no rows")
    assert "W8A8" not in ExecutionPlan(KernelPlan(((0, NATIVE),), "cached")).describe()


def test_nothing_planned_says_nothing():
    assert ExecutionPlan(None).describe() == ""
    assert ExecutionPlan(None).step_seconds == ()
    fused_only = ExecutionPlan(None, fused_decode_layers=(1, 1))
    assert fused_only.describe() == "decode steps: 1 of 1 decoder layers in one native call each"
