"""ASGI middleware of the HTTP edge: request id and access log, CORS, API key.

Pure ASGI (no `BaseHTTPMiddleware`), so streaming bodies pass through
untouched and a client disconnect reaches the route as it happens.
Order, outermost first: request context (sluice/server/in_flight/request_context.py:
id + access log, so even a 401 is logged with its id), CORS (so preflights never need a key), the request's
trace with tracing on (sluice/server/observability/request_spans.py), API key and its
limits (sluice/server/keys/api_keys.py, key_limits.py). Which paths are keyed,
traced and generation routes, and the shape of an error on each, is read
from the app's API table (sluice/apis/surface.py).

Invariants: every HTTP response carries `X-Request-Id` (the client's, or a
fresh one); exactly one "sluice.access" log line per HTTP request, written
when its last body byte is sent or it failed (sluice/server/observability/access_log.py);
each middleware writes what it learns into the request's one
`RequestContext`, never into the scope under a key of its own.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Collection
from typing import TYPE_CHECKING

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluice.apis.surface import API_TABLE, ApiTable
from sluice.config import ServerConfig
from sluice.errors import ErrorShape, PermissionDeniedError, RateLimitError
from sluice.server.http.errors import (
    error_response,
    internal_error_response,
    request_error_response,
)
from sluice.server.http.pages import is_public_page
from sluice.server.in_flight.request_context import SCOPE_KEY, RequestContext, context_of
from sluice.server.keys.api_keys import ApiKey, KeyRing
from sluice.server.keys.key_limits import KeyLimiter
from sluice.server.observability.access_log import RequestLog, log_safe
from sluice.server.observability.request_spans import RequestTrace

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

access_logger = logging.getLogger("sluice.access")
logger = logging.getLogger("sluice.server")

REQUEST_ID_HEADER = b"x-request-id"
# Probes and scrapers never carry the key.
API_KEY_EXEMPT_PATHS = frozenset({"/health", "/metrics"})
# Routes that act on every tenant at once: with keys, only an admin key's
# (`admin=true` in the key file); without keys, open as every route is.
ADMIN_PATHS = frozenset({"/reset_prefix_cache"})
# Status written to the access log when the client left before the response.
CLIENT_CLOSED_STATUS = 499
_MAX_REQUEST_ID_CHARS = 128


class RequestContextMiddleware:
    """Request id in and out, and one access-log line per request."""

    def __init__(self, app: ASGIApp, apis: ApiTable):
        self.app = app
        self._apis = apis

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        log = RequestLog(_request_id(scope), scope["method"], scope["path"])
        scope[SCOPE_KEY] = RequestContext(log)
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
            logger.exception("unexpected error on %s %s", log_safe(log.method), log_safe(log.path))
            if log.status is None:
                shape = self._apis.error_shape_of(log.path)
                await internal_error_response(shape)(scope, receive, send_with_id)
        finally:
            if not is_logged:
                # The response never finished: cut by the error above, or the client left.
                log.status = 500 if is_failed else CLIENT_CLOSED_STATUS
                access_logger.info(log.line())


def _request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == REQUEST_ID_HEADER:
            text = value.decode("latin-1").strip()
            # Echo only what is safe in a header and one field of a log line.
            if text and len(text) <= _MAX_REQUEST_ID_CHARS and _is_one_field(text):
                return text
    return uuid.uuid4().hex


def _is_one_field(text: str) -> bool:
    return text.isprintable() and not any(c.isspace() or c in '"\\' for c in text)


class ApiKeyMiddleware:
    """`Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) on
    every path but probes and pages, 401 otherwise; 403 on the admin routes
    for a key that is not an admin's; then the key's limits on the generation
    routes, 429 with Retry-After when one is reached.

    The key's name (never the key) goes to the access log; the `ApiKey`
    (whose stored responses are whose) and the request's `KeyLease`, held
    until the response's last byte is sent, to the request's context (its
    delivered tokens are charged through it).
    Keyed paths, generation routes and error shapes: the API table's.
    """

    def __init__(self, app: ASGIApp, keys: KeyRing, limiter: KeyLimiter, apis: ApiTable):
        self.app = app
        self._keys = keys
        self._limiter = limiter
        self._apis = apis

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not self._is_keyed(path):
            await self.app(scope, receive, send)
            return
        shape = self._apis.error_shape_of(path)
        key = self._key_of(scope)
        if key is None:
            await _unauthorized(scope, shape)(scope, receive, send)
            return
        context = context_of(scope)
        context.log.key_name = key.name
        context.key = key
        if path in ADMIN_PATHS and not key.is_admin:
            refusal = PermissionDeniedError(
                f"key {key.name!r} may not call {path}: it needs an admin key "
                "(admin=true in --api-key-file)",
                code="admin_key_required",
            )
            await request_error_response(refusal, shape)(scope, receive, send)
            return
        if (scope["method"], path) not in self._apis.generation_routes:
            await self.app(scope, receive, send)
            return
        try:
            lease = self._limiter.admit(key)
        except RateLimitError as error:
            await request_error_response(error, shape)(scope, receive, send)
            return
        context.key_lease = lease
        try:
            await self.app(scope, receive, send)
        finally:
            lease.release()

    def _is_keyed(self, path: str) -> bool:
        is_exempt = path in API_KEY_EXEMPT_PATHS or is_public_page(path)
        return not is_exempt and self._apis.is_keyed(path)

    def _key_of(self, scope: Scope) -> ApiKey | None:
        given = next((v for n, v in scope["headers"] if n == b"authorization"), b"")
        given_key = next((v for n, v in scope["headers"] if n == b"x-api-key"), b"")
        # Both looked up, whichever is given: no timing difference between them.
        bearer = self._keys.match(given.removeprefix(b"Bearer ")) if given else None
        by_header = self._keys.match(given_key)
        if given.startswith(b"Bearer ") and bearer is not None:
            return bearer
        return by_header if given_key else None


def _unauthorized(scope: Scope, shape: ErrorShape) -> Response:
    headers = {n for n, _ in scope["headers"]}
    is_missing = not headers & {b"authorization", b"x-api-key"}
    message = "missing API key" if is_missing else "invalid API key"
    return error_response(
        401,
        f"{message}; send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
        "authentication_error",
        code="invalid_api_key",
        shape=shape,
    )


class TraceMiddleware:
    """A `RequestTrace` (sluice/server/observability/request_spans.py) in the request's
    context for each request to `routes` (method, path), ended with its status."""

    def __init__(self, app: ASGIApp, tracer: Tracer, routes: Collection[tuple[str, str]]):
        self.app = app
        self._tracer = tracer
        self._routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) not in self._routes:
            await self.app(scope, receive, send)
            return
        context = context_of(scope)
        trace = context.trace = RequestTrace(self._tracer, scope, context.request_id)
        status_code: int | None = None

        async def send_with_status(message: Message) -> None:
            nonlocal status_code
            if message["type"] == "http.response.start":
                status_code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            trace.end(status_code)


def middleware_stack(
    config: ServerConfig,
    keys: KeyRing | None = None,
    limiter: KeyLimiter | None = None,
    tracer: Tracer | None = None,
    apis: ApiTable = API_TABLE,
) -> list[Middleware]:
    """The app's middleware, outermost first; `keys` and `limiter` default to
    those `config` describes (an app passes its own, to reload them);
    `tracer`: one span per traced generation request (none without it);
    `apis`: the APIs the app serves."""
    stack = [Middleware(RequestContextMiddleware, apis=apis)]
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
    if tracer is not None:  # outside the key check: a 401 or 429 is traced too
        stack.append(Middleware(TraceMiddleware, tracer=tracer, routes=apis.traced_routes))
    keys = keys or KeyRing(config.api_key, config.api_key_file)
    if keys.is_enabled:
        limiter = limiter or KeyLimiter()
        stack.append(Middleware(ApiKeyMiddleware, keys=keys, limiter=limiter, apis=apis))
    return stack
