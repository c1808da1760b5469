"""Prometheus series written from the event loop only: plain numbers, no locks.

The frontend's observer runs on the event loop, with chunks in batches (one
per token when readers keep up), so these series are plain lists and ints,
turned into Prometheus families only when scraped. Each series may be exposed
under several names (sluice's and vLLM's): one observation, one set of
numbers, every name reading the same values.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString


class LoopHistogram:
    """A histogram with bulk observations: `observe(value, count)` records
    `count` observations of `value` at the cost of one; buckets are cumulative
    only in the exposition."""

    __slots__ = ("names", "documentation", "upper_bounds", "counts", "sum")

    def __init__(self, names: tuple[str, ...], documentation: str, upper_bounds: Sequence[float]):
        self.names = names
        self.documentation = documentation
        self.upper_bounds = tuple(upper_bounds)
        # Per bucket (not cumulative), the last one +Inf.
        self.counts = [0] * (len(self.upper_bounds) + 1)
        self.sum = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, value: float, count: int = 1) -> None:
        # Prometheus buckets are "less than or equal": bisect_left finds the first bound >= value.
        self.counts[bisect_left(self.upper_bounds, value)] += count
        self.sum += value * count

    def observe_all(self, values: Sequence[float], counts: Sequence[int] | None = None) -> None:
        """`observe(value, count)` for each value (count 1 without `counts`), in one call."""
        bounds, bucket_counts = self.upper_bounds, self.counts
        if counts is None:
            for value in values:
                bucket_counts[bisect_left(bounds, value)] += 1
            self.sum += sum(values)
            return
        total = 0.0
        for value, count in zip(values, counts, strict=True):
            bucket_counts[bisect_left(bounds, value)] += count
            total += value * count
        self.sum += total

    def families(self, labels: dict[str, str]) -> Iterator[HistogramMetricFamily]:
        """One family per name, its one histogram labelled `labels`."""
        bounds = [floatToGoString(bound) for bound in self.upper_bounds] + ["+Inf"]
        cumulative, buckets = 0, []
        for bound, count in zip(bounds, self.counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        for name in self.names:
            family = HistogramMetricFamily(name, self.documentation, labels=list(labels))
            family.add_metric(list(labels.values()), buckets, self.sum)
            yield family


class LoopCounter:
    """A counter, optionally split by one label (`inc(amount, label_value)`)."""

    __slots__ = ("names", "documentation", "label", "values")

    def __init__(self, names: tuple[str, ...], documentation: str, label: str | None = None):
        self.names = names
        self.documentation = documentation
        self.label = label
        # Label value ("" without a label) -> total.
        self.values: dict[str, float] = {} if label else {"": 0}

    def inc(self, amount: float = 1, label_value: str = "") -> None:
        self.values[label_value] = self.values.get(label_value, 0) + amount

    @property
    def total(self) -> float:
        return sum(self.values.values())

    def families(self, labels: dict[str, str]) -> Iterator[CounterMetricFamily]:
        """One family per name, its samples labelled `labels` (and by its own label)."""
        names = list(labels) + ([self.label] if self.label else [])
        for name in self.names:
            family = CounterMetricFamily(name, self.documentation, labels=names)
            for label_value, total in self.values.items():
                extra = [label_value] if self.label else []
                family.add_metric([*labels.values(), *extra], total)
            yield family
