"""benchmarks/row_invariance.py: the verdict logic on matmuls of known behaviour,
and each of its paths on a small shape."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
row_invariance = importlib.import_module("row_invariance")


def test_a_row_wise_matmul_is_invariant_and_one_that_sees_the_batch_is_not():
    x = torch.randn(40, 8)
    weight = torch.randn(8, 4)
    assert row_invariance.rows_that_differ(lambda t: t @ weight, x, (1, 3, 17, 40)) == []

    def batch_dependent(t: torch.Tensor) -> torch.Tensor:
        return t @ weight + (1e-3 if t.shape[0] > 16 else 0.0)  # another kernel past 16 rows

    assert row_invariance.rows_that_differ(batch_dependent, x, (1, 3, 17, 40)) == [17, 40]


def test_every_path_computes_the_same_product_within_its_rounding():
    torch.manual_seed(0)
    weight = torch.randn(64, 128) * 0.05
    found = row_invariance.paths(weight)
    assert {"dense", "plain", "int4"} <= set(found)
    x = torch.randn(5, 128).bfloat16()
    reference = x.float() @ weight.t()
    for name, matmul in found.items():
        error = (matmul(x).float() - reference).abs().max().item()
        assert error < 0.1 * reference.abs().max().item(), name


def test_the_flags_line_names_only_known_flags():
    line = row_invariance.cpu_flags()
    assert (
        line == "unknown"
        or line.startswith("none of")
        or set(line.split()) <= set(row_invariance.FLAGS)
    )
