"""/metrics under vLLM's names, after real requests: the types, the label and
the buckets vLLM's Grafana dashboards expect (vllm/v1/metrics/buckets.py)."""

from __future__ import annotations

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer

# vLLM's defaults, written out here as facts (not imported from sluice).
VLLM_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                     2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
VLLM_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                    5.0, 7.5, 10.0, 20.0, 40.0, 80.0]  # fmt: skip
VLLM_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                        50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip
MAX_MODEL_LEN = 4096
VLLM_REQUEST_TOKENS_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]

# The engine's series (gauges, preemptions) are typed in test_server_metrics.py.
TYPES = {
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
}


@pytest.fixture(scope="module")
def families():
    """The /metrics families after two completions of 4 tokens and one of 6."""
    engine = LoopFakeEngine(tokens_per_step=1)
    with LiveServer(engine, ChatFakeTokenizer(), max_model_len=MAX_MODEL_LEN) as live:
        http = httpx2.Client(base_url=live.url, timeout=10)
        for max_tokens, stream in ((4, False), (4, True), (6, True)):
            body = {"model": MODEL, "prompt": "a b c", "max_tokens": max_tokens,
                    "stream": stream, "ignore_eos": True}  # fmt: skip
            assert http.post("/v1/completions", json=body).status_code == 200
        text = http.get("/metrics").text
        http.close()
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample_value(family, suffix: str = "", **labels) -> float:
    for sample in family.samples:
        if sample.name == family.name + suffix and all(
            sample.labels.get(key) == value for key, value in labels.items()
        ):
            return sample.value
    raise AssertionError(f"no sample {family.name}{suffix} {labels}")


def bucket_bounds(family) -> list[float]:
    bounds = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
    assert bounds[-1] == float("inf")
    return bounds[:-1]


def test_vllm_series_have_vllms_types_and_the_model_name_label(families):
    for name, kind in TYPES.items():
        assert families[name].type == kind, name
        assert {s.labels["model_name"] for s in families[name].samples} == {MODEL}


def test_vllm_histograms_have_vllms_buckets(families):
    assert bucket_bounds(families["vllm:time_to_first_token_seconds"]) == VLLM_TTFT_BUCKETS
    assert bucket_bounds(families["vllm:inter_token_latency_seconds"]) == VLLM_ITL_BUCKETS
    assert bucket_bounds(families["vllm:time_per_output_token_seconds"]) == VLLM_ITL_BUCKETS
    assert bucket_bounds(families["vllm:e2e_request_latency_seconds"]) == VLLM_LATENCY_BUCKETS
    for name in ("vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
        assert bucket_bounds(families[name]) == VLLM_REQUEST_TOKENS_BUCKETS


def test_vllm_counts_match_the_requests_served(families):
    assert sample_value(families["vllm:generation_tokens"], "_total") == 4 + 4 + 6
    success = families["vllm:request_success"]
    assert sample_value(success, "_total", finished_reason="length") == 3
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_generation_tokens"):  # fmt: skip
        assert sample_value(families[name], "_count") == 3
    assert sample_value(families["vllm:request_generation_tokens"], "_sum") == 14
    # One gap per token after each request's first chunk, in both names.
    itl_count = sample_value(families["vllm:inter_token_latency_seconds"], "_count")
    assert itl_count == sample_value(families["sluice:inter_token_latency_seconds"], "_count")
    assert itl_count <= 3 + 3 + 5
    prompt_tokens = sample_value(families["vllm:prompt_tokens"], "_total")
    assert prompt_tokens == sample_value(families["sluice:prompt_tokens"], "_total") > 0


def test_with_n_choices_latencies_are_per_choice_as_each_choices_client_sees_them():
    """n=4: vLLM times each choice as its own engine request. Each choice's
    inter-token gaps add up to its e2e latency minus its time to first token
    (the finish comes with the last token), so the sums must agree; timed per
    API request, the gaps summed to a quarter of that (all choices' tokens of
    a take spread over one gap)."""
    engine = LoopFakeEngine(tokens_per_step=1, step_interval_s=0.01)
    with LiveServer(engine, ChatFakeTokenizer(), max_model_len=MAX_MODEL_LEN) as live:
        http = httpx2.Client(base_url=live.url, timeout=10)
        body = {"model": MODEL, "prompt": "a b c", "max_tokens": 6, "n": 4, "stream": True,
                "ignore_eos": True}  # fmt: skip
        assert http.post("/v1/completions", json=body).status_code == 200
        text = http.get("/metrics").text
        http.close()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    ttft, e2e = (
        families["vllm:time_to_first_token_seconds"],
        families["vllm:e2e_request_latency_seconds"],
    )
    itl = families["vllm:inter_token_latency_seconds"]
    assert sample_value(ttft, "_count") == sample_value(e2e, "_count") == 4
    assert sample_value(itl, "_count") <= 4 * 5  # fewer where a reader's take merged tokens
    gaps_s = sample_value(e2e, "_sum") - sample_value(ttft, "_sum")
    assert gaps_s > 4 * 5 * 0.005  # 20 gaps of about one step interval each
    assert sample_value(itl, "_sum") == pytest.approx(gaps_s, rel=1e-6)
