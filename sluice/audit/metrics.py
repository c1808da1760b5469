"""Measurements, recomputed from the recorded exchanges: time to first token,
inter-token latency (gaps between chunks of one choice that carry text), end-to-end
latency, output tokens/s, chunks/s and tokens per chunk; per scenario and in
total, per target.

Latencies come from streams read normally (slow and abandoning readers time
themselves, not the server). Token counts come from, in order: the final
usage chunk, logprob entries, the non-streamed twin's usage, and, failing
all, one token per chunk. An agent-API stream's chunks are its delta
events, its tokens the output_tokens of its last usage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.audit.agent_events import delta_times_s, output_tokens
from sluice.audit.checks.exchange import ensure_view
from sluice.audit.records import AGENT_ENDPOINTS, Exchange, ScenarioResult
from sluice.audit.stream_view import ChoiceChunk


@dataclass(slots=True)
class Percentiles:
    count: int
    p50: float | None
    p90: float | None
    p99: float | None


@dataclass(slots=True)
class StreamSample:
    """What one streamed response measured."""

    is_latency_sample: bool
    ttft_s: float | None
    itl_s: list[float]
    e2e_s: float
    output_tokens: int
    # Per chunk carrying text: arrival time and tokens (None when unknown).
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int | None] = field(default_factory=list)


@dataclass(slots=True)
class ScenarioMetrics:
    requests: int
    errors: int
    output_tokens: int
    content_chunks: int
    wall_s: float
    ttft_s: Percentiles
    itl_s: Percentiles
    e2e_s: Percentiles
    output_tokens_per_s: float
    chunks_per_s: float
    # Mean over chunks whose token count is known; None when none is.
    tokens_per_chunk: float | None


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Linear interpolation between closest ranks."""
    assert sorted_values, "percentile of nothing"
    position = fraction * (len(sorted_values) - 1)
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def percentiles(values: list[float]) -> Percentiles:
    if not values:
        return Percentiles(0, None, None, None)
    ordered = sorted(values)
    return Percentiles(len(ordered), *(percentile(ordered, f) for f in (0.5, 0.9, 0.99)))


def is_error(exchange: Exchange) -> bool:
    if exchange.expects_error or exchange.reader == "abandon":
        return False
    if not exchange.is_ok:
        return True
    return any(chunk.is_error for chunk in ensure_view(exchange).chunks)


def sample_stream(exchange: Exchange) -> StreamSample | None:
    if not exchange.is_stream or not exchange.is_ok or exchange.reader == "abandon":
        return None
    if exchange.endpoint in AGENT_ENDPOINTS:
        return _agent_sample(exchange)
    view = ensure_view(exchange)
    times, tokens, gaps = [], [], []
    for chunks in view.choices.values():
        index_times = []
        for position, chunk in enumerate(chunks):
            if chunk.text:
                index_times.append(chunk.time_s)
                tokens.append(_chunk_tokens(chunks, position))
        # Gaps within one choice: with n > 1 choices interleave, and their
        # chunks arriving together are not a zero inter-token latency.
        gaps += [
            later - earlier for earlier, later in zip(index_times, index_times[1:], strict=False)
        ]
        times += index_times
    order = sorted(range(len(times)), key=times.__getitem__)
    times, tokens = [times[i] for i in order], [tokens[i] for i in order]
    return StreamSample(
        is_latency_sample=exchange.reader == "normal",
        ttft_s=times[0] - exchange.sent_s if times else None,
        itl_s=gaps,
        e2e_s=exchange.end_s - exchange.sent_s,
        output_tokens=_output_tokens(exchange, tokens),
        chunk_times_s=times,
        chunk_tokens=tokens,
    )


def _agent_sample(exchange: Exchange) -> StreamSample:
    """An agent-API stream: its delta events are its chunks (tokens per event unknown)."""
    times = delta_times_s(exchange)
    return StreamSample(
        is_latency_sample=exchange.reader == "normal",
        ttft_s=times[0] - exchange.sent_s if times else None,
        itl_s=[later - earlier for earlier, later in zip(times, times[1:], strict=False)],
        e2e_s=exchange.end_s - exchange.sent_s,
        output_tokens=output_tokens(exchange),
        chunk_times_s=times,
        chunk_tokens=[None] * len(times),
    )


