"""Prometheus metrics: observer calls become series; engine gauges read at scrape."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from sluice.server.observability.metrics import ServerMetrics


@dataclass
class Stats:
    num_running: int = 3
    num_waiting: int = 7
    kv_cache_usage: float = 0.25
    kv_cache_written_bytes: int = 3 << 20
    prefix_cache_queried_tokens: int = 40
    prefix_cache_hit_tokens: int = 32
    num_preemptions: int = 2
    spec_decode_num_drafts: int = 5
    spec_decode_num_draft_tokens: int = 20
    spec_decode_num_accepted_tokens: int = 9
    spec_decode_num_accepted_tokens_per_pos: tuple[int, ...] = (5, 3, 1, 0)
    kv_tiers: None = None  # an engine without prefix-cache tiers (EngineStatsSnapshot's field)


def samples(metrics: ServerMetrics) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, from the exposition text."""
    text = metrics.render().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(metrics: ServerMetrics, name: str, **labels) -> float:
    return samples(metrics)[(name, tuple(sorted({"model_name": "m", **labels}.items())))]


def test_engine_gauges_are_read_from_the_stats_callable_at_scrape_time():
    stats = Stats()
    metrics = ServerMetrics("m", lambda: stats)
    assert value(metrics, "sluice:num_requests_running") == 3
    stats.num_waiting = 11
    assert value(metrics, "sluice:num_requests_waiting") == 11
    assert value(metrics, "sluice:kv_cache_usage_perc") == 0.25
    assert value(metrics, "sluice:kv_cache_written_bytes") == 3 << 20
    for prefix in ("sluice", "vllm"):  # vLLM's names too, for its dashboards
        assert value(metrics, f"{prefix}:num_requests_running") == 3
        assert value(metrics, f"{prefix}:num_preemptions_total") == 2
        assert value(metrics, f"{prefix}:prefix_cache_queries_total") == 40
        assert value(metrics, f"{prefix}:prefix_cache_hits_total") == 32


def test_engine_series_have_vllms_types():
    text = ServerMetrics("m", lambda: Stats()).render().decode()
    types = {family.name: family.type for family in text_string_to_metric_families(text)}
    for prefix in ("sluice", "vllm"):
        for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
            assert types[f"{prefix}:{name}"] == "gauge"
        for name in ("num_preemptions", "prefix_cache_queries", "prefix_cache_hits"):
            assert types[f"{prefix}:{name}"] == "counter"


def test_speculative_decoding_counters_have_vllms_names_and_positions():
    metrics = ServerMetrics("m", lambda: Stats())
    for prefix in ("sluice", "vllm"):
        assert value(metrics, f"{prefix}:spec_decode_num_drafts_total") == 5
        assert value(metrics, f"{prefix}:spec_decode_num_draft_tokens_total") == 20
        assert value(metrics, f"{prefix}:spec_decode_num_accepted_tokens_total") == 9
        per_position = [
            value(metrics, f"{prefix}:spec_decode_num_accepted_tokens_per_pos_total", position=p)
            for p in ("0", "1", "2", "3")
        ]
        assert per_position == [5, 3, 1, 0]


def test_without_stats_there_are_no_engine_gauges():
    names = {name for name, _ in samples(ServerMetrics("m"))}
    assert "sluice:num_requests_running" not in names


def test_finished_requests_count_tokens_latency_and_reason():
    metrics = ServerMetrics("m")
    metrics.on_finish(10, 5, 0.7, "stop")
    metrics.on_finish(4, 16, 1.2, "length")
    assert value(metrics, "sluice:prompt_tokens_total") == 14
    assert value(metrics, "sluice:generation_tokens_total") == 21
    assert value(metrics, "sluice:e2e_request_latency_seconds_count") == 2
    assert value(metrics, "sluice:request_success_total", finished_reason="length") == 1


def test_chunks_feed_tokens_per_chunk_and_spread_their_gap_over_their_tokens():
    metrics = ServerMetrics("m")
    metrics.on_first_token(0.5, 2)  # the first chunk: its gap is the TTFT, not an ITL
    metrics.on_chunks([4], [0.2])
    assert value(metrics, "sluice:time_to_first_token_seconds_count") == 1
    assert value(metrics, "sluice:chunks_sent_total") == 2
    assert value(metrics, "sluice:tokens_per_chunk_sum") == 6
    assert value(metrics, "sluice:inter_token_latency_seconds_count") == 4
    assert abs(value(metrics, "sluice:inter_token_latency_seconds_sum") - 0.2) < 1e-9


