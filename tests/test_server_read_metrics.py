"""Metrics read from their owner when scraped (sluice/server/observability/read_metrics.py):
each scrape shows the owner's numbers of that moment, one sample per model
or label set."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from sluice.server.observability.read_metrics import ReadInfos, ReadModelCounters


def scrape(*collectors) -> str:
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    return generate_latest(registry).decode()


def test_a_counter_per_model_shows_each_models_value_at_each_scrape():
    loads = {"alpha": 1, "beta": 0}
    counters = ReadModelCounters("sluice:model_loads", "Engine starts.", lambda: dict(loads))
    text = scrape(counters)
    assert 'sluice:model_loads_total{model_name="alpha"} 1.0' in text
    assert 'sluice:model_loads_total{model_name="beta"} 0.0' in text
    loads["beta"] = 2
    assert 'sluice:model_loads_total{model_name="beta"} 2.0' in scrape(counters)


def test_an_info_has_a_sample_per_label_set_and_is_absent_without_any():
    plans: list[dict[str, str]] = []
    infos = ReadInfos("sluice:kernel_plan", "Kernels.", lambda: list(plans))
    assert "sluice:kernel_plan" not in scrape(infos)
    plans.append({"model_name": "alpha", "plan": "avx512"})
    assert 'sluice:kernel_plan_info{model_name="alpha",plan="avx512"} 1.0' in scrape(infos)
