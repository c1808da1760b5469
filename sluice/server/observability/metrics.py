"""Prometheus metrics of one app: request counters, latency histograms, engine gauges.

`ServerMetrics` is the frontend's `RequestObserver` and owns a private
`CollectorRegistry`, so many apps can live in one process (tests) without
clashing in the global registry. The observer is called on the event loop,
with chunks in batches (there is one per token when readers keep up), so its
series are `LoopHistogram`s and `LoopCounter`s (loop_series.py): plain
numbers updated without locks and turned into Prometheus families only when
scraped (request_series.py). Engine gauges (running, waiting, KV cache usage) and counters
(prefix cache, preemptions) are read from the engine's stats callable at
scrape time, never pushed.

Every series vLLM has is exposed under sluice's name and vLLM's
(`sluice:x` and `vllm:x`, plus vLLM's older alias
`vllm:time_per_output_token_seconds` of the inter-token latency), with vLLM's
types, `model_name` label and buckets (metric_buckets.py), so vLLM's Grafana
dashboards work unchanged. The names share one series: each observation is
recorded once. With API keys, the request series (tokens, requests by finish
reason, latencies) carry a `key` label: the key's name, never the key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from sluice.engine.messages import EngineStatsSnapshot
from sluice.server.observability.request_series import RequestSeries, SeriesObserver
from sluice.server.observability.tier_metrics import tier_families

CONTENT_TYPE = CONTENT_TYPE_LATEST


class _LoopMetricsCollector(Collector):
    """Exposes each model's and key's `RequestSeries` (labelled `model_name`,
    and `key` where there is one), one family per name, and the chunk count
    they imply."""

    def __init__(self, models: dict[str, ModelMetrics]):
        self._models = models

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        chunks = CounterMetricFamily(
            "sluice:chunks_sent", "Stream chunks carrying tokens.", labels=["model_name"]
        )
        for model_name, model in list(self._models.items()):
            num_chunks = 0
            for key_name, request_series in list(model.series_by_key.items()):
                labels = {"model_name": model_name}
                if key_name is not None:
                    labels["key"] = key_name
                for series in request_series.all():
                    for family in series.families(labels):
                        if family.name in merged:
                            merged[family.name].samples.extend(family.samples)
                        else:
                            merged[family.name] = family
                num_chunks += request_series.tokens_per_chunk.count
            chunks.add_metric([model_name], num_chunks)
        yield from merged.values()
        yield chunks


class EngineStatsCollector(Collector):
    """Gauges read from each running model's engine when Prometheus scrapes."""

    def __init__(self, models: dict[str, ModelMetrics]):
        self._models = models

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for model_name, model in list(self._models.items()):
            snapshot = None if model.stats is None else model.stats()
            if snapshot is None:  # not running
                continue
            for family in self._families(model_name, snapshot):
                if family.name in families:
                    families[family.name].samples.extend(family.samples)
                else:
                    families[family.name] = family
        yield from families.values()

    def _families(self, model_name: str, snapshot: EngineStatsSnapshot) -> Iterator[Metric]:
        self._model_name = model_name
        for prefix in ("sluice", "vllm"):
            yield self._gauge(f"{prefix}:num_requests_running", "Requests in the running batch.",
                              snapshot.num_running)  # fmt: skip
            yield self._gauge(f"{prefix}:num_requests_waiting",
                              "Requests waiting for admission.", snapshot.num_waiting)  # fmt: skip
            yield self._gauge(f"{prefix}:kv_cache_usage_perc", "KV cache blocks in use, 0 to 1.",
                              snapshot.kv_cache_usage)  # fmt: skip
            yield self._counter(f"{prefix}:num_preemptions",
                                "Requests preempted (their KV blocks taken back).",
                                snapshot.num_preemptions)  # fmt: skip
            # Prefix cache, in prompt tokens (hit rate = hits / queries).
            yield self._counter(f"{prefix}:prefix_cache_queries",
                                "Prompt tokens looked up in the prefix cache.",
                                snapshot.prefix_cache_queried_tokens)  # fmt: skip
            yield self._counter(f"{prefix}:prefix_cache_hits",
                                "Prompt tokens found in the prefix cache.",
                                snapshot.prefix_cache_hit_tokens)  # fmt: skip
            yield from self._speculation(prefix, snapshot)
            yield from tier_families(prefix, snapshot.kv_tiers, self._model_name)
        # sluice's own (vLLM has none): on a CPU, the KV pool's resident bytes.
        yield self._gauge("sluice:kv_cache_written_bytes",
                          "Bytes of the KV blocks ever handed out (on a CPU: the pool's "
                          "resident memory, committed as first written).",
                          snapshot.kv_cache_written_bytes)  # fmt: skip

    def _speculation(self, prefix: str, snapshot: EngineStatsSnapshot) -> Iterator[Metric]:
        """Speculative decoding, vLLM's names (acceptance rate = accepted / draft tokens)."""
        yield self._counter(f"{prefix}:spec_decode_num_drafts",
                            "Steps in which a request verified drafted tokens.",
                            snapshot.spec_decode_num_drafts)  # fmt: skip
        yield self._counter(f"{prefix}:spec_decode_num_draft_tokens", "Tokens drafted.",
                            snapshot.spec_decode_num_draft_tokens)  # fmt: skip
        yield self._counter(f"{prefix}:spec_decode_num_accepted_tokens",
                            "Drafted tokens accepted.",
                            snapshot.spec_decode_num_accepted_tokens)  # fmt: skip
        per_position = CounterMetricFamily(
            f"{prefix}:spec_decode_num_accepted_tokens_per_pos",
            "Drafted tokens accepted, by their position in the draft.",
            labels=["model_name", "position"],
        )
        for position, count in enumerate(snapshot.spec_decode_num_accepted_tokens_per_pos):
            per_position.add_metric([self._model_name, str(position)], count)
        yield per_position

    def _counter(self, name: str, documentation: str, value: float) -> CounterMetricFamily:
        counter = CounterMetricFamily(name, documentation, labels=["model_name"])
        counter.add_metric([self._model_name], value)
        return counter

    def _gauge(self, name: str, documentation: str, value: float) -> GaugeMetricFamily:
        gauge = GaugeMetricFamily(name, documentation, labels=["model_name"])
        gauge.add_metric([self._model_name], value)
        return gauge


