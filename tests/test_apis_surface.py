"""The API table is the one home of an API's paths: the app registers exactly
its routes, and the key check, the traces and the error shape of every path
are read from it (proved on test-owned apps built from modified tables)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time

import httpx2
import pytest
from fastapi.routing import APIRoute
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sluice.apis.surface import (
    API_TABLE,
    CHAT,
    CHAT_CREATE,
    COMPLETIONS,
    MESSAGES,
    POOLING_ROUTES,
    RESPONSES,
    ApiRoute,
    ApiSurface,
    ApiTable,
)
from sluice.config import ServerConfig
from sluice.errors import ErrorShape
from sluice.server.http.app import create_app
from sluice.server.served_models.served_model import ServedModel
from sluice.testing import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer

MESSAGES_BODY = [{"role": "user", "content": "hi"}]
# A valid body for every POST route of the table.
BODIES = {
    "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 2},
    "/v1/chat/completions": {"model": MODEL, "messages": MESSAGES_BODY, "max_tokens": 2},
    "/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 2},
    "/v1/responses/input_tokens": {"model": MODEL, "input": "hi"},
    "/v1/messages": {"model": MODEL, "messages": MESSAGES_BODY, "max_tokens": 2},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": MESSAGES_BODY},
    "/api/chat": {"model": MODEL, "messages": MESSAGES_BODY, "options": {"num_predict": 2}},
    "/api/generate": {"model": MODEL, "prompt": "hi", "options": {"num_predict": 2}},
    "/api/show": {"model": MODEL},
}
# The app's own routes beside the APIs' (info_routes.py, pages.py).
NOT_AN_API = re.compile(r"/v1/models|/(version|health|metrics|tokenize|detokenize|"
                        r"reset_prefix_cache|dashboard|docs.*|openapi.json|redoc|static.*)?$")  # fmt: skip


def app_of(apis: ApiTable = API_TABLE, tracer=None, **config):
    model = ServedModel(MODEL, ChatFakeTokenizer(), 4096)
    return create_app(ServerConfig(**config), FakeEngine(), model, tracer=tracer, apis=apis)


def call(app, method: str, path: str, **kw) -> httpx2.Response:
    """One request to `app` in process (its engine is not started: the
    requests here are refused before they reach it)."""

    async def go() -> httpx2.Response:
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, **kw)

    return asyncio.run(go())


def bad_body(app, path: str, **kw) -> httpx2.Response:
    return call(app, "POST", path, json={"model": MODEL, "max_tokens": "x"}, **kw)


def is_anthropic(response: httpx2.Response) -> bool:
    body = response.json()
    return body.get("type") == "error" and set(body["error"]) == {"type", "message"}


def access_line(caplog) -> str:
    """The one access line, written after the response's last byte was sent."""
    deadline = time.monotonic() + 30
    while not (lines := [r.getMessage() for r in caplog.records if r.name == "sluice.access"]):
        assert time.monotonic() < deadline, "no access line"
        time.sleep(0.005)
    (line,) = lines
    return line


def test_the_app_registers_exactly_the_routes_of_its_table():
    registered = {
        (method, route.path)
        for route in app_of().routes
        if isinstance(route, APIRoute) and not NOT_AN_API.fullmatch(route.path)
        for method in route.methods
    }
    assert registered == {route.key for route in API_TABLE.routes()}


def test_the_generation_routes_are_the_post_routes_that_run_the_engine():
    assert API_TABLE.generation_routes == {
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/responses"),
        ("POST", "/v1/messages"),
        ("POST", "/api/chat"),
        ("POST", "/api/generate"),
        # A pooling model's (sluice/apis/embeddings): they run the engine too.
        ("POST", "/v1/embeddings"),
        ("POST", "/v1/rerank"),
        ("POST", "/rerank"),
        ("POST", "/v2/rerank"),
        ("POST", "/v1/score"),
        ("POST", "/api/embed"),
        ("POST", "/api/embeddings"),
    }
    assert API_TABLE.traced_routes == API_TABLE.generation_routes
    assert {s.name: s.error_shape for s in API_TABLE.surfaces} == {
        "completions": ErrorShape.OPENAI,
        "chat": ErrorShape.OPENAI,
        "responses": ErrorShape.OPENAI,
        "messages": ErrorShape.ANTHROPIC,
        "ollama": ErrorShape.OLLAMA,
        "embeddings": ErrorShape.OPENAI,
        "rerank": ErrorShape.OPENAI,
        "rerank_jina": ErrorShape.OPENAI,
        "rerank_v2": ErrorShape.OPENAI,
        "score": ErrorShape.OPENAI,
    }


