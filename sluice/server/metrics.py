"""Prometheus metrics of one app: request counters, latency histograms, engine gauges.

`ServerMetrics` is the frontend's `RequestObserver` and owns a private
`CollectorRegistry`, so many apps can live in one process (tests) without
clashing in the global registry. The observer is called on the event loop,
with chunks in batches (there is one per token when readers keep up), so the
per-chunk series (time to first token, inter-token latency, tokens per chunk,
chunks sent) are `LoopHistogram`s: plain lists updated without locks and
turned into Prometheus families only when scraped. Per-request counters (once per choice)
use prometheus_client directly. Engine gauges (running, waiting, KV cache
usage) are read from the engine's stats callable at scrape time, never
pushed. Names follow vLLM's (`vllm:` becomes `sluice:`) so existing
dashboards need only a prefix change.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from sluice.engine.client_base import EngineStats

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                  2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
ITL_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                 0.75, 1.0, 2.5, 5.0)  # fmt: skip
E2E_BUCKETS_S = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                 40.0, 50.0, 60.0, 120.0, 240.0)  # fmt: skip
TOKENS_PER_CHUNK_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class LoopHistogram:
    """A histogram written from the event loop only: no lock, bulk observations.

    `observe(value, count)` records `count` observations of `value` at the
    cost of one; buckets are cumulative only in the exposition.
    """

    __slots__ = ("name", "documentation", "upper_bounds", "counts", "sum")

    def __init__(self, name: str, documentation: str, upper_bounds: tuple[float, ...]):
        self.name = name
        self.documentation = documentation
        self.upper_bounds = upper_bounds
        # Per bucket (not cumulative), the last one +Inf.
        self.counts = [0] * (len(upper_bounds) + 1)
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

    def family(self, model_name: str) -> HistogramMetricFamily:
        bounds = [floatToGoString(bound) for bound in self.upper_bounds] + ["+Inf"]
        cumulative, buckets = 0, []
        for bound, count in zip(bounds, self.counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        family = HistogramMetricFamily(self.name, self.documentation, labels=["model_name"])
        family.add_metric([model_name], buckets, self.sum)
        return family


class _LoopMetricsCollector(Collector):
    """Exposes the app's `LoopHistogram`s, and the chunk count they imply."""

    def __init__(self, metrics: ServerMetrics):
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        metrics = self._metrics
        for histogram in metrics.loop_histograms:
            yield histogram.family(metrics.model_name)
        chunks = CounterMetricFamily(
            "sluice:chunks_sent", "Stream chunks carrying tokens.", labels=["model_name"]
        )
        chunks.add_metric([metrics.model_name], metrics.tokens_per_chunk.count)
        yield chunks


class EngineStatsCollector(Collector):
    """Gauges read from the engine when Prometheus scrapes."""

    def __init__(self, stats: Callable[[], EngineStats], model_name: str):
        self._stats = stats
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        snapshot = self._stats()
        yield self._gauge("sluice:num_requests_running", "Requests in the running batch.",
                          snapshot.num_running)  # fmt: skip
        yield self._gauge("sluice:num_requests_waiting", "Requests waiting for admission.",
                          snapshot.num_waiting)  # fmt: skip
        yield self._gauge("sluice:kv_cache_usage_perc", "KV cache blocks in use, 0 to 1.",
                          snapshot.kv_cache_usage)  # fmt: skip
        # Prefix cache, in prompt tokens; also under vLLM's names, which its
        # dashboards read (hit rate = hits / queries).
        for prefix in ("sluice", "vllm"):
            yield self._counter(f"{prefix}:prefix_cache_queries",
                                "Prompt tokens looked up in the prefix cache.",
                                snapshot.prefix_cache_queried_tokens)  # fmt: skip
            yield self._counter(f"{prefix}:prefix_cache_hits",
                                "Prompt tokens found in the prefix cache.",
                                snapshot.prefix_cache_hit_tokens)  # fmt: skip

    def _counter(self, name: str, documentation: str, value: float) -> CounterMetricFamily:
        counter = CounterMetricFamily(name, documentation, labels=["model_name"])
        counter.add_metric([self._model_name], value)
        return counter

    def _gauge(self, name: str, documentation: str, value: float) -> GaugeMetricFamily:
        gauge = GaugeMetricFamily(name, documentation, labels=["model_name"])
        gauge.add_metric([self._model_name], value)
        return gauge


class ServerMetrics:
    """The app's metrics; implements `sluice.frontend.observer.RequestObserver`."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats] | None = None):
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"labelnames": ["model_name"], "registry": self.registry}
        self.prompt_tokens = Counter(
            "sluice:prompt_tokens", "Prompt tokens of finished requests.", **labels
        ).labels(model_name)
        self.generation_tokens = Counter(
            "sluice:generation_tokens", "Generated tokens delivered.", **labels
        ).labels(model_name)
        self.requests_aborted = Counter(
            "sluice:request_aborted", "Requests whose client went away.", **labels
        ).labels(model_name)
        self.stream_write_waits = Counter(
            "sluice:stream_write_waits",
            "Stream events that waited for a paused connection (a client reading slowly).",
            **labels,
        ).labels(model_name)
        self._success = Counter(
            "sluice:request_success",
            "Finished requests by finish reason.",
            labelnames=["model_name", "finished_reason"],
            registry=self.registry,
        )
        self.ttft_s = LoopHistogram(
            "sluice:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS_S
        )
        self.itl_s = LoopHistogram(
            "sluice:inter_token_latency_seconds",
            "Time between tokens (a chunk's gap spread over its tokens).",
            ITL_BUCKETS_S,
        )
        self.e2e_s = LoopHistogram(
            "sluice:e2e_request_latency_seconds", "Request latency, arrival to finish.",
            E2E_BUCKETS_S,
        )  # fmt: skip
        self.tokens_per_chunk = LoopHistogram(
            "sluice:tokens_per_chunk", "Tokens coalesced into one chunk.",
            TOKENS_PER_CHUNK_BUCKETS,
        )  # fmt: skip
        self.loop_histograms = (self.ttft_s, self.itl_s, self.e2e_s, self.tokens_per_chunk)
        self.registry.register(_LoopMetricsCollector(self))
        if stats is not None:
            self.registry.register(EngineStatsCollector(stats, model_name))

    # -- RequestObserver ---------------------------------------------------------

    def on_first_token(self, ttft_s: float, num_tokens: int) -> None:
        self.ttft_s.observe(ttft_s)
        self.tokens_per_chunk.observe(num_tokens)

    def on_chunks(self, num_tokens: Sequence[int], gaps_s: Sequence[float]) -> None:
        self.tokens_per_chunk.observe_all(num_tokens)
        # A chunk of k tokens after a gap counts as k tokens each gap/k apart.
        per_token_s = [gap_s / k for gap_s, k in zip(gaps_s, num_tokens, strict=True)]
        self.itl_s.observe_all(per_token_s, num_tokens)

    def on_finish(
        self,
        num_prompt_tokens: int,
        num_generation_tokens: int,
        e2e_s: float,
        finish_reason: str,
    ) -> None:
        self.prompt_tokens.inc(num_prompt_tokens)
        self.generation_tokens.inc(num_generation_tokens)
        self.e2e_s.observe(e2e_s)
        self._success.labels(self.model_name, finish_reason).inc()

    def on_abort(self) -> None:
        self.requests_aborted.inc()

    # -- exposition ----------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text exposition of this app's registry."""
        return generate_latest(self.registry)
