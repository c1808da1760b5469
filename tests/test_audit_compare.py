"""Compare mode's ratios B/A."""

from __future__ import annotations

import pytest

from sluice.audit.compare import COMPARED_METRICS, ratio, ratios
from sluice.audit.metrics import Percentiles, ScenarioMetrics


def metrics(ttft_p50_s: float | None, tokens_per_s: float, errors: int = 0) -> ScenarioMetrics:
    latency = Percentiles(1, ttft_p50_s, ttft_p50_s, ttft_p50_s)
    return ScenarioMetrics(
        10, errors, 100, 50, 1.0, latency, latency, latency, tokens_per_s, 50.0, 2.0
    )


def test_ratios_are_b_over_a_for_every_compared_metric():
    found = ratios(metrics(0.1, 100.0), metrics(0.2, 50.0))
    assert set(found) == {m.name for m in COMPARED_METRICS}
    assert found["ttft_p50_s"] == pytest.approx(2.0)
    assert found["output_tokens_per_s"] == pytest.approx(0.5)
    assert found["tokens_per_chunk"] == pytest.approx(1.0)


def test_a_ratio_over_zero_or_missing_is_none():
    assert ratio(0.0, 1.0) is None and ratio(None, 1.0) is None and ratio(1.0, None) is None
    found = ratios(metrics(None, 0.0), metrics(0.2, 50.0, errors=3))
    assert (
        found["ttft_p50_s"] is None
        and found["output_tokens_per_s"] is None
        and found["errors"] is None
    )
