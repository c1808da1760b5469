"""Tracing off costs nothing per token, counted rather than timed.

A profile hook on the server's threads (the event loop's and the in-process
engine's, which runs the engine process's `EngineCore.step`) counts every
Python call into sluice's tracing modules and into OpenTelemetry while
streamed requests run through the app on the tiny model. Off, there is none
in a whole request, so none per token. On, the same count grows with the
tokens (the engine's spans see every step, the request's trace every chunk):
the instrument sees per-token tracing work wherever those modules do it.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import httpx2
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import sluice
from sluice.config import CacheConfig, EngineConfig, ModelConfig
from sluice.engine.core import EngineCore
from sluice.engine.inproc_client import InProcessEngineClient
from sluice.server.http.launch import describe_model
from sluice.testing.live_server import LiveServer

SLUICE = Path(sluice.__file__).parent
TRACING_FILES = frozenset(str(SLUICE / name) for name in
                          ("tracing.py", "server/observability/request_spans.py", "engine/engine_spans.py"))  # fmt: skip
OPENTELEMETRY = "/opentelemetry/"
SHORT, LONG = 8, 40


class TracingCalls:
    """A profile hook: counts calls into tracing code while `is_counting`,
    by (who called it in: "sluice" or the package outside OpenTelemetry that
    called the API, the file, the function)."""

    def __init__(self) -> None:
        self.is_counting = False
        self.calls: Counter[tuple[str, str, str]] = Counter()

    def __call__(self, frame, event: str, arg) -> None:
        if event != "call" or not self.is_counting:
            return
        filename = frame.f_code.co_filename
        if filename in TRACING_FILES:
            self.calls["sluice", Path(filename).name, frame.f_code.co_name] += 1
        elif OPENTELEMETRY in filename:
            caller = frame.f_back
            while caller is not None and OPENTELEMETRY in caller.f_code.co_filename:
                caller = caller.f_back
            self.calls[package_of(caller), Path(filename).name, frame.f_code.co_name] += 1

    def during(self, action) -> Counter[tuple[str, str, str]]:
        self.calls.clear()
        self.is_counting = True
        try:
            action()
        finally:
            self.is_counting = False
        return Counter(self.calls)


def package_of(frame) -> str:
    if frame is None:
        return "?"
    path = Path(frame.f_code.co_filename)
    if path.is_relative_to(SLUICE):
        return "sluice"
    if "site-packages" in path.parts:
        return path.parts[path.parts.index("site-packages") + 1]
    return str(path)


def stream(live: LiveServer, max_tokens: int) -> None:
    body = {"prompt": "hello", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    response = httpx2.post(f"{live.url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
    assert f'"completion_tokens":{max_tokens},' in response.text


def calls_per_request(tiny_folder, tracer) -> list[Counter[tuple[str, str]]]:
    """Tracing calls of a SHORT then a LONG stream, on a server with `tracer`."""
    model = ModelConfig(model=str(tiny_folder), dtype="float32", quantization=None,
                        activation_quantization=None, max_model_len=256)  # fmt: skip
    # One token per step (no speculation): the on-count grows with steps.
    config = EngineConfig(model=model, cache=CacheConfig(kv_cache_memory_bytes=8 << 20),
                          multiprocess=False, speculative_config=None)  # fmt: skip
    core = EngineCore(config, tracer=tracer)
    assert (core.spans is None) == (tracer is None)
    served = describe_model(config.model)
    hook = TracingCalls()
    threading.setprofile(hook)  # every thread started from now on: the server's, the engine's
    try:
        with LiveServer(InProcessEngineClient(core), served.tokenizer, model_name=served.name,
                        max_model_len=256, tracer=tracer) as live:  # fmt: skip
            return [hook.during(lambda n=n: stream(live, n)) for n in (SHORT, LONG)]
    finally:
        threading.setprofile(None)


def test_with_tracing_off_no_token_calls_tracing_code(tiny_folder):
    short, long = calls_per_request(tiny_folder, tracer=None)
    # sluice calls no tracing code at all, neither its own nor OpenTelemetry.
    assert not [call for call in short + long if call[0] == "sluice"]
    # What remains is FastAPI's own request telemetry (a few API lookups of
    # the current context and providers per request): as many for 40 tokens as for 8.
    assert {caller for caller, _, _ in short + long} <= {"fastapi"}
    assert long == short


def test_with_tracing_on_the_same_count_grows_with_the_tokens(tiny_folder):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    short, long = calls_per_request(tiny_folder, tracer=provider.get_tracer("test"))
    on_step = ("sluice", "engine_spans.py", "on_step")
    assert short[on_step] >= SHORT and long[on_step] - short[on_step] >= LONG - SHORT
    assert long.total() - short.total() >= LONG - SHORT
