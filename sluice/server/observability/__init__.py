"""What the HTTP edge shows of itself: Prometheus metrics (metrics.py over
loop_series.py, request_series.py, read_metrics.py, tier_metrics.py,
metric_buckets.py), the access log (access_log.py), the trace's server span
(request_spans.py), the event loop's lag (loop_watchdog.py) and the
replicas on /health and /metrics (replicas.py). Imports nothing of its package."""
