"""Decode steps of an in-process engine core, two code paths alternating step by step.

Shared by the A/B benchmarks (int8_activations.py, rope_kv.py): the machine's
drift hits both paths alike, and the figure to read is the ratio of the
medians.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from sluice.engine.core import EngineCore
from sluice.engine.engine_request import generation_request
from sluice.engine.sampling_params import SamplingParams


def decode_step_medians(
    core: EngineCore,
    prompt: list[int],
    batch: int,
    steps: int,
    use: Callable[[str], None],
    paths: tuple[str, str],
) -> tuple[float, float]:
    """Median ms of a decode step of `batch` greedy requests on each path;
    `use(path)` switches the model to it. Leaves the second path in use and
    the engine empty."""
    params = SamplingParams(max_tokens=100_000, temperature=0.0, ignore_eos=True)
    ids = [f"b{batch}-{i}" for i in range(batch)]
    for request_id in ids:
        core.add_request(generation_request(request_id, prompt, params))
    for _ in range(5):  # the prefill, then steps that are all decodes
        core.step()
    seconds: dict[str, list[float]] = {path: [] for path in paths}
    for i in range(steps):
        path = paths[i % 2]
        use(path)
        start = time.perf_counter()
        core.step()
        seconds[path].append(time.perf_counter() - start)
    use(paths[1])
    core.abort_requests(ids)
    while core.has_unfinished_requests():
        core.step()
    first, second = (statistics.median(seconds[path]) * 1e3 for path in paths)
    return first, second
