"""Measurements recomputed from recorded exchanges."""

from __future__ import annotations

import pytest

from sluice.audit.metrics import (
    percentile,
    percentiles,
    sample_stream,
    summarize,
    throughput_timeline,
    tokens_per_chunk_counts,
)
from sluice.audit.records import COMPLETIONS, MESSAGES, ScenarioResult
from tests.agent_script import encode
from tests.broken_servers import completion_chunk, recorded, sse, usage_chunk

BODY = {
    "model": "m",
    "prompt": "p",
    "stream": True,
    "stream_options": {"include_usage": True},
    "logprobs": 0,
}


def lp(count: int) -> dict:
    return {
        "tokens": ["t"] * count,
        "token_logprobs": [-0.1] * count,
        "top_logprobs": [{}] * count,
        "text_offset": [0] * count,
    }


def timed_stream(times_s: list[float], sizes: list[int], **fields):
    """A stream whose chunk k (k tokens each per `sizes`) arrives at times_s[k]."""
    chunks = [
        completion_chunk(
            0, "t" * size, "length" if i == len(sizes) - 1 else None, logprobs=lp(size)
        )
        for i, size in enumerate(sizes)
    ]
    chunks.append(usage_chunk("completion", 1, sum(sizes)))
    events = [sse(chunk, done=False) for chunk in chunks] + [b"data: [DONE]\n\n"]
    exchange = recorded(COMPLETIONS, BODY, b"".join(events), **fields)
    exchange.arrival_offsets = [sum(len(e) for e in events[: i + 1]) for i in range(len(events))]
    exchange.arrival_times_s = [*times_s, times_s[-1], times_s[-1]]
    exchange.sent_s, exchange.end_s = 0.0, times_s[-1]
    return exchange


def test_percentiles_interpolate_between_ranks():
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentiles([]).p50 is None
    values = percentiles([float(v) for v in range(101)])
    assert (values.p50, values.p90, values.p99, values.count) == (50.0, 90.0, 99.0, 101)


def test_a_stream_yields_ttft_inter_chunk_gaps_and_tokens_per_chunk():
    sample = sample_stream(timed_stream([0.2, 0.3, 0.6], [1, 2, 3]))
    assert sample.ttft_s == pytest.approx(0.2)
    assert sample.itl_s == pytest.approx([0.1, 0.3])
    assert sample.chunk_tokens == [1, 2, 3]
    assert sample.output_tokens == 6
    assert sample.e2e_s == pytest.approx(0.6)


def test_slow_readers_count_for_throughput_but_not_for_latency():
    normal = timed_stream([0.1, 0.2], [2, 2])
    slow = timed_stream([1.0, 2.0], [2, 2], reader="slow")
    result = ScenarioResult("lag", "server", 0.0, 2.0, exchanges=[normal, slow])
    metrics = summarize([result])
    assert metrics.e2e_s.count == 1 and metrics.e2e_s.p50 == pytest.approx(0.2)
    assert metrics.output_tokens == 8
    assert metrics.output_tokens_per_s == pytest.approx(4.0)
    assert metrics.tokens_per_chunk == pytest.approx(2.0)


def test_failed_requests_count_as_errors_unless_an_error_was_the_point():
    failed = recorded(COMPLETIONS, {"model": "m"}, b"{}", status=500)
    expected = recorded(COMPLETIONS, {"model": "m"}, b"{}", status=400, expects_error=True)
    result = ScenarioResult("bad_inputs", "server", 0.0, 1.0, exchanges=[failed, expected])
    assert summarize([result]).errors == 1


def test_timeline_and_histogram_place_every_token():
    result = ScenarioResult(
        "lag", "server", 0.0, 1.0, exchanges=[timed_stream([0.05, 0.55], [1, 3])]
    )
    timeline = throughput_timeline([result], end_s=1.0, num_bins=2)
    assert timeline.bin_s == 0.5
    assert timeline.tokens_per_s[:2] == [2.0, 6.0]
    assert tokens_per_chunk_counts([result]) == {1: 1, 3: 1}


def test_inter_token_gaps_are_measured_within_each_choice():
    body = {"model": "m", "prompt": ["a", "b"], "stream": True}
    chunks = [
        completion_chunk(0, "x"),
        completion_chunk(1, "y"),
        completion_chunk(0, "x", "length"),
        completion_chunk(1, "y", "length"),
    ]
    events = [sse(chunk, done=False) for chunk in chunks] + [b"data: [DONE]\n\n"]
    exchange = recorded(COMPLETIONS, body, b"".join(events))
    # Both choices' chunks arrive together, twice: 0.1 s apart.
    exchange.arrival_offsets = [len(b"".join(events[:2])), len(b"".join(events))]
    exchange.arrival_times_s = [0.1, 0.2]
    sample = sample_stream(exchange)
    assert sample.itl_s == pytest.approx([0.1, 0.1])


def test_an_agent_api_stream_is_timed_by_its_delta_events_and_counted_by_its_usage():
    events = [
        {"type": "message_start", "message": {"content": [], "usage": {"input_tokens": 3}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "a"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "b"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
         "usage": {"output_tokens": 5}},
        {"type": "message_stop"},
    ]  # fmt: skip
    pieces = [encode(event) for event in events]
    body = {"model": "m", "max_tokens": 8, "stream": True, "messages": []}
    exchange = recorded(MESSAGES, body, b"".join(pieces), sent_s=0.0, end_s=1.0)
    exchange.arrival_offsets = [sum(len(p) for p in pieces[: i + 1]) for i in range(len(pieces))]
    exchange.arrival_times_s = [0.1 * (i + 1) for i in range(len(pieces))]
    sample = sample_stream(exchange)
    assert sample is not None and sample.output_tokens == 5
    assert sample.ttft_s == pytest.approx(0.3) and sample.itl_s == [pytest.approx(0.1)]
