"""The one place where errors become HTTP responses.

Every response that is not a success carries the OpenAI error object
(`sluice.errors.openai_error`)

    {"error": {"message": str, "type": str, "param": str | None, "code": str | int | None}}

with the status of the `sluice.errors` class that was raised:

    RequestError and subclasses     their `status_code` (400, 401, 404; 429 with `Retry-After`)
    ServiceUnavailableError         503 with `Retry-After`
    FastAPI RequestValidationError  400 (never FastAPI's 422), the first bad field as `param`
    Starlette HTTPException         its own status (unknown route 404, wrong method 405)
    anything else                   500 with a generic message (sent and logged by
                                    the request-context middleware, outside the routes)

A stream's error before its first event (engine dead, queue timeout) is
raised from the frontend's first read, before any header is sent, and lands
here like any other; after the first event it can only be an error event in
the stream (`sluice.frontend.serving`), carrying the same object.

An API whose `ErrorShape` is Anthropic's (the Messages API's, its entry in
`sluice.apis.surface`) answers with the same statuses in Anthropic's shape
instead, `{"type": "error", "error": {"type", "message"}}`
(`sluice.errors.anthropic_error`), and Ollama's API (`ErrorShape.OLLAMA`)
with `{"error": message}` (`sluice.errors.ollama_error`): every function here
takes the shape, and the app's handlers take it from the API table the app
was built with (`install_error_handlers`), for every path under the API's root.

Invariant: a client can reach the 500 branch only through a bug, never by what it sends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from sluice.errors import (
    INTERNAL_ERROR_MESSAGE,
    INTERNAL_ERROR_TYPE,
    ErrorShape,
    InvalidRequestError,
    RateLimitError,
    RequestError,
    ServiceUnavailableError,
    anthropic_error,
    anthropic_error_of,
    ollama_error,
    openai_error,
    openai_error_of,
)

# Pydantic names union branches and wrappers in error locations ("str",
# "list[int]", "function-after[...]"); they are not part of the client's JSON path.
_PYDANTIC_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})

# A request's path -> the shape of its errors (`ApiTable.error_shape_of`).
ErrorShapeOf = Callable[[str], ErrorShape]


def error_response(
    status_code: int,
    message: str,
    error_type: str,
    param: str | None = None,
    code: str | int | None = None,
    headers: dict[str, str] | None = None,
    shape: ErrorShape = ErrorShape.OPENAI,
) -> Response:
    error = openai_error(message, error_type, param, code)
    return _response(status_code, error, headers, shape)


def request_error_response(exc: RequestError, shape: ErrorShape = ErrorShape.OPENAI) -> Response:
    headers = None
    if isinstance(exc, RateLimitError):
        headers = {"Retry-After": str(exc.retry_after_s)}
    if shape is ErrorShape.ANTHROPIC:  # some errors have Anthropic's own words
        return _json_response(exc.status_code, anthropic_error_of(exc), headers)
    return _response(exc.status_code, openai_error_of(exc), headers, shape)


def unavailable_response(
    exc: ServiceUnavailableError, shape: ErrorShape = ErrorShape.OPENAI
) -> Response:
    headers = {"Retry-After": str(exc.retry_after_s)}
    return _response(exc.status_code, openai_error_of(exc), headers, shape)


def internal_error_response(shape: ErrorShape = ErrorShape.OPENAI) -> Response:
    error = openai_error(INTERNAL_ERROR_MESSAGE, INTERNAL_ERROR_TYPE)
    return _response(500, error, shape=shape)


def _response(
    status_code: int,
    error: dict[str, Any],
    headers: dict[str, str] | None = None,
    shape: ErrorShape = ErrorShape.OPENAI,
) -> Response:
    if shape is ErrorShape.ANTHROPIC:
        error = anthropic_error(status_code, error["error"]["message"], error["error"]["param"])
    elif shape is ErrorShape.OLLAMA:
        error = ollama_error(error["error"]["message"], error["error"]["param"])
    return _json_response(status_code, error, headers)


def _json_response(
    status_code: int, error: dict[str, Any], headers: dict[str, str] | None
) -> Response:
    return Response(
        orjson.dumps(error), status_code=status_code, headers=headers, media_type="application/json"
    )


def param_from_location(location: Sequence[Any]) -> str | None:
    """Pydantic's error location as the client's JSON path: `messages[0].content`."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and not _is_pydantic_tag(part):
            path += f".{part}" if path else part
    return path or None


def _is_pydantic_tag(part: str) -> bool:
    return part in _PYDANTIC_TAGS or "[" in part or "-" in part


def validation_error(errors: Sequence[Mapping[str, Any]]) -> InvalidRequestError:
    """The first pydantic error as one InvalidRequestError naming its field."""
    if not errors:
        return InvalidRequestError("invalid request body")
    first = errors[0]
    location = list(first.get("loc", ()))
    # FastAPI prefixes the source ("body", "query"); the client knows no such level.
    if location and location[0] in ("body", "query", "path", "header"):
        location = location[1:]
    param = param_from_location(location)
    message = str(first.get("msg", "invalid value"))
    if first.get("type") == "missing":
        message = f"'{param}' is required" if param else "a required field is missing"
    elif param:
        message = f"{message} ('{param}')"
    return InvalidRequestError(message, param=param)


def install_error_handlers(app: FastAPI, error_shape_of: ErrorShapeOf) -> None:
    """Every error a route raises answered in the shape `error_shape_of` gives its path."""

    async def on_request_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestError), "handler registered for RequestError"
        return request_error_response(exc, error_shape_of(request.url.path))

    async def on_unavailable(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServiceUnavailableError), "handler registered for 503 errors"
        return unavailable_response(exc, error_shape_of(request.url.path))

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError), "handler registered for validation"
        error = validation_error(exc.errors())
        return request_error_response(error, error_shape_of(request.url.path))

    async def on_http_exception(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException), "handler registered for HTTPException"
        error_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        shape = error_shape_of(request.url.path)
        headers = dict(exc.headers or {})
        return error_response(
            exc.status_code, str(exc.detail), error_type, headers=headers, shape=shape
        )

    app.add_exception_handler(RequestError, on_request_error)
    app.add_exception_handler(ServiceUnavailableError, on_unavailable)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_exception)
