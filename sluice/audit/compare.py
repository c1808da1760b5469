"""Compare mode: the figures set side by side, and their ratios B/A.

The interleaving itself lives in the runner (scenarios alternate A-B, B-A);
this module names the compared metrics once, for the table, the JSON and the
HTML alike. A ratio is None when A's figure is zero or missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluice.audit.metrics import Percentiles, ScenarioMetrics


@dataclass(frozen=True, slots=True)
class ComparedMetric:
    # Key in the JSON report, e.g. "ttft_p50_s".
    name: str
    # Column header in the tables.
    label: str
    # True for latencies (a ratio below 1 means B is better).
    is_lower_better: bool
    read: Callable[[ScenarioMetrics], float | None]


def _percentile(field: str, level: str) -> Callable[[ScenarioMetrics], float | None]:
    def read(metrics: ScenarioMetrics) -> float | None:
        values: Percentiles = getattr(metrics, field)
        return getattr(values, level)

    return read


COMPARED_METRICS: tuple[ComparedMetric, ...] = (
    *(
        ComparedMetric(
            f"{field.removesuffix('_s')}_{level}_s",
            f"{title} {level}",
            True,
            _percentile(field, level),
        )
        for field, title in (("ttft_s", "TTFT"), ("itl_s", "ITL"), ("e2e_s", "E2E"))
        for level in ("p50", "p90", "p99")
    ),
    ComparedMetric("output_tokens_per_s", "tok/s", False, lambda m: m.output_tokens_per_s),
    ComparedMetric("chunks_per_s", "chunks/s", False, lambda m: m.chunks_per_s),
    ComparedMetric("tokens_per_chunk", "tok/chunk", False, lambda m: m.tokens_per_chunk),
    ComparedMetric("errors", "errors", True, lambda m: float(m.errors)),
)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return b / a


def ratios(metrics_a: ScenarioMetrics, metrics_b: ScenarioMetrics) -> dict[str, float | None]:
    """B/A for every compared metric."""
    return {
        metric.name: ratio(metric.read(metrics_a), metric.read(metrics_b))
        for metric in COMPARED_METRICS
    }
