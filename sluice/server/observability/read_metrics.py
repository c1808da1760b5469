"""Metrics whose owner keeps the numbers, read when Prometheus scrapes:
one counter per model (`ReadModelCounters`) and
an info metric with a sample per label set (`ReadInfos`). Nothing is pushed,
so a number has one owner and the exposition is never stale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector


class ReadInfos(Collector):
    """An info metric with one sample per label set `read` gives when
    Prometheus scrapes (one per running engine); absent while it gives none."""

    def __init__(self, name: str, documentation: str, read: Callable[[], list[dict[str, str]]]):
        self._name = name
        self._documentation = documentation
        self._read = read

    def collect(self) -> Iterator[Metric]:
        label_sets = self._read()
        if not label_sets:
            return
        names = sorted(label_sets[0])
        family = InfoMetricFamily(self._name, self._documentation, labels=names)
        for labels in label_sets:
            family.add_metric([labels[name] for name in names], {})
        yield family


class ReadModelCounters(Collector):
    """A counter per model, labelled `model_name`: `read()` gives {name: value}
    (every served model, loaded or not) when Prometheus scrapes."""

    def __init__(self, name: str, documentation: str, read: Callable[[], dict[str, float]]):
        self._name = name
        self._documentation = documentation
        self._read = read

    def collect(self) -> Iterator[Metric]:
        counter = CounterMetricFamily(self._name, self._documentation, labels=["model_name"])
        for model_name, value in self._read().items():
            counter.add_metric([model_name], value)
        yield counter
