"""The HTTP edge's part of a request's trace (sluice/tracing.py).

`TraceMiddleware` opens one server span per generation request, from its
first byte in to its last byte out, continuing the client's `traceparent`
header when it sends one; the route marks the end of `receive` (body read,
validated, tokenized) and hands the span's traceparent to the engine, whose
`queue`, `prefill` and `decode` spans land inside it; `stream` runs from the
first token handed to the client to the end of the response.

The request span carries the request id (the X-Request-Id and the response's
id), the model, prompt and completion tokens, the finish reasons and the
HTTP status. Opened only with tracing on (`TraceMiddleware`,
sluice/server/http/middleware.py): off, the request's context holds no trace and
the routes skip everything here. Its output tokens are the request's one
delivered count (sluice/server/in_flight/request_context.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.types import Scope

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
        # Delivered over all choices (None: not told yet).
        self._num_output_tokens: int | None = None
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

    def finished(self, finish_reason: str) -> None:
        """One choice finished."""
        self._finish_reasons.append(finish_reason)

    def delivered(self, num_output_tokens: int) -> None:
        """The request ended having delivered `num_output_tokens` (all choices)."""
        self._num_output_tokens = num_output_tokens

    def end(self, status_code: int | None) -> None:
        from opentelemetry.trace import StatusCode

        now_ns = self._clock_ns()
        if self._stream is not None:
            self._stream.end(end_time=now_ns)
        if self._finish_reasons or self._num_output_tokens is not None:
            self.span.set_attribute("gen_ai.usage.output_tokens", self._num_output_tokens or 0)
        if self._finish_reasons:
            self.span.set_attribute("gen_ai.response.finish_reasons", tuple(self._finish_reasons))
        if status_code is not None:
            self.span.set_attribute("http.response.status_code", status_code)
        if status_code is None or status_code >= 500:
            self.span.set_status(StatusCode.ERROR)
        self.span.end(end_time=now_ns)

    def _child(self, name: str, start_ns: int) -> Span:
        return self._tracer.start_span(name, context=self._inside, start_time=start_ns)
