"""benchmarks/data_parallel.py without servers: the layouts it compares, its
report, and the router micro-benchmark. (A tiny run against real servers is
how the script itself was tried; it takes minutes of Ray startups.)"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its siblings
data_parallel = importlib.import_module("data_parallel")


def test_the_threads_are_split_between_the_two_replicas():
    one, two = data_parallel.layouts(4, single_engine=False)
    assert one.flags == ("--data-parallel", "1", "--replica-cpus", "4", "--num-threads", "4")
    assert two.flags == ("--data-parallel", "2", "--replica-cpus", "2", "--num-threads", "2")
    plain, *_ = data_parallel.layouts(4, single_engine=True)
    assert "--data-parallel" not in plain.flags and plain.flags == ("--num-threads", "4")


def test_the_report_gives_the_scaling_of_two_replicas_over_one():
    result = data_parallel.LayoutResult
    results = [
        result("1 replica x 2 threads", 100.0, 6400, 0, 0.5, 0.05, 300.0),
        result("2 replicas x 1 threads", 180.0, 6400, 0, 0.4, 0.04, 320.0),
    ]
    text = data_parallel.report(results, 0.5)
    assert "scaling (2 replicas / 1): 1.80x" in text
    assert "0.50 us per token" in text and "320" in text


def test_the_router_micro_benchmark_measures_a_positive_cost():
    assert data_parallel.router_us_per_token(num_requests=64) > 0
