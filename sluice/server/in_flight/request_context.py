"""One HTTP request's context at the edge: built once by the middleware,
read by every part of the edge as one typed value (`context_of(scope)`).

Who fills what: `RequestContextMiddleware` builds it (id, access log line);
`TraceMiddleware` adds the trace with tracing on; `ApiKeyMiddleware` adds the
key and, on the generation routes, the key's lease; the routes add the wait
for the model to start (which counts against the one queue deadline).

Invariants:
- One per HTTP request, at `scope[SCOPE_KEY]`; nothing else of the request
  travels in the scope.
- Delivered tokens are counted once: by the projection's `UsageCounter`
  (sluice/frontend/usage.py), filled by the frontend as it hands each delta
  to the projection, the count the client's usage says. When the request
  ends (finished, failed or the client gone) the frontend tells the
  request's observer `on_end(num_tokens)`, and `delivered` writes that one
  number to the access log, the key's spend and the span.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.types import Scope

from sluice.frontend.observer import RequestObserver
from sluice.server.keys.api_keys import ApiKey
from sluice.server.keys.key_limits import KeyLease
from sluice.server.observability.access_log import RequestLog
from sluice.server.observability.metrics import ModelMetrics
from sluice.server.observability.request_spans import RequestTrace

# The scope key of the request's context (ASGI lets a server's own keys ride there).
SCOPE_KEY = "sluice.request_context"


@dataclass(slots=True)
class RequestContext:
    """What the edge knows of one request in flight."""

    # Its id (X-Request-Id) and the access log line it fills.
    log: RequestLog
    # Its API key; None without keys (or on an unkeyed path).
    key: ApiKey | None = None
    # Its hold on the key's limits, on the generation routes; None without keys.
    key_lease: KeyLease | None = None
    # Its server span; None with tracing off or on an untraced path.
    trace: RequestTrace | None = None
    # Seconds it waited for its model to start, off its queue timeout (None: no wait).
    model_wait_s: float | None = None

    @property
    def request_id(self) -> str:
        return self.log.request_id

    @property
    def traceparent(self) -> str | None:
        """What the engine's spans continue (None: not traced)."""
        return None if self.trace is None else self.trace.traceparent

    def received(self, response_id: str, model_name: str, num_prompt_tokens: int) -> None:
        """The request is read, checked and tokenized: its prompt tokens are known."""
        self.log.num_prompt_tokens = num_prompt_tokens
        if self.trace is not None:
            self.trace.received(response_id, model_name, num_prompt_tokens)

    def observer(self, metrics: ModelMetrics) -> RequestObserver:
        """The observer of its generation: its key's series (else the model's),
        its trace told of the first token and each finish, and `delivered`
        told of the tokens when it ends."""
        lease = self.key_lease
        series = metrics if lease is None else metrics.observer_for(lease.key_name)
        return ContextObserver(series, self)

    def delivered(self, num_completion_tokens: int) -> None:
        """The request ended having delivered `num_completion_tokens` (all
        choices, its usage's count): the access log, the key and the span get it."""
        self.log.num_completion_tokens = num_completion_tokens
        if self.key_lease is not None:
            self.key_lease.charge(num_completion_tokens)
        if self.trace is not None:
            self.trace.delivered(num_completion_tokens)


def context_of(scope: Scope) -> RequestContext:
    """The request's context; an app without the middleware (a bare test app)
    gets a fresh one on first asking."""
    context: RequestContext | None = scope.get(SCOPE_KEY)
    if context is None:
        log = RequestLog(uuid.uuid4().hex, scope.get("method", ""), scope.get("path", ""))
        context = scope[SCOPE_KEY] = RequestContext(log)
    return context


class ContextObserver:
    """A `RequestObserver` that tells the request's context (its trace, its
    delivered tokens) and passes every call on to `inner`."""

    __slots__ = ("_inner", "_context")

    def __init__(self, inner: RequestObserver, context: RequestContext):
        self._inner = inner
        self._context = context

    def on_first_token(self, ttft_s: float, num_tokens: int) -> None:
        if self._context.trace is not None:
            self._context.trace.first_token()
        self._inner.on_first_token(ttft_s, num_tokens)

    def on_chunks(self, num_tokens: Sequence[int], gaps_s: Sequence[float]) -> None:
        self._inner.on_chunks(num_tokens, gaps_s)

    def on_finish(
        self, num_prompt_tokens: int, num_generation_tokens: int, e2e_s: float, finish_reason: str
    ) -> None:
        if self._context.trace is not None:
            self._context.trace.finished(finish_reason)
        self._inner.on_finish(num_prompt_tokens, num_generation_tokens, e2e_s, finish_reason)

    def on_abort(self) -> None:
        self._inner.on_abort()

    def on_end(self, num_delivered_tokens: int) -> None:
        self._context.delivered(num_delivered_tokens)
        self._inner.on_end(num_delivered_tokens)
