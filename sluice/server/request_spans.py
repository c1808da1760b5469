"""The HTTP edge's part of a request's trace (sluice/tracing.py).

`TraceMiddleware` opens one server span per generation request, from its
first byte in to its last byte out, continuing the client's `traceparent`
header when it sends one; the route marks the end of `receive` (body read,
validated, tokenized) and hands the span's traceparent to the engine, whose
`queue`, `prefill` and `decode` spans land inside it; `stream` runs from the
first token handed to the client to the end of the response.

The request span carries the request id (the X-Request-Id and the response's
id), the model, prompt and completion tokens, the finish reasons and the
HTTP status. Installed only with tracing on: off, the routes find no
`request_trace` in the scope and skip everything here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluice.frontend.observer import RequestObserver
from sluice.tracing import context_of, traceparent_of

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

TRACEPARENT_HEADER = b"traceparent"


class RequestTrace:
    """One traced API request: its server span, with `receive` and `stream` inside."""

    def __init__(
        self,
        tracer: Tracer,
        scope: Scope,
        request_id: str,
        clock_ns: Callable[[], int] = time.time_ns,
    ):
        from opentelemetry.trace import SpanKind, set_span_in_context

        self._tracer = tracer
        self._clock_ns = clock_ns
        self.start_ns = clock_ns()
        method, path = scope["method"], scope["path"]
        traceparent = next((v for n, v in scope["headers"] if n == TRACEPARENT_HEADER), b"")
        self.span: Span = tracer.start_span(
            f"{method} {path}",
            context=context_of(traceparent.decode("latin-1")),
            kind=SpanKind.SERVER,
            start_time=self.start_ns,
            attributes={"http.request.method": method, "url.path": path,
                        "sluice.request_id": request_id},
        )  # fmt: skip
        self._inside = set_span_in_context(self.span)
        # What the engine's spans continue.
        self.traceparent = traceparent_of(self.span)
        self._stream: Span | None = None
        self._num_output_tokens = 0
        self._finish_reasons: list[str] = []

    def received(self, response_id: str, model: str, num_prompt_tokens: int) -> None:
        """The request is read, checked and tokenized: `receive` ends now."""
        self._child("receive", self.start_ns).end(end_time=self._clock_ns())
        self.span.set_attributes({"gen_ai.response.id": response_id,
                                  "gen_ai.request.model": model,
                                  "gen_ai.usage.input_tokens": num_prompt_tokens})  # fmt: skip

    def first_token(self) -> None:
        if self._stream is None:
            self._stream = self._child("stream", self._clock_ns())

    def finished(self, num_output_tokens: int, finish_reason: str) -> None:
        self._num_output_tokens += num_output_tokens
        self._finish_reasons.append(finish_reason)

    def end(self, status_code: int | None) -> None:
        from opentelemetry.trace import StatusCode

        now_ns = self._clock_ns()
        if self._stream is not None:
            self._stream.end(end_time=now_ns)
        if self._finish_reasons:
            self.span.set_attributes({
                "gen_ai.usage.output_tokens": self._num_output_tokens,
                "gen_ai.response.finish_reasons": tuple(self._finish_reasons),
            })  # fmt: skip
        if status_code is not None:
            self.span.set_attribute("http.response.status_code", status_code)
        if status_code is None or status_code >= 500:
            self.span.set_status(StatusCode.ERROR)
        self.span.end(end_time=now_ns)

    def _child(self, name: str, start_ns: int) -> Span:
        return self._tracer.start_span(name, context=self._inside, start_time=start_ns)


class TracedObserver:
    """A `RequestObserver` that tells `trace` of the first token and each
    finish, and passes every call on to `inner`."""

    __slots__ = ("_inner", "_trace")

    def __init__(self, inner: RequestObserver, trace: RequestTrace):
        self._inner = inner
        self._trace = trace

    def on_first_token(self, ttft_s: float, num_tokens: int) -> None:
        self._trace.first_token()
        self._inner.on_first_token(ttft_s, num_tokens)

    def on_chunks(self, num_tokens: Sequence[int], gaps_s: Sequence[float]) -> None:
        self._inner.on_chunks(num_tokens, gaps_s)

    def on_finish(
        self, num_prompt_tokens: int, num_generation_tokens: int, e2e_s: float, finish_reason: str
    ) -> None:
        self._trace.finished(num_generation_tokens, finish_reason)
        self._inner.on_finish(num_prompt_tokens, num_generation_tokens, e2e_s, finish_reason)

    def on_abort(self) -> None:
        self._inner.on_abort()


class TraceMiddleware:
    """A `RequestTrace` per request to `routes` (method, path), at
    `scope["state"]["request_trace"]`."""

    def __init__(self, app: ASGIApp, tracer: Tracer, routes: Collection[tuple[str, str]]):
        self.app = app
        self._tracer = tracer
        self._routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) not in self._routes:
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        log = state.get("request_log")
        trace = RequestTrace(self._tracer, scope, "" if log is None else log.request_id)
        state["request_trace"] = trace
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
