"""Request ids, the access log, API keys and CORS, on a tiny app."""

from __future__ import annotations

import ast
import asyncio
import logging
import re

import httpx2
import orjson
from fastapi import FastAPI, Request
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import Response, StreamingResponse

from sluice.config import ServerConfig
from sluice.server.http.middleware import middleware_stack
from sluice.server.in_flight.request_context import context_of
from sluice.server.observability.access_log import RequestLog, log_safe


def tiny_app(config: ServerConfig) -> FastAPI:
    app = FastAPI(middleware=middleware_stack(config))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        context_of(request.scope).log.num_prompt_tokens = 12
        context_of(request.scope).log.num_completion_tokens = 34
        return Response(b"{}", media_type="application/json")

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def events():
            yield b"data: 1\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/boom")
    async def boom() -> Response:
        raise RuntimeError("secret internals")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    return app


def call(config: ServerConfig, method: str, path: str, **kw) -> httpx2.Response:
    async def go() -> httpx2.Response:
        transport = httpx2.ASGITransport(app=tiny_app(config), raise_app_exceptions=False)
        async with httpx2.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, **kw)

    return asyncio.run(go())


def test_a_client_request_id_is_echoed():
    response = call(ServerConfig(), "GET", "/health", headers={"X-Request-Id": "abc-123"})
    assert response.headers["x-request-id"] == "abc-123"


def test_a_request_id_is_generated_when_absent_or_unusable():
    generated = call(ServerConfig(), "GET", "/health").headers["x-request-id"]
    assert len(generated) == 32 and int(generated, 16) >= 0
    too_long = call(ServerConfig(), "GET", "/health", headers={"X-Request-Id": "x" * 200})
    assert too_long.headers["x-request-id"] != "x" * 200


def test_one_access_log_line_carries_method_path_status_tokens_and_timings(caplog):
    caplog.set_level(logging.INFO, logger="sluice.access")
    call(ServerConfig(), "POST", "/v1/completions", headers={"X-Request-Id": "r1"})
    (line,) = [r.getMessage() for r in caplog.records if r.name == "sluice.access"]
    assert line.startswith('r1 "POST /v1/completions" 200 ')
    assert "prompt_tokens=12 completion_tokens=34" in line
    assert "first_byte_ms=" in line and "total_ms=" in line


def test_a_streamed_response_is_logged_once_after_its_last_byte(caplog):
    caplog.set_level(logging.INFO, logger="sluice.access")
    response = call(ServerConfig(), "GET", "/stream")
    assert response.content.endswith(b"data: [DONE]\n\n")
    lines = [r.getMessage() for r in caplog.records if r.name == "sluice.access"]
    assert len(lines) == 1 and '"GET /stream" 200' in lines[0]
    assert "prompt_tokens=- completion_tokens=-" in lines[0]


def test_an_unexpected_error_is_a_generic_500_with_request_id_and_logged(caplog):
    caplog.set_level(logging.INFO)
    response = call(ServerConfig(), "GET", "/boom")
    assert response.status_code == 500
    error = orjson.loads(response.content)["error"]
    assert "secret" not in error["message"] and error["type"] == "internal_server_error"
    assert "x-request-id" in response.headers
    assert any("RuntimeError" in (r.exc_text or "") for r in caplog.records)
    assert any('"GET /boom" 500' in r.getMessage() for r in caplog.records)


KEYED = ServerConfig(api_key="sesame")


def test_a_missing_or_wrong_api_key_is_a_401_in_the_openai_shape():
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "sesame"}):
        response = call(KEYED, "POST", "/v1/completions", headers=headers)
        assert response.status_code == 401
        error = orjson.loads(response.content)["error"]
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
        assert "x-request-id" in response.headers


def test_the_right_api_key_passes():
    headers = {"Authorization": "Bearer sesame"}
    assert call(KEYED, "POST", "/v1/completions", headers=headers).status_code == 200


def test_health_needs_no_api_key():
    assert call(KEYED, "GET", "/health").status_code == 200


def test_cors_is_off_unless_origins_are_configured():
    headers = {"Origin": "http://ui.example", "Access-Control-Request-Method": "POST"}
    closed = call(ServerConfig(), "OPTIONS", "/v1/completions", headers=headers)
    assert "access-control-allow-origin" not in closed.headers
    config = ServerConfig(api_key="sesame", cors_allowed_origins=("http://ui.example",))
    preflight = call(config, "OPTIONS", "/v1/completions", headers=headers)
    # The preflight carries no key and still succeeds: CORS sits outside the key check.
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://ui.example"


@settings(max_examples=500, deadline=None, database=None)
@given(st.text(), st.text(st.characters(codec="utf-8")))
def test_whatever_a_path_holds_its_log_line_is_one_line_with_its_own_quotes(path, name):
    line = RequestLog("id", "GET", path, status=200, key_name=name).line()
    assert line.isprintable()  # no line break, separator or control character
    quoted = line.split(" ", 1)[1]
    assert quoted.startswith('"GET ')
    # The request's closing quote is the first unescaped quote after the opening one.
    end = re.search(r'(?<!\\)(?:\\\\)*"', quoted[1:])
    assert quoted[1 : 1 + end.end()] == f"GET {log_safe(path)}" + '"'
    assert ast.literal_eval(f'"{log_safe(path)}"') == path  # the escapes read back
