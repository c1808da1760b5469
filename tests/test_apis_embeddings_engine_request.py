"""A pooling request's engine request over a real socket, on a fake pooling
engine behind the real client interface that answers only when the test says:
a client that disconnects gets its engine request aborted (the engine is told,
the abort is counted), a finished one is counted under vLLM's names with the
model's `model_name` and traced, an Ollama request's keep_alive reaches the
model pool."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx2
import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from sluice.engine.engine_request import EngineRequest, Pooling
from sluice.engine.outputs import PooledOutput, RequestDelta
from sluice.engine.pooling_params import PoolingSpec
from sluice.server.served_models.model_entry import ModelSpec
from sluice.server.served_models.served_model import ServedModel
from sluice.testing.fake_engine import FakeEngineBase
from sluice.testing.live_server import LiveServer
from sluice.tokenizer import Tokenizer
from tests.pooling_models import minilm_folder

NAME = "embedder"
SPEC = PoolingSpec(task="embed", pooling="mean", normalize=True, num_dimensions=4)
# One body per pooling route (the texts' tokens are what the engine is sent).
BODIES = {
    "/v1/embeddings": {"input": ["hello world", "bye"]},
    "/v1/rerank": {"query": "q", "documents": ["d", "e"]},
    "/v1/score": {"text_1": "q", "text_2": "d"},
    "/api/embed": {"model": NAME, "input": "hello"},
    "/api/embeddings": {"model": NAME, "prompt": "hello"},
}
# A deadlock guard while waiting for the server's loop, not a bound under test.
GUARD_S = 30.0


class HeldPoolingEngine(FakeEngineBase):
    """A pooling engine that holds each request until the test answers it
    (`answer`, on the server's loop); it records every request and every
    abort it is sent, as a real engine would receive them."""

    def __init__(self) -> None:
        super().__init__()
        self.pooling_requests: dict[str, Pooling] = {}

    def _add(self, request: EngineRequest) -> None:
        assert isinstance(request.payload, Pooling), "a pooling engine got a generation request"
        self.pooling_requests[request.request_id] = request.payload

    def answer(self, request_id: str) -> None:
        message = self.pooling_requests[request_id]
        num_inputs = len(message.inputs)
        data = np.full((num_inputs, SPEC.num_dimensions), 0.5, np.float32).tobytes()
        num_tokens = sum(len(one.token_ids) for one in message.inputs)
        delta = RequestDelta(request_id, (), None, "stop", None, num_tokens,
                             pooled=PooledOutput(data, num_inputs))  # fmt: skip
        self._on_step([delta], [], self.stats())


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_folder(minilm_folder(tmp_path_factory.mktemp("minilm")))


def served_by(engine: HeldPoolingEngine, tokenizer: Tokenizer, tracer=None, **fields) -> LiveServer:
    served = ServedModel(NAME, tokenizer, 256, SPEC)
    spec = ModelSpec(NAME, lambda: served, lambda: engine, **fields)
    return LiveServer(None, None, model_specs=[spec], tracer=tracer)


@pytest.fixture
def held(tokenizer) -> Iterator[tuple[HeldPoolingEngine, LiveServer]]:
    engine = HeldPoolingEngine()
    with served_by(engine, tokenizer, is_pinned=True) as live:
        yield engine, live


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def request_number(engine: HeldPoolingEngine, number: int, path: str) -> str:
    """The id of the engine's `number`th request (1: the first), once it arrived."""
    wait_for(lambda: len(engine.added_request_ids) >= number, f"{path} reached no engine")
    return engine.added_request_ids[number - 1]


def aborted(engine: HeldPoolingEngine, request_id: str) -> Callable[[], bool]:
    return lambda: request_id in engine.aborted_request_ids


def raw_post(live: LiveServer, path: str, body: dict) -> socket.socket:
    """A request sent on a socket the test then holds (and may close unread)."""
    payload = json.dumps(body).encode()
    port = int(live.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def access_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sluice.access"]


def metric(live: LiveServer, name: str, **labels: str) -> float:
    text = httpx2.get(live.url + "/metrics", timeout=GUARD_S).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise AssertionError(f"no sample {name} {labels}")


def test_a_client_that_disconnects_gets_its_pooling_request_aborted_in_the_engine(held, caplog):
    caplog.set_level(logging.INFO, logger="sluice.access")
    engine, live = held
    for number, (path, body) in enumerate(BODIES.items(), start=1):
        sock = raw_post(live, path, body)
        request_id = request_number(engine, number, path)
        sock.close()  # the client leaves before its answer
        wait_for(aborted(engine, request_id), f"{path} was not aborted")
        assert engine.num_open_requests == 0
    assert engine.aborted_request_ids == engine.added_request_ids
    wait_for(lambda: len(access_lines(caplog)) == len(BODIES), "no access line for each request")
    for path, line in zip(BODIES, access_lines(caplog), strict=True):
        assert f'"POST {path}" 499' in line and "prompt_tokens=-" not in line
    assert metric(live, "sluice:request_aborted_total", model_name=NAME) == len(BODIES)
    success = "vllm:request_success_total"
    with pytest.raises(AssertionError, match="no sample"):
        metric(live, success, model_name=NAME, finished_reason="stop")


def test_a_finished_pooling_request_is_counted_under_vllms_names(held):
    engine, live = held
    with ThreadPoolExecutor(1) as pool:
        for number, (path, body) in enumerate(BODIES.items(), start=1):
            answer = pool.submit(httpx2.post, live.url + path, json=body, timeout=GUARD_S)
            request_id = request_number(engine, number, path)
            live.loop.call_soon_threadsafe(engine.answer, request_id)
            assert answer.result().status_code == 200, answer.result().text
    num_tokens = sum(
        len(one.token_ids) for r in engine.pooling_requests.values() for one in r.inputs
    )
    labels = {"model_name": NAME}
    assert metric(live, "vllm:request_success_total", **labels, finished_reason="stop") == 5
    assert metric(live, "sluice:request_success_total", **labels, finished_reason="stop") == 5
    assert metric(live, "vllm:prompt_tokens_total", **labels) == num_tokens
    assert metric(live, "vllm:generation_tokens_total", **labels) == 0
    assert metric(live, "vllm:e2e_request_latency_seconds_count", **labels) == 5
    assert metric(live, "vllm:request_prompt_tokens_sum", **labels) == num_tokens
    assert engine.aborted_request_ids == []


def test_ollama_embed_hands_its_keep_alive_to_the_model_pool(tokenizer):
    engine = HeldPoolingEngine()
    with served_by(engine, tokenizer) as live, ThreadPoolExecutor(1) as pool:
        for path, body in (("/api/embed", BODIES["/api/embed"]),
                           ("/api/embeddings", BODIES["/api/embeddings"])):  # fmt: skip
            number = len(engine.added_request_ids) + 1
            answer = pool.submit(httpx2.post, live.url + path, json={**body, "keep_alive": 0},
                                 timeout=GUARD_S)  # fmt: skip
            request_id = request_number(engine, number, path)
            live.loop.call_soon_threadsafe(engine.answer, request_id)
            assert answer.result().status_code == 200, answer.result().text
            # keep_alive 0: the model stops once its request is done (Ollama's unload).
            wait_for(lambda: not running(live), f"{path}: the model still runs")
        kept = {**BODIES["/api/embed"], "input": [], "keep_alive": "1h"}
        assert httpx2.post(live.url + "/api/embed", json=kept, timeout=GUARD_S).status_code == 200
        (expires_at,) = running(live).values()
        assert not expires_at.startswith("2318-")  # in an hour, not for ever
        refused = {**BODIES["/api/embed"], "keep_alive": "soon"}
        answer = httpx2.post(live.url + "/api/embed", json=refused, timeout=GUARD_S)
        assert answer.status_code == 400 and "keep_alive" in answer.json()["error"]


def test_a_traced_pooling_request_names_its_model_tokens_and_finish(tokenizer):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine = HeldPoolingEngine()
    with (
        served_by(engine, tokenizer, tracer=provider.get_tracer("test"), is_pinned=True) as live,
        ThreadPoolExecutor(1) as pool,
    ):
        answer = pool.submit(httpx2.post, live.url + "/v1/embeddings",
                             json=BODIES["/v1/embeddings"], timeout=GUARD_S)  # fmt: skip
        wait_for(lambda: len(engine.added_request_ids) == 1, "no engine request")
        live.loop.call_soon_threadsafe(engine.answer, engine.added_request_ids[0])
        num_tokens = answer.result().json()["usage"]["prompt_tokens"]
    spans = {span.name: span for span in exporter.get_finished_spans()}
    attributes = spans["POST /v1/embeddings"].attributes
    assert attributes["gen_ai.request.model"] == NAME
    assert attributes["gen_ai.usage.input_tokens"] == num_tokens
    assert attributes["gen_ai.response.id"] == engine.added_request_ids[0]
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["http.response.status_code"] == 200
    assert "receive" in spans


def running(live: LiveServer) -> dict[str, str]:
    models = httpx2.get(live.url + "/api/ps", timeout=GUARD_S).json()["models"]
    return {model["name"]: model["expires_at"] for model in models}
