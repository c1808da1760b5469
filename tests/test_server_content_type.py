"""Every route that reads a JSON body refuses one not declared JSON (none
included) with a 415 in its API's own error shape, so a web page cannot make a
browser POST generations to a local keyless server; JSON with parameters and
application/*+json are JSON. Over a real socket."""

from __future__ import annotations

import httpx2
import orjson
import pytest

from sluice.apis.surface import API_TABLE
from sluice.testing import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer

MODEL = "fake-model"
MESSAGES = [{"role": "user", "content": "hi"}]
BODIES = {
    "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 2},
    "/v1/chat/completions": {"model": MODEL, "messages": MESSAGES, "max_tokens": 2},
    "/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 2},
    "/v1/responses/input_tokens": {"model": MODEL, "input": "hi"},
    "/v1/messages": {"model": MODEL, "messages": MESSAGES, "max_tokens": 2},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": MESSAGES},
    "/tokenize": {"prompt": "hi"},
    "/api/chat": {
        "model": MODEL,
        "messages": MESSAGES,
        "stream": False,
        "options": {"num_predict": 2},
    },
    "/api/generate": {
        "model": MODEL,
        "prompt": "hi",
        "stream": False,
        "options": {"num_predict": 2},
    },
    "/api/show": {"model": MODEL},
}
RERANK = {"model": MODEL, "query": "q", "documents": ["d"]}
# Pooling routes: their body's type is checked like any other; a generation
# model then refuses them (a 400 in their API's shape, not a 415).
POOLING_BODIES = {
    "/v1/embeddings": {"model": MODEL, "input": "hi"},
    "/v1/rerank": RERANK,
    "/rerank": RERANK,
    "/v2/rerank": RERANK,
    "/v1/score": {"model": MODEL, "text_1": "a", "text_2": "b"},
    "/api/embed": {"model": MODEL, "input": "hi"},
    "/api/embeddings": {"model": MODEL, "prompt": "hi"},
}
# What a page can send cross-origin without a preflight, and other non-JSON types.
NOT_JSON = [None, "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x", "application/jsonp", "text/json"]  # fmt: skip
JSON = ["application/json", "application/json; charset=utf-8", "Application/JSON",
        "application/vnd.api+json", "application/merge-patch+json; charset=UTF-8"]  # fmt: skip


def test_every_route_of_the_api_table_that_reads_a_body_is_checked_here():
    body_routes = {r.path for r in API_TABLE.routes() if r.request_model is not None}
    assert body_routes <= set(BODIES) | set(POOLING_BODIES)


@pytest.fixture(scope="module")
def http():
    with (
        LiveServer(FakeEngine(), ChatFakeTokenizer()) as live,
        httpx2.Client(base_url=live.url, timeout=30) as client,
    ):
        yield client


def post(http: httpx2.Client, path: str, content_type: str | None) -> httpx2.Response:
    headers = {} if content_type is None else {"Content-Type": content_type}
    body = BODIES.get(path) or POOLING_BODIES[path]
    return http.post(path, content=orjson.dumps(body), headers=headers)


@pytest.mark.parametrize("content_type", NOT_JSON)
@pytest.mark.parametrize("path", [*BODIES, *POOLING_BODIES])
def test_a_body_not_declared_json_is_a_415_in_the_apis_shape(http, path, content_type):
    response = post(http, path, content_type)
    assert response.status_code == 415, response.text
    body = response.json()
    if path.startswith("/api/"):  # Ollama's shape: {"error": message}
        message = body["error"]
        assert isinstance(message, str)
    elif path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    else:
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["code"] == "unsupported_media_type"
        message = body["error"]["message"]
    assert "Content-Type must be application/json" in message


@pytest.mark.parametrize("content_type", JSON)
@pytest.mark.parametrize("path", list(BODIES))
def test_json_with_parameters_and_json_suffixes_are_accepted(http, path, content_type):
    response = post(http, path, content_type)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", list(POOLING_BODIES))
def test_a_pooling_routes_json_body_reaches_the_models_refusal(http, path):
    response = post(http, path, "application/json; charset=utf-8")
    assert response.status_code == 400, response.text
    assert "embedding" in response.text or "embed" in response.text, response.text
