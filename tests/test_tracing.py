"""OpenTelemetry traces end to end on a tiny model: one connected trace per
request (receive, queue, prefill, decode, stream inside the request span,
which continues the client's traceparent), from the in-process engine into
the SDK's in-memory exporter and from the engine process into an OTLP/HTTP
receiver on localhost; with tracing off no tracer exists and the SDK is never imported."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx2
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sluice.config import CacheConfig, EngineConfig, ModelConfig
from sluice.engine.core import EngineCore
from sluice.engine.inproc_client import InProcessEngineClient
from sluice.server.http.launch import build_engine, describe_model
from sluice.testing.live_server import LiveServer
from sluice.testing.otlp_receiver import OtlpReceiver
from sluice.tracing import traces_url

CLIENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"
PHASES = {"receive", "queue", "prefill", "decode", "stream"}


def tiny_engine_config(tiny_folder, **fields) -> EngineConfig:
    model = ModelConfig(model=str(tiny_folder), dtype="float32", quantization=None,
                        activation_quantization=None, max_model_len=256)  # fmt: skip
    return EngineConfig(model=model, cache=CacheConfig(kv_cache_memory_bytes=8 << 20), **fields)


@pytest.fixture
def memory_tracer():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def completion(live: LiveServer, *, stream: bool, traceparent: str | None = None):
    headers = {"traceparent": traceparent} if traceparent else {}
    body = {"prompt": "hello", "max_tokens": 5, "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    response = httpx2.post(f"{live.url}/v1/completions", json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response


def by_trace(spans) -> dict[str, list]:
    traces: dict[str, list] = {}
    for span in spans:
        traces.setdefault(format(span.context.trace_id, "032x"), []).append(span)
    return traces


def check_one_request_trace(spans, *, parent_span_id: str | None) -> None:
    """One request span; every phase inside it; the engine's under it too."""
    named = {span.name: span for span in spans}
    assert set(named) == PHASES | {"POST /v1/completions"}, sorted(named)
    request = named["POST /v1/completions"]
    if parent_span_id is None:
        assert request.parent is None
    else:
        assert format(request.parent.span_id, "016x") == parent_span_id
    for phase in PHASES:
        assert named[phase].parent.span_id == request.context.span_id, phase
    assert request.attributes["gen_ai.usage.input_tokens"] > 0
    assert request.attributes["gen_ai.usage.output_tokens"] == 5
    assert request.attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["gen_ai.response.id"].startswith("cmpl-")
    assert named["decode"].attributes["gen_ai.usage.output_tokens"] == 5
    assert named["decode"].attributes["sluice.request_id"].startswith("cmpl-")
    # The phases follow each other in time.
    queue, prefill, decode = named["queue"], named["prefill"], named["decode"]
    assert request.start_time <= named["receive"].end_time <= queue.start_time
    assert queue.end_time == prefill.start_time and prefill.end_time == decode.start_time
    assert decode.end_time <= request.end_time


def test_the_in_process_engine_and_the_server_make_one_trace_per_request(
    tiny_folder, memory_tracer
):
    tracer, exporter = memory_tracer
    config = tiny_engine_config(tiny_folder, multiprocess=False)
    core = EngineCore(config, tracer=tracer)
    served = describe_model(config.model)
    with LiveServer(InProcessEngineClient(core), served.tokenizer, model_name=served.name,
                    max_model_len=256, tracer=tracer) as live:  # fmt: skip
        completion(live, stream=True, traceparent=TRACEPARENT)
        completion(live, stream=False)
    traces = by_trace(exporter.get_finished_spans())
    assert len(traces) == 2
    check_one_request_trace(traces.pop(CLIENT_TRACE_ID), parent_span_id=CLIENT_SPAN_ID)
    (own,) = traces.values()
    check_one_request_trace(own, parent_span_id=None)


def test_a_refused_request_is_traced_with_its_status(tiny_folder, memory_tracer):
    tracer, exporter = memory_tracer
    config = tiny_engine_config(tiny_folder, multiprocess=False)
    served = describe_model(config.model)
    with LiveServer(InProcessEngineClient(EngineCore(config, tracer=tracer)), served.tokenizer,
                    model_name=served.name, max_model_len=256, tracer=tracer,
                    api_key="sk-x") as live:  # fmt: skip
        response = httpx2.post(f"{live.url}/v1/completions", json={"prompt": "hi"})
        assert response.status_code == 401
    (span,) = exporter.get_finished_spans()
    assert span.name == "POST /v1/completions"
    assert span.attributes["http.response.status_code"] == 401


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