def test_each_route_reads_its_tables_model_and_only_generation_routes_count_tokens(caplog):
    """Over HTTP: the body model each handler parses is its table entry's, and
    the access log's token counts are filled exactly on the generation routes."""
    caplog.set_level(logging.INFO, logger="sluice.access")
    with (
        LiveServer(FakeEngine(), ChatFakeTokenizer()) as live,
        httpx2.Client(base_url=live.url, timeout=30) as http,
    ):
        bodies = live.app.state.routes.bodies
        parsed_models = []
        parse = bodies.parse

        async def recording_parse(request, model):
            parsed_models.append(model)
            return await parse(request, model)

        bodies.parse = recording_parse
        for route in API_TABLE.routes():
            # A pooling model's routes: the same check on one, in
            # tests/test_apis_embeddings_routes.py.
            if route.request_model is None or route in POOLING_ROUTES:
                continue
            parsed_models.clear()
            caplog.clear()
            response = http.post(route.path, json=BODIES[route.path])
            assert response.status_code == 200, response.text
            assert parsed_models[0] is route.request_model, route.path
            line = access_line(caplog)
            assert ("prompt_tokens=-" not in line) == route.is_generation, line


def test_an_api_marked_anthropic_in_the_table_answers_in_anthropics_shape():
    probe = ApiSurface("probe", "/v1/probe", ErrorShape.ANTHROPIC, ())
    chat = dataclasses.replace(CHAT, error_shape=ErrorShape.ANTHROPIC)
    app = app_of(ApiTable((COMPLETIONS, chat, RESPONSES, MESSAGES, probe)))
    response = bad_body(app, "/v1/chat/completions")
    assert response.status_code == 400 and is_anthropic(response)
    response = call(app, "GET", "/v1/probe/anything")
    assert response.status_code == 404 and is_anthropic(response)
    response = bad_body(app, "/v1/completions")
    assert response.status_code == 400 and not is_anthropic(response)
    # The table the app serves by default: chat speaks OpenAI's.
    assert not is_anthropic(bad_body(app_of(), "/v1/chat/completions"))


def test_the_key_middleware_reads_keyed_apis_and_error_shapes_from_the_table():
    probe = ApiSurface("probe", "/v1/probe", ErrorShape.ANTHROPIC, ())
    completions = dataclasses.replace(COMPLETIONS, is_keyed=False)
    app = app_of(ApiTable((completions, CHAT, RESPONSES, MESSAGES, probe)), api_key=("sk-1",))
    response = call(app, "GET", "/v1/probe/anything")
    assert response.status_code == 401 and is_anthropic(response)
    assert call(app, "GET", "/v1/models").status_code == 401
    assert bad_body(app, "/v1/completions").status_code == 400  # unkeyed: no key asked
    keyed = app_of(api_key=("sk-1",))
    assert bad_body(keyed, "/v1/completions").status_code == 401


def test_only_the_tables_traced_generation_routes_are_traced():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    chat = dataclasses.replace(CHAT, is_traced=False)
    app = app_of(ApiTable((COMPLETIONS, chat, RESPONSES, MESSAGES)), tracer=tracer)
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/messages/count_tokens"):
        bad_body(app, path)
    assert [span.name for span in exporter.get_finished_spans()] == ["POST /v1/completions"]


def test_a_route_outside_its_root_or_declared_twice_is_refused():
    with pytest.raises(AssertionError, match="not under"):
        ApiSurface("chat", "/v1/chat", ErrorShape.OPENAI, (ApiRoute("POST", "/v1/other"),))
    with pytest.raises(AssertionError, match="lies under another"):
        ApiTable((CHAT, dataclasses.replace(CHAT, name="again")))
    with pytest.raises(AssertionError, match="lies under another"):
        ApiTable((CHAT, ApiSurface("v1", "/v1", ErrorShape.OPENAI, ())))
    with pytest.raises(AssertionError, match="declared twice"):
        ApiTable((dataclasses.replace(CHAT, routes=(CHAT_CREATE, CHAT_CREATE)),))


def test_a_table_route_without_a_handler_stops_the_app_from_being_built():
    orphan = ApiSurface(
        "orphan", "/v1/orphan", ErrorShape.OPENAI, (ApiRoute("POST", "/v1/orphan"),)
    )
    with pytest.raises(AssertionError, match="no handler serves POST /v1/orphan"):
        app_of(ApiTable((*API_TABLE.surfaces, orphan)))


def test_errors_off_every_api_are_openais():
    assert API_TABLE.surface_of("/v1/messagesx") is None
    assert API_TABLE.error_shape_of("/v1/messagesx") is ErrorShape.OPENAI
    assert API_TABLE.error_shape_of("/v1/messages/count_tokens") is ErrorShape.ANTHROPIC
    assert API_TABLE.surface_of("/v1/responses/r1") is RESPONSES
