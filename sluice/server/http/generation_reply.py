"""One admitted generation, answered: its API key's seats and tokens reserved,
its observer taken from its request context (sluice/server/in_flight/request_context.py:
the key's series or the model's, its trace, its one count of delivered
tokens), then the frontend's stream or body sent (`GenerationRun.reply`).

Invariants:
- Nothing is sent before the first event exists, so an error before the first
  token (engine dead, queue full, queue timeout) is a real HTTP error, not a
  200 stream.
- A client that goes away is noticed by waiting on the ASGI `receive` channel
  for `http.disconnect` (connection.py, never by polling) and cancels the
  request, which the frontend turns into an engine abort; its access log
  line says 499. Streams are closed in every case.
- A stream whose writes stay stuck for `send_timeout_s` is cut and its engine
  requests aborted; other streams never wait for it (event_stream.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from starlette.responses import Response

from sluice.engine.client_base import EngineRequests, QueueTimeout
from sluice.frontend.observer import RequestObserver
from sluice.frontend.request import GenerationRequest
from sluice.frontend.serving import ResponseChunks
from sluice.server.http.connection import unless_disconnected
from sluice.server.http.event_stream import EVENT_STREAM_MEDIA_TYPE, EventStreamResponse
from sluice.server.http.middleware import CLIENT_CLOSED_STATUS
from sluice.server.in_flight.request_context import context_of
from sluice.server.served_models.model_parts import ModelParts


@dataclass(frozen=True, slots=True)
class GenerationRun:
    """One generation route's request, admitted, on its way to the frontend."""

    request: Request
    # The running model it names (its frontend, metrics and gate).
    model: ModelParts
    generation: GenerationRequest
    queue_timeout: QueueTimeout | None
    # Its API's projection, built by the route.
    chunks: ResponseChunks
    # The stream's (Ollama's NDJSON lines; default SSE).
    media_type: str = EVENT_STREAM_MEDIA_TYPE

    async def reply(self, send_timeout_s: float) -> Response:
        """Reserve the key's share, run the generation and answer with its
        stream or its body."""
        generation = self.generation
        if len(generation.prompts) > 1:  # n was checked; n times the prompts may not fit
            self.model.gate.check_open(generation.num_choices)
        num_prompt_tokens = sum(len(p.token_ids) for p in generation.prompts)
        context = context_of(self.request.scope)
        lease = context.key_lease
        if lease is not None:  # before any engine work: the key's seats and tokens
            lease.seat_choices(generation.num_choices)
            num_max_new_tokens = generation.num_choices * generation.params.max_tokens
            lease.reserve(num_prompt_tokens, num_max_new_tokens)
        context.received(generation.response_id, generation.model_name, num_prompt_tokens)
        observer = context.observer(self.model.metrics)
        if generation.stream:
            return await self._stream(observer, context.traceparent, send_timeout_s)
        return await self._complete(observer, context.traceparent)

    async def _stream(
        self, observer: RequestObserver, trace_context: str | None, send_timeout_s: float
    ) -> Response:
        events = self.model.frontend.stream(
            self.generation, self.chunks, self._engine(), observer, trace_context
        )
        # Wait for the first event before sending headers: an error up to here
        # propagates from it and becomes a real HTTP error (errors.py).
        try:
            first_event = await unless_disconnected(self.request.receive, anext(events))
        except BaseException:
            await events.aclose()
            raise
        if first_event is None:
            await events.aclose()
            return Response(status_code=CLIENT_CLOSED_STATUS)
        return EventStreamResponse(
            first_event,
            events,
            send_timeout_s,
            on_write_wait=self.model.metrics.stream_write_waits.inc,
            media_type=self.media_type,
        )

    async def _complete(self, observer: RequestObserver, trace_context: str | None) -> Response:
        body = await unless_disconnected(
            self.request.receive,
            self.model.frontend.complete(
                self.generation, self.chunks, self._engine(), observer, trace_context
            ),
        )
        if body is None:
            return Response(status_code=CLIENT_CLOSED_STATUS)
        return Response(body, media_type="application/json")

    def _engine(self) -> EngineRequests:
        """Its model's gate, ending each engine request that waits past the queue timeout."""
        return self.model.gate.with_deadline(self.queue_timeout)
