"""ASGI middleware of the HTTP edge: request id and access log, CORS, API key.

Pure ASGI (no `BaseHTTPMiddleware`), so streaming bodies pass through
untouched and a client disconnect reaches the route as it happens.
Order, outermost first: request context (id + access log, so even a 401 is
logged with its id), CORS (so preflights never need a key), API key.

Invariants: every HTTP response carries `X-Request-Id` (the client's, or a
fresh one); exactly one "sluice.access" log line per HTTP request, written
when its last body byte is sent or it failed.
"""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from dataclasses import dataclass, field

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluice.config import ServerConfig
from sluice.server.errors import error_response, internal_error_response
from sluice.server.pages import is_public_page

access_logger = logging.getLogger("sluice.access")
logger = logging.getLogger("sluice.server")

REQUEST_ID_HEADER = b"x-request-id"
# Probes and scrapers never carry the key.
API_KEY_EXEMPT_PATHS = frozenset({"/health", "/metrics"})
# Status written to the access log when the client left before the response.
CLIENT_CLOSED_STATUS = 499
_MAX_REQUEST_ID_CHARS = 128


@dataclass(slots=True)
class RequestLog:
    """What the access log line says about one request; routes fill in the tokens."""

    request_id: str
    method: str
    path: str
    start_s: float = field(default_factory=time.perf_counter)
    status: int | None = None
    first_byte_s: float | None = None
    num_prompt_tokens: int | None = None
    num_completion_tokens: int | None = None

    def line(self) -> str:
        now_s = time.perf_counter()
        first_byte = "-" if self.first_byte_s is None else _ms(self.first_byte_s - self.start_s)
        return (
            f'{self.request_id} "{self.method} {self.path}" {self.status or "-"} '
            f"prompt_tokens={_or_dash(self.num_prompt_tokens)} "
            f"completion_tokens={_or_dash(self.num_completion_tokens)} "
            f"first_byte_ms={first_byte} total_ms={_ms(now_s - self.start_s)}"
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def request_log_of(scope: Scope) -> RequestLog | None:
    """The request's log record (routes use `request.state.request_log`)."""
    return scope.get("state", {}).get("request_log")


class RequestContextMiddleware:
    """Request id in and out, and one access-log line per request."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        log = RequestLog(_request_id(scope), scope["method"], scope["path"])
        scope.setdefault("state", {})["request_log"] = log
        is_logged = False

        async def send_with_id(message: Message) -> None:
            nonlocal is_logged
            if message["type"] == "http.response.start":
                log.status = message["status"]
                headers = list(message.get("headers", ()))
                headers.append((REQUEST_ID_HEADER, log.request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                if log.first_byte_s is None and message.get("body"):
                    log.first_byte_s = time.perf_counter()
                if not message.get("more_body", False) and not is_logged:
                    is_logged = True
                    await send(message)
                    access_logger.info(log.line())
                    return
            await send(message)

        is_failed = False
        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:
            pass  # the client left while sending its body: logged as 499 below
        except Exception:
            # A bug, never client input: log it, answer 500 if nothing was sent yet.
            is_failed = True
            logger.exception("unexpected error on %s %s", log.method, log.path)
            if log.status is None:
                await internal_error_response(log.path)(scope, receive, send_with_id)
        finally:
            if not is_logged:
                # The response never finished: cut by the error above, or the client left.
                log.status = 500 if is_failed else CLIENT_CLOSED_STATUS
                access_logger.info(log.line())


def _request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == REQUEST_ID_HEADER:
            text = value.decode("latin-1").strip()
            # Echo only what is safe in a header and a log line.
            if text and len(text) <= _MAX_REQUEST_ID_CHARS and text.isprintable():
                return text
    return uuid.uuid4().hex


class ApiKeyMiddleware:
    """`Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) on
    every path but probes; 401 otherwise."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self._expected = f"Bearer {api_key}".encode()
        self._expected_key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in API_KEY_EXEMPT_PATHS or is_public_page(path):
            await self.app(scope, receive, send)
            return
        given = next((v for n, v in scope["headers"] if n == b"authorization"), b"")
        given_key = next((v for n, v in scope["headers"] if n == b"x-api-key"), b"")
        # Both compared, whichever is given: no timing difference between them.
        is_bearer = hmac.compare_digest(given, self._expected)
        is_key = hmac.compare_digest(given_key, self._expected_key)
        if is_bearer or (given_key and is_key):
            await self.app(scope, receive, send)
            return
        message = "missing API key" if not (given or given_key) else "invalid API key"
        response = error_response(
            401,
            f"{message}; send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
            "authentication_error",
            code="invalid_api_key",
            path=path,
        )
        await response(scope, receive, send)


def middleware_stack(config: ServerConfig) -> list[Middleware]:
    """The app's middleware, outermost first."""
    stack = [Middleware(RequestContextMiddleware)]
    if config.cors_allowed_origins:
        stack.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(config.cors_allowed_origins),
                allow_methods=["*"],
                allow_headers=["*"],
                expose_headers=["X-Request-Id"],
            )
        )
    if config.api_key:
        stack.append(Middleware(ApiKeyMiddleware, api_key=config.api_key))
    return stack
