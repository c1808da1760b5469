"""One count of delivered tokens: the access log line, the API key's spend and
the request span all say what the client's usage says, whatever the shape of
the reply (several tokens per chunk, n > 1, no stream) and when the client
leaves midway. Over a real socket, the fake engine, keys and a tracer on;
then the context alone."""

from __future__ import annotations

import logging
import re
import threading

import httpx2
import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sluice.server.in_flight.request_context import SCOPE_KEY, RequestContext, context_of
from sluice.server.keys.api_keys import ApiKey, KeyLimits
from sluice.server.keys.key_limits import KeyLimiter
from sluice.server.observability.access_log import RequestLog
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer

KEY = "sk-count-1234"
HEADERS = {"Authorization": f"Bearer {KEY}"}
COMPLETION_TOKENS = re.compile(r"completion_tokens=(\d+) ")


class Clock:
    """A still clock: nothing leaves the key's window during a test."""

    def __call__(self) -> float:
        return 1000.0


class Counts:
    """Where the server wrote one request's delivered tokens."""

    def __init__(self, live: LiveServer, exporter: InMemorySpanExporter, caplog):
        self._live = live
        self._exporter = exporter
        self._caplog = caplog

    def access_line(self, request_id: str) -> str:
        (line,) = [r.getMessage() for r in self._caplog.records
                   if r.getMessage().startswith(request_id)]  # fmt: skip
        return line

    def spent(self) -> int:
        """Tokens in the key's window: prompts plus what was delivered (the
        unused reservations refunded once each request ended)."""
        (limiter,) = [m.kwargs["limiter"] for m in self._live.app.user_middleware
                      if "limiter" in m.kwargs]  # fmt: skip
        return limiter.usage("counted").num_window_tokens

    def of(self, request_id: str) -> tuple[int, int, int]:
        """(access log, span output tokens, span input tokens) of `request_id`,
        waiting for its span to end (after its lease is released)."""
        span = None
        for _ in range(500):
            span = next((s for s in self._exporter.get_finished_spans()
                         if s.attributes.get("sluice.request_id") == request_id), None)  # fmt: skip
            if span is not None:
                break
            threading.Event().wait(0.01)
        assert span is not None, "the request's span never ended"
        line = self.access_line(request_id)
        match = COMPLETION_TOKENS.search(line)
        assert match, line
        attributes = span.attributes
        return (int(match[1]), attributes["gen_ai.usage.output_tokens"],
                attributes["gen_ai.usage.input_tokens"])  # fmt: skip


@pytest.fixture
def served(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="sluice.access")
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY} name=counted tpm=1000000\n")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # Steps 2 ms apart: a long stream still runs when its client leaves.
    engine = LoopFakeEngine(tokens_per_step=3, step_interval_s=0.002)
    with LiveServer(engine, ChatFakeTokenizer(), clock=Clock(), api_key_file=keys,
                    tracer=provider.get_tracer("test")) as live:  # fmt: skip
        yield live, Counts(live, exporter, caplog)


def check_one_count(counts: Counts, response: httpx2.Response, usage: dict, spent_before: int):
    logged, span_tokens, span_prompt = counts.of(response.headers["x-request-id"])
    delivered = usage["completion_tokens"]
    assert logged == span_tokens == delivered
    assert span_prompt == usage["prompt_tokens"]
    assert counts.spent() - spent_before == usage["prompt_tokens"] + delivered


def stream_usage(response: httpx2.Response) -> dict:
    events = [line[len("data: ") :] for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return orjson.loads(events[-2])["usage"]


def test_a_stream_of_several_tokens_per_chunk_is_counted_once_everywhere(served):
    live, counts = served
    spent_before = counts.spent()
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 10, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    response = httpx2.post(live.url + "/v1/completions", json=body, headers=HEADERS)
    assert response.status_code == 200
    usage = stream_usage(response)
    assert usage["completion_tokens"] == 10
    check_one_count(counts, response, usage, spent_before)


def test_n_choices_are_counted_together_everywhere(served):
    live, counts = served
    spent_before = counts.spent()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "n": 3, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    response = httpx2.post(live.url + "/v1/chat/completions", json=body, headers=HEADERS)
    assert response.status_code == 200
    usage = stream_usage(response)
    assert usage["completion_tokens"] == 12
    check_one_count(counts, response, usage, spent_before)


def test_a_reply_that_is_not_streamed_is_counted_as_its_usage_says(served):
    live, counts = served
    spent_before = counts.spent()
    body = {"model": MODEL, "prompt": ["one", "two"], "max_tokens": 5}
    response = httpx2.post(live.url + "/v1/completions", json=body, headers=HEADERS)
    assert response.status_code == 200
    usage = response.json()["usage"]
    assert usage["completion_tokens"] == 10
    check_one_count(counts, response, usage, spent_before)


def test_a_stream_whose_client_leaves_counts_the_same_everywhere(served):
    live, counts = served
    spent_before = counts.spent()
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 3000, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
    seen = 0
    with (
        httpx2.Client() as client,
        client.stream("POST", live.url + "/v1/completions", json=body, headers=HEADERS) as response,
    ):
        request_id = response.headers["x-request-id"]
        for line in response.iter_lines():
            if line.startswith("data: {"):
                seen = orjson.loads(line[len("data: ") :])["usage"]["completion_tokens"]
            if seen >= 30:
                break  # leaves: the connection closes with the stream
    logged, span_tokens, span_prompt = counts.of(request_id)
    # The server may have handed over more than the client read before it left.
    assert logged == span_tokens >= seen >= 30
    assert counts.spent() - spent_before == span_prompt + logged
    assert " 499 " in counts.access_line(request_id)


def test_delivered_writes_one_number_to_the_log_the_key_and_the_trace():
    limiter = KeyLimiter(clock=Clock())
    lease = limiter.admit(ApiKey("k", KeyLimits()))
    lease.reserve(3, 10)
    context = RequestContext(RequestLog("id", "POST", "/v1/completions"), key_lease=lease)
    context.delivered(7)
    lease.release()
    assert context.log.num_completion_tokens == 7
    assert limiter.usage("k").num_window_tokens == 3 + 7  # the unused 3 refunded


def test_the_context_is_the_scopes_one_and_made_once_without_middleware():
    scope: dict = {"type": "http", "method": "GET", "path": "/x"}
    context = context_of(scope)
    assert scope[SCOPE_KEY] is context and context_of(scope) is context
    assert context.request_id and context.log.path == "/x"