def test_the_engine_process_continues_the_trace_through_otlp(tiny_folder, receiver):
    config = tiny_engine_config(tiny_folder, otlp_traces_endpoint=receiver.url)
    assembly = build_engine(config)
    with LiveServer(assembly.engine, assembly.model.tokenizer, model_name=assembly.model.name,
                    max_model_len=256, engine=config, startup_timeout_s=120) as live:  # fmt: skip
        completion(live, stream=True, traceparent=TRACEPARENT)
        receiver.wait_for(len(PHASES) + 1)
    services = {span.name: service for service, span in receiver.spans}
    assert services == {"POST /v1/completions": "sluice-server", "receive": "sluice-server",
                        "stream": "sluice-server", "queue": "sluice-engine",
                        "prefill": "sluice-engine", "decode": "sluice-engine"}  # fmt: skip
    spans = {span.name: span for _, span in receiver.spans}
    request = spans["POST /v1/completions"]
    assert {span.trace_id.hex() for span in spans.values()} == {CLIENT_TRACE_ID}
    assert request.parent_span_id.hex() == CLIENT_SPAN_ID
    for phase in PHASES:
        assert spans[phase].parent_span_id == request.span_id, phase


def test_an_endpoint_without_a_path_gets_otlps_traces_path():
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("http://c:4318/custom/traces") == "http://c:4318/custom/traces"


def test_with_tracing_off_no_tracer_exists_and_the_sdk_is_never_imported():
    # A fresh interpreter: the app serves a stream; sluice made no tracer, so
    # neither the SDK nor an exporter loaded (FastAPI imports the API itself).
    code = """
import sys, httpx2
from sluice.server.http.middleware import TraceMiddleware
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer
from sluice.testing.otlp_receiver import OtlpReceiver
server = LiveServer(LoopFakeEngine(), ChatFakeTokenizer())
assert all(m.cls is not TraceMiddleware for m in server.app.user_middleware)
with server as live:
    body = {"prompt": "hi", "max_tokens": 3, "stream": True}
    assert httpx2.post(live.url + "/v1/completions", json=body).status_code == 200
prefixes = ("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.proto")
print(sorted(m for m in sys.modules if m.startswith(prefixes)))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120)  # fmt: skip
    assert result.stdout.strip() == "[]"


def test_an_engine_without_an_endpoint_keeps_no_spans(tiny_folder):
    assert EngineCore(tiny_engine_config(tiny_folder, multiprocess=False)).spans is None


@pytest.mark.slow
def test_a_ray_replica_continues_the_trace_across_the_ray_hop(tiny_folder, receiver):
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from sluice.config import DataParallelConfig
    from sluice.scaleout.client import DataParallelEngineClient

    node = {"num_cpus": 1, "object_store_memory": 80 << 20}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        config = tiny_engine_config(tiny_folder, otlp_traces_endpoint=receiver.url)
        data_parallel = DataParallelConfig(num_replicas=2, ray_address=cluster.address)
        engine = DataParallelEngineClient(config, data_parallel)
        served = describe_model(config.model)
        with LiveServer(engine, served.tokenizer, model_name=served.name, max_model_len=256,
                        startup_timeout_s=300, engine=config,
                        data_parallel=data_parallel) as live:  # fmt: skip
            trace_ids = [f"{i:032x}" for i in range(1, 5)]
            for trace_id in trace_ids:
                completion(live, stream=True, traceparent=f"00-{trace_id}-{CLIENT_SPAN_ID}-01")
            receiver.wait_for(len(trace_ids) * (len(PHASES) + 1), timeout_s=120)
    finally:
        ray.shutdown()
        cluster.shutdown()
    for trace_id in trace_ids:
        spans = {span.name: (service, span) for service, span in receiver.spans
                 if span.trace_id.hex() == trace_id}  # fmt: skip
        assert set(spans) == PHASES | {"POST /v1/completions"}
        request = spans["POST /v1/completions"][1]
        for phase in ("queue", "prefill", "decode"):
            service, span = spans[phase]
            assert service == "sluice-engine" and span.parent_span_id == request.span_id
