"""The one mapping from errors to OpenAI error objects and statuses."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request

from sluice.apis.surface import API_TABLE
from sluice.errors import (
    AuthenticationError,
    ContextLengthError,
    EngineDeadError,
    ErrorShape,
    InvalidRequestError,
    ModelNotFoundError,
    QueueFullError,
)
from sluice.server.http.errors import (
    install_error_handlers,
    internal_error_response,
    param_from_location,
    request_error_response,
    unavailable_response,
    validation_error,
)


def error_of(response) -> dict:
    return orjson.loads(response.body)["error"]


@pytest.mark.parametrize(
    ("error", "status", "error_type"),
    [
        (InvalidRequestError("x", param="n"), 400, "invalid_request_error"),
        (ContextLengthError("x", param="max_tokens"), 400, "invalid_request_error"),
        (AuthenticationError("x"), 401, "authentication_error"),
        (ModelNotFoundError("x", param="model"), 404, "not_found_error"),
    ],
)
def test_request_errors_keep_their_status_type_and_param(error, status, error_type):
    response = request_error_response(error)
    assert response.status_code == status
    assert response.media_type == "application/json"
    assert error_of(response) == {
        "message": "x",
        "type": error_type,
        "param": error.param,
        "code": None,
    }


@pytest.mark.parametrize("error", [EngineDeadError("down"), QueueFullError("full")])
def test_unavailable_errors_are_503_with_retry_after(error):
    response = unavailable_response(error)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert error_of(response)["message"] == error.message


def test_an_internal_error_says_nothing_about_its_cause():
    response = internal_error_response()
    assert response.status_code == 500
    assert error_of(response)["message"].startswith("internal server error")


@pytest.mark.parametrize(
    ("location", "param"),
    [
        (("temperature",), "temperature"),
        (("messages", 0, "content"), "messages[0].content"),
        (("prompt", "list[list[int]]", 2, 0), "prompt[2][0]"),
        (("stop", "function-after[_check_stop(), str]"), "stop"),
        ((), None),
    ],
)
def test_pydantic_locations_become_the_clients_json_path(location, param):
    assert param_from_location(location) == param


def test_a_validation_error_names_its_first_field_without_the_body_prefix():
    error = validation_error(
        [{"loc": ("body", "n"), "msg": "Input should be greater than 0", "type": "x"}]
    )
    assert error.param == "n"
    assert error.status_code == 400
    assert "n" in error.message


def test_a_missing_field_reads_as_required():
    error = validation_error([{"loc": ("messages",), "msg": "Field required", "type": "missing"}])
    assert error.message == "'messages' is required"


def call_handler(app: FastAPI, exc: Exception, path: str = "/v1/completions"):
    handler = next(
        app.exception_handlers[c] for c in type(exc).__mro__ if c in app.exception_handlers
    )
    request = Request({"type": "http", "method": "POST", "path": path, "headers": []})
    return asyncio.run(handler(request, exc))


def test_fastapi_validation_errors_become_400_never_422():
    app = FastAPI()
    install_error_handlers(app, API_TABLE.error_shape_of)
    exc = RequestValidationError([{"loc": ("query", "limit"), "msg": "bad", "type": "int"}])
    response = call_handler(app, exc)
    assert response.status_code == 400
    assert error_of(response)["param"] == "limit"


def test_http_exceptions_keep_their_status_in_the_openai_shape():
    app = FastAPI()
    install_error_handlers(app, API_TABLE.error_shape_of)
    response = call_handler(app, HTTPException(405, "Method Not Allowed"))
    assert response.status_code == 405
    assert error_of(response)["message"] == "Method Not Allowed"
    response = call_handler(app, HTTPException(404, "Not Found"))
    assert error_of(response)["type"] == "not_found_error"


@pytest.mark.parametrize(
    ("error", "status", "error_type"),
    [
        (InvalidRequestError("bad value", param="max_tokens"), 400, "invalid_request_error"),
        (AuthenticationError("x"), 401, "authentication_error"),
        (ModelNotFoundError("x"), 404, "not_found_error"),
        (QueueFullError("full"), 503, "overloaded_error"),
    ],
)
def test_messages_routes_answer_in_anthropics_shape_with_the_same_status(error, status, error_type):
    app = FastAPI()
    install_error_handlers(app, API_TABLE.error_shape_of)
    response = call_handler(app, error, path="/v1/messages")
    assert response.status_code == status
    body = orjson.loads(response.body)
    assert body["type"] == "error" and body["error"]["type"] == error_type
    assert set(body["error"]) == {"type", "message"}
    if error_type == "invalid_request_error":
        assert body["error"]["message"] == "max_tokens: bad value"
    if status == 503:
        assert response.headers["Retry-After"] == "1"


def test_an_internal_error_in_anthropics_shape_is_an_api_error():
    body = orjson.loads(internal_error_response(ErrorShape.ANTHROPIC).body)
    assert body["error"]["type"] == "api_error" and "logged" in body["error"]["message"]