def test_histogram_buckets_are_cumulative_and_inclusive_of_their_bound():
    metrics = ServerMetrics("m")
    metrics.on_chunks([4, 1], [0.04, 3.0])  # 4 tokens 10 ms apart: on the 0.01 bound
    itl = "sluice:inter_token_latency_seconds_bucket"
    assert value(metrics, itl, le="0.01") == 4
    assert value(metrics, itl, le="2.5") == 4
    assert value(metrics, itl, le="5.0") == 5
    assert value(metrics, itl, le="+Inf") == 5
    assert value(metrics, "sluice:tokens_per_chunk_bucket", le="1.0") == 1
    assert value(metrics, "sluice:tokens_per_chunk_bucket", le="4.0") == 2


def test_aborts_are_counted():
    metrics = ServerMetrics("m")
    metrics.on_abort()
    metrics.on_abort()
    assert value(metrics, "sluice:request_aborted_total") == 2


def test_two_apps_in_one_process_keep_separate_registries():
    first, second = ServerMetrics("m"), ServerMetrics("m")
    first.on_abort()
    assert value(first, "sluice:request_aborted_total") == 1
    assert value(second, "sluice:request_aborted_total") == 0


def test_vllm_names_read_the_same_series_as_sluice_names():
    metrics = ServerMetrics("m", max_model_len=2048)
    metrics.on_first_token(0.3, 1)
    metrics.on_chunks([1, 2], [0.05, 0.1])
    metrics.on_finish(12, 3, 0.9, "stop")
    pairs = [
        ("time_to_first_token_seconds_count", 1),
        ("inter_token_latency_seconds_count", 3),
        ("e2e_request_latency_seconds_sum", 0.9),
        ("prompt_tokens_total", 12),
        ("generation_tokens_total", 3),
        ("request_prompt_tokens_sum", 12),
        ("request_generation_tokens_count", 1),
    ]
    for suffix, expected in pairs:
        assert value(metrics, f"sluice:{suffix}") == value(metrics, f"vllm:{suffix}") == expected
    assert value(metrics, "vllm:request_success_total", finished_reason="stop") == 1
    # vLLM's older name of the inter-token latency.
    assert value(metrics, "vllm:time_per_output_token_seconds_count") == 3


def test_request_token_histograms_use_vllms_1_2_5_buckets_up_to_the_context_length():
    metrics = ServerMetrics("m", max_model_len=2048)
    metrics.on_finish(120, 7, 0.5, "length")
    bounds = [
        labels["le"]
        for (name, labels_items) in samples(metrics)
        if name == "vllm:request_prompt_tokens_bucket"
        for labels in [dict(labels_items)]
    ]
    assert bounds == ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0",
                      "1000.0", "2000.0", "+Inf"]  # fmt: skip
    assert value(metrics, "vllm:request_prompt_tokens_bucket", le="100.0") == 0
    assert value(metrics, "vllm:request_prompt_tokens_bucket", le="200.0") == 1


def test_the_kernel_plan_is_an_info_metric_once_the_engine_reports_it():
    import httpx2

    from sluice.engine.messages import EngineReady
    from sluice.testing.fake_engine import FakeEngine
    from sluice.testing.fake_tokenizer import ChatFakeTokenizer
    from sluice.testing.live_server import LiveServer

    plan = "kernel plan (cached): prefill attention native below 1024 tokens, torch from 1024"
    engine = FakeEngine()
    engine.info = EngineReady("m", 256, 8, 16, 512, kernel_plan=plan)
    with LiveServer(engine, ChatFakeTokenizer(), model_name="m", max_model_len=256) as live:
        text = httpx2.get(f"{live.url}/metrics", timeout=10).text
    # Prometheus's text format writes an info metric as a gauge of 1.
    families = text_string_to_metric_families(text)
    (family,) = [f for f in families if f.name == "sluice:kernel_plan_info"]
    (sample,) = family.samples
    assert sample.name == "sluice:kernel_plan_info" and sample.value == 1.0
    assert sample.labels == {"model_name": "m", "plan": plan}
    # An engine that reports no plan (another device): no such series.
    engine = FakeEngine()
    with LiveServer(engine, ChatFakeTokenizer(), model_name="m", max_model_len=256) as live:
        assert "kernel_plan" not in httpx2.get(f"{live.url}/metrics", timeout=10).text
