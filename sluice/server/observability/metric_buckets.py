"""Histogram bucket bounds: vLLM's, so its Grafana dashboards read sluice unchanged.

The values are vLLM's defaults (vllm/v1/metrics/buckets.py, vLLM 0.32, the
version in /work/peers/vllm): the same bounds under the same names make every
`histogram_quantile` panel of a vLLM dashboard compute the same thing here.
Only `TOKENS_PER_CHUNK_BUCKETS` is sluice's own (vLLM has no such series).
"""

from __future__ import annotations

# vLLM's "time_to_first_token" family.
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                  2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
# vLLM's "inter_token_latency" family.
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
# vLLM's "request_latency" family (e2e and queue time).
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                             40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
                             7680.0)  # fmt: skip
TOKENS_PER_CHUNK_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256)


def request_tokens_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's "request_tokens" family: 1, 2, 5, 10, 20, 50, ... up to `max_model_len`."""
    bounds: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(bounds)
            bounds.append(mantissa * scale)
        scale *= 10