class ModelMetrics:
    """One model's request series (per API key) and engine stats; itself the
    `RequestObserver` of its requests without a key."""

    def __init__(
        self,
        model_name: str,
        server: ServerMetrics,
        stats: Callable[[], EngineStatsSnapshot | None] | None,
        max_model_len: int | None,
    ):
        self.model_name = model_name
        # The engine's stats while it runs (None: not running, or no engine).
        self.stats = stats
        self.max_model_len = max_model_len
        self.requests_aborted = server.aborted_counter.labels(model_name)
        self.stream_write_waits = server.write_waits_counter.labels(model_name)
        self.series_by_key: dict[str | None, RequestSeries] = {}
        self._unkeyed = None if server.is_keyed else self.observer_for(None)

    def observer_for(self, key_name: str | None) -> SeriesObserver:
        """The observer of one request of `key_name` (None: no key)."""
        series = self.series_by_key.get(key_name)
        if series is None:
            series = self.series_by_key[key_name] = RequestSeries.build(self.max_model_len)
        return SeriesObserver(series, self.requests_aborted.inc)

    def _observer(self) -> SeriesObserver:
        if self._unkeyed is None:
            self._unkeyed = self.observer_for(None)
        return self._unkeyed

    def on_first_token(self, ttft_s: float, num_tokens: int) -> None:
        self._observer().on_first_token(ttft_s, num_tokens)

    def on_chunks(self, num_tokens: Sequence[int], gaps_s: Sequence[float]) -> None:
        self._observer().on_chunks(num_tokens, gaps_s)

    def on_finish(
        self,
        num_prompt_tokens: int,
        num_generation_tokens: int,
        e2e_s: float,
        finish_reason: str,
    ) -> None:
        self._observer().on_finish(num_prompt_tokens, num_generation_tokens, e2e_s, finish_reason)

    def on_abort(self) -> None:
        self.requests_aborted.inc()

    def on_end(self, num_delivered_tokens: int) -> None:
        pass  # counted per choice, at on_finish


