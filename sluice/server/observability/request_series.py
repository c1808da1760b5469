"""What the metrics record of requests on the event loop: one `RequestSeries`
(tokens, finish reasons, latencies, chunk sizes) per model and API key, and
the `SeriesObserver` that records one request into it. The series are plain
numbers updated without locks (loop_series.py), turned into Prometheus
families only when scraped (metrics.py). Every series carries sluice's name
and vLLM's (`sluice:x` and `vllm:x`) with vLLM's buckets (metric_buckets.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from sluice.server.observability.loop_series import LoopCounter, LoopHistogram
from sluice.server.observability.metric_buckets import (
    ITL_BUCKETS_S,
    REQUEST_LATENCY_BUCKETS_S,
    TOKENS_PER_CHUNK_BUCKETS,
    TTFT_BUCKETS_S,
    request_tokens_buckets,
)


def _both(name: str) -> tuple[str, str]:
    """sluice's name and vLLM's for one series."""
    return (f"sluice:{name}", f"vllm:{name}")


@dataclass(slots=True)
class RequestSeries:
    """What the observer records of requests, on the event loop."""

    # Tokens of finished requests, and finished requests by finish reason.
    prompt_tokens: LoopCounter
    generation_tokens: LoopCounter
    request_success: LoopCounter
    # Latencies of each choice, as its client sees them.
    ttft_s: LoopHistogram
    itl_s: LoopHistogram
    e2e_s: LoopHistogram
    tokens_per_chunk: LoopHistogram
    # Per-request token counts, bucketed up to the context length (None without one).
    request_prompt_tokens: LoopHistogram | None
    request_generation_tokens: LoopHistogram | None

    @classmethod
    def build(cls, max_model_len: int | None) -> RequestSeries:
        return cls(
            LoopCounter(_both("prompt_tokens"), "Prompt tokens of finished requests."),
            LoopCounter(_both("generation_tokens"), "Generated tokens delivered."),
            LoopCounter(_both("request_success"), "Finished requests by finish reason.",
                        "finished_reason"),
            LoopHistogram(_both("time_to_first_token_seconds"),
                          "Time to each choice's first token.", TTFT_BUCKETS_S),
            LoopHistogram((*_both("inter_token_latency_seconds"),
                           "vllm:time_per_output_token_seconds"),
                          "Time between one choice's tokens (a chunk's gap spread over its "
                          "tokens).", ITL_BUCKETS_S),
            LoopHistogram(_both("e2e_request_latency_seconds"),
                          "Request latency, arrival to finish.", REQUEST_LATENCY_BUCKETS_S),
            LoopHistogram(("sluice:tokens_per_chunk",), "Tokens coalesced into one chunk.",
                          TOKENS_PER_CHUNK_BUCKETS),
            *_request_token_histograms(max_model_len),
        )  # fmt: skip

    def all(self) -> list[LoopHistogram | LoopCounter]:
        """Every series there is, in exposition order."""
        every = (getattr(self, series_field.name) for series_field in fields(self))
        return [series for series in every if series is not None]


def _request_token_histograms(
    max_model_len: int | None,
) -> tuple[LoopHistogram | None, LoopHistogram | None]:
    """Prompt and generated tokens per finished request; none without a context length."""
    if max_model_len is None:
        return None, None
    bounds = request_tokens_buckets(max_model_len)
    return (
        LoopHistogram(_both("request_prompt_tokens"), "Prompt tokens per finished request.",
                      bounds),
        LoopHistogram(_both("request_generation_tokens"),
                      "Generated tokens per finished request.", bounds),
    )  # fmt: skip


class SeriesObserver:
    """A `RequestObserver` recording into one `RequestSeries`: one API key's,
    or the app's when it has no keys."""

    __slots__ = ("series", "_on_abort")

    def __init__(self, series: RequestSeries, on_abort: Callable[[], None]):
        self.series = series
        self._on_abort = on_abort

    def on_first_token(self, ttft_s: float, num_tokens: int) -> None:
        self.series.ttft_s.observe(ttft_s)
        self.series.tokens_per_chunk.observe(num_tokens)

    def on_chunks(self, num_tokens: Sequence[int], gaps_s: Sequence[float]) -> None:
        self.series.tokens_per_chunk.observe_all(num_tokens)
        # A chunk of k tokens after a gap counts as k tokens each gap/k apart.
        per_token_s = [gap_s / k for gap_s, k in zip(gaps_s, num_tokens, strict=True)]
        self.series.itl_s.observe_all(per_token_s, num_tokens)

    def on_finish(
        self,
        num_prompt_tokens: int,
        num_generation_tokens: int,
        e2e_s: float,
        finish_reason: str,
    ) -> None:
        series = self.series
        series.prompt_tokens.inc(num_prompt_tokens)
        series.generation_tokens.inc(num_generation_tokens)
        series.e2e_s.observe(e2e_s)
        series.request_success.inc(1, finish_reason)
        if series.request_prompt_tokens is not None:
            series.request_prompt_tokens.observe(num_prompt_tokens)
        if series.request_generation_tokens is not None:
            series.request_generation_tokens.observe(num_generation_tokens)

    def on_abort(self) -> None:
        self._on_abort()

    def on_end(self, num_delivered_tokens: int) -> None:
        pass  # counted per choice, at on_finish
