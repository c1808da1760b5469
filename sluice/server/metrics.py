"""Prometheus metrics of one app: request counters, latency histograms, engine gauges.

`ServerMetrics` is the frontend's `RequestObserver` (called on the event loop,
one call per chunk, never per token) and owns a private `CollectorRegistry`,
so many apps can live in one process (tests) without clashing in the global
registry. Engine gauges (running, waiting, KV cache usage) are read from the
engine's stats callable at scrape time, never pushed. Names follow vLLM's
(`vllm:` becomes `sluice:`) so existing dashboards need only a prefix change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from sluice.engine.client_base import EngineStats

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                  2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
ITL_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                 0.75, 1.0, 2.5, 5.0)  # fmt: skip
E2E_BUCKETS_S = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                 40.0, 50.0, 60.0, 120.0, 240.0)  # fmt: skip
TOKENS_PER_CHUNK_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class EngineStatsCollector(Collector):
    """Gauges read from the engine when Prometheus scrapes."""

    def __init__(self, stats: Callable[[], EngineStats], model_name: str):
        self._stats = stats
        self._model_name = model_name
        self._is_first_chunk_next = False

    def collect(self) -> Iterator[Metric]:
        snapshot = self._stats()
        yield self._gauge("sluice:num_requests_running", "Requests in the running batch.",
                          snapshot.num_running)  # fmt: skip
        yield self._gauge("sluice:num_requests_waiting", "Requests waiting for admission.",
                          snapshot.num_waiting)  # fmt: skip
        yield self._gauge("sluice:kv_cache_usage_perc", "KV cache blocks in use, 0 to 1.",
                          snapshot.kv_cache_usage)  # fmt: skip

    def _gauge(self, name: str, documentation: str, value: float) -> GaugeMetricFamily:
        gauge = GaugeMetricFamily(name, documentation, labels=["model_name"])
        gauge.add_metric([self._model_name], value)
        return gauge


class ServerMetrics:
    """The app's metrics; implements `sluice.frontend.observer.RequestObserver`."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats] | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"labelnames": ["model_name"], "registry": self.registry}
        self.prompt_tokens = Counter(
            "sluice:prompt_tokens", "Prompt tokens of finished requests.", **labels
        ).labels(model_name)
        self.generation_tokens = Counter(
            "sluice:generation_tokens", "Generated tokens delivered.", **labels
        ).labels(model_name)
        self.chunks_sent = Counter(
            "sluice:chunks_sent", "Stream chunks carrying tokens.", **labels
        ).labels(model_name)
        self.requests_aborted = Counter(
            "sluice:request_aborted", "Requests whose client went away.", **labels
        ).labels(model_name)
        self._success = Counter(
            "sluice:request_success",
            "Finished requests by finish reason.",
            labelnames=["model_name", "finished_reason"],
            registry=self.registry,
        )
        self._model_name = model_name
        self._is_first_chunk_next = False
        self.ttft_s = Histogram(
            "sluice:time_to_first_token_seconds", "Time to first token.",
            buckets=TTFT_BUCKETS_S, **labels,
        ).labels(model_name)  # fmt: skip
        self.itl_s = Histogram(
            "sluice:inter_token_latency_seconds", "Time between tokens (a chunk's gap "
            "spread over its tokens).", buckets=ITL_BUCKETS_S, **labels,
        ).labels(model_name)  # fmt: skip
        self.e2e_s = Histogram(
            "sluice:e2e_request_latency_seconds", "Request latency, arrival to finish.",
            buckets=E2E_BUCKETS_S, **labels,
        ).labels(model_name)  # fmt: skip
        self.tokens_per_chunk = Histogram(
            "sluice:tokens_per_chunk", "Tokens coalesced into one chunk.",
            buckets=TOKENS_PER_CHUNK_BUCKETS, **labels,
        ).labels(model_name)  # fmt: skip
        if stats is not None:
            self.registry.register(EngineStatsCollector(stats, model_name))

    # -- RequestObserver ---------------------------------------------------------

    def on_first_token(self, ttft_s: float) -> None:
        self.ttft_s.observe(ttft_s)
        # The frontend calls on_chunk for the same take right after this, on the
        # same loop turn; its gap is the TTFT, not an inter-token gap.
        self._is_first_chunk_next = True

    def on_chunk(self, num_tokens: int, gap_s: float) -> None:
        if num_tokens <= 0:
            return
        self.chunks_sent.inc()
        self.tokens_per_chunk.observe(num_tokens)
        if self._is_first_chunk_next:
            self._is_first_chunk_next = False
            return
        # A chunk of k tokens after a gap counts as k tokens each gap/k apart.
        per_token_s = gap_s / num_tokens
        for _ in range(num_tokens):
            self.itl_s.observe(per_token_s)

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
        self._success.labels(self._model_name, finish_reason).inc()

    def on_abort(self) -> None:
        self.requests_aborted.inc()

    # -- exposition ----------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text exposition of this app's registry."""
        return generate_latest(self.registry)