class ServerMetrics:
    """The app's metrics, every series labelled with its `model_name`;
    `for_model(name)` is one model's observer. Built with a `model_name`, it
    is that model's observer too (a server of one model, and tests)."""

    def __init__(
        self,
        model_name: str | None = None,
        stats: Callable[[], EngineStatsSnapshot | None] | None = None,
        max_model_len: int | None = None,
        is_keyed: bool = False,
    ):
        """`stats`: the engine's (no engine series without it); `max_model_len`:
        the cap of the per-request token histograms (none without it);
        `is_keyed`: the server asks for API keys, so the request series carry
        a `key` label (each key's appear with its first request)."""
        self.registry = CollectorRegistry(auto_describe=True)
        self.is_keyed = is_keyed
        # 1. Counters the app's other parts increment.
        labels: dict[str, Any] = {"labelnames": ["model_name"], "registry": self.registry}
        self.aborted_counter = Counter(
            "sluice:request_aborted", "Requests whose client went away.", **labels
        )
        self.write_waits_counter = Counter(
            "sluice:stream_write_waits",
            "Stream events that waited for a paused connection (a client reading slowly).",
            **labels,
        )
        # 2. What the observers record on the loop, turned into families when
        # scraped, and 3. the engines' gauges and counters, read when scraped.
        self._models: dict[str, ModelMetrics] = {}
        self.registry.register(_LoopMetricsCollector(self._models))
        self.registry.register(EngineStatsCollector(self._models))
        self._default: ModelMetrics | None = None
        if model_name is not None:
            self._default = self.for_model(model_name, stats, max_model_len)

    def for_model(
        self,
        model_name: str,
        stats: Callable[[], EngineStatsSnapshot | None] | None = None,
        max_model_len: int | None = None,
    ) -> ModelMetrics:
        """Model `model_name`'s metrics (made on first call; later calls return them)."""
        model = self._models.get(model_name)
        if model is None:
            model = self._models[model_name] = ModelMetrics(model_name, self, stats, max_model_len)
        return model

    @property
    def model(self) -> ModelMetrics:
        assert self._default is not None, "a ServerMetrics built without a model_name"
        return self._default

    # -- one model's, for a server of one model ----------------------------------

    @property
    def requests_aborted(self) -> Any:
        return self.model.requests_aborted

    @property
    def stream_write_waits(self) -> Any:
        return self.model.stream_write_waits

    def observer_for(self, key_name: str | None) -> SeriesObserver:
        return self.model.observer_for(key_name)

    def on_first_token(self, ttft_s: float, num_tokens: int) -> None:
        self.model.on_first_token(ttft_s, num_tokens)

    def on_chunks(self, num_tokens: Sequence[int], gaps_s: Sequence[float]) -> None:
        self.model.on_chunks(num_tokens, gaps_s)

    def on_finish(
        self,
        num_prompt_tokens: int,
        num_generation_tokens: int,
        e2e_s: float,
        finish_reason: str,
    ) -> None:
        self.model.on_finish(num_prompt_tokens, num_generation_tokens, e2e_s, finish_reason)

    def on_abort(self) -> None:
        self.model.on_abort()

    def on_end(self, num_delivered_tokens: int) -> None:
        self.model.on_end(num_delivered_tokens)

    # -- exposition ----------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text exposition of this app's registry."""
        return generate_latest(self.registry)