def _chunk_tokens(chunks: list[ChoiceChunk], position: int) -> int | None:
    """Tokens in a chunk: its logprob entries, else the step of continuous usage."""
    chunk = chunks[position]
    if chunk.logprobs is not None:
        return len(chunk.logprobs)
    previous = chunks[position - 1].usage if position > 0 else None
    if chunk.usage is None or previous is None:
        return None
    now, before = chunk.usage.get("completion_tokens"), previous.get("completion_tokens")
    if not isinstance(now, int) or not isinstance(before, int) or now <= before:
        return None
    return now - before


def _output_tokens(exchange: Exchange, chunk_tokens: list[int | None]) -> int:
    view = ensure_view(exchange)
    finals = [chunk.usage for chunk in view.chunks if chunk.num_choices == 0 and chunk.usage]
    if finals and isinstance(finals[-1].get("completion_tokens"), int):
        return finals[-1]["completion_tokens"]
    if chunk_tokens and all(count is not None for count in chunk_tokens):
        return sum(chunk_tokens)
    twin = exchange.twin
    if twin is not None and twin.is_ok:
        usage = ensure_view(twin).chunks[0].usage if ensure_view(twin).chunks else None
        if usage and isinstance(usage.get("completion_tokens"), int):
            return usage["completion_tokens"]
    return len(chunk_tokens)


def _count_requests(results: list[ScenarioResult]) -> int:
    """HTTP requests sent: every exchange and every distinct twin."""
    twins = {id(e.twin) for r in results for e in r.exchanges if e.twin is not None}
    return sum(len(r.exchanges) for r in results) + len(twins)


def samples_of(results: list[ScenarioResult]) -> list[StreamSample]:
    return [s for r in results for e in r.exchanges if (s := sample_stream(e)) is not None]


def summarize(results: list[ScenarioResult]) -> ScenarioMetrics:
    """Metrics over one or more scenario results (of one target)."""
    samples = samples_of(results)
    latency = [s for s in samples if s.is_latency_sample]
    wall_s = sum(r.finished_s - r.started_s for r in results)
    output_tokens = sum(s.output_tokens for s in samples)
    content_chunks = sum(len(s.chunk_times_s) for s in samples)
    known = [count for s in samples for count in s.chunk_tokens if count is not None]
    return ScenarioMetrics(
        requests=_count_requests(results),
        errors=sum(is_error(e) for r in results for e in r.exchanges),
        output_tokens=output_tokens,
        content_chunks=content_chunks,
        wall_s=wall_s,
        ttft_s=percentiles([s.ttft_s for s in latency if s.ttft_s is not None]),
        itl_s=percentiles([gap for s in latency for gap in s.itl_s]),
        e2e_s=percentiles([s.e2e_s for s in latency]),
        output_tokens_per_s=output_tokens / wall_s if wall_s > 0 else 0.0,
        chunks_per_s=content_chunks / wall_s if wall_s > 0 else 0.0,
        tokens_per_chunk=sum(known) / len(known) if known else None,
    )


@dataclass(slots=True)
class Timeline:
    bin_s: float
    # Start of each bin, seconds since the audit started.
    starts_s: list[float]
    tokens_per_s: list[float]


def throughput_timeline(
    results: list[ScenarioResult], end_s: float, num_bins: int = 60
) -> Timeline:
    """Output tokens per second over the whole run (unknown chunk sizes count as 1)."""
    bin_s = max(end_s / num_bins, 0.05)
    count = int(end_s / bin_s) + 1
    tokens = [0.0] * count
    for sample in samples_of(results):
        for time_s, chunk_tokens in zip(sample.chunk_times_s, sample.chunk_tokens, strict=True):
            tokens[min(int(time_s / bin_s), count - 1)] += chunk_tokens or 1
    return Timeline(bin_s, [i * bin_s for i in range(count)], [t / bin_s for t in tokens])


def tokens_per_chunk_counts(results: list[ScenarioResult]) -> dict[int, int]:
    """Histogram: tokens in a chunk -> number of chunks (known counts only)."""
    histogram: dict[int, int] = {}
    for sample in samples_of(results):
        for count in sample.chunk_tokens:
            if count is not None:
                histogram[count] = histogram.get(count, 0) + 1
    return dict(sorted(histogram.items()))
