"""One pooling API request's engine request: run it, abort it if its client
leaves, and account for it (access log, API key, metrics, trace).

`pool` queues the request's inputs as one engine request and waits for its
one answer while watching the connection (`connection.unless_disconnected`,
as the generation routes do): a client that disconnects first gets its
engine request aborted at once, counted as aborted (`sluice:request_aborted`)
and answered `ClientGone`, which `answering_disconnects` turns into the
access log's 499. A request that finishes is recorded in the model's request
series under vLLM's names, as vLLM counts its pooling requests: its prompt
tokens (`vllm:prompt_tokens`, `vllm:request_prompt_tokens`), one success with
finished_reason "stop" (`vllm:request_success`) and its latency
(`vllm:e2e_request_latency_seconds`), all labelled with the model's
`model_name` (and the API key's name where there is one). With tracing on,
the request's span gets the model, its input tokens and its finish.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable

from fastapi import Request
from starlette.responses import Response

from sluice.engine.client_base import QueueTimeout
from sluice.engine.engine_request import pooling_request
from sluice.engine.outputs import PooledOutput, RequestDelta
from sluice.engine.pooling_params import PoolingInput, PoolingParams
from sluice.server.http.connection import unless_disconnected
from sluice.server.http.middleware import CLIENT_CLOSED_STATUS
from sluice.server.in_flight.request_context import context_of
from sluice.server.served_models.model_parts import ModelParts


class ClientGone(Exception):
    """The client disconnected before its answer; its engine request was aborted."""


def answering_disconnects(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """`handler`, answering 499 (the access log's; the client reads nothing)
    when its client went away."""

    @functools.wraps(handler)
    async def handle(request: Request) -> Response:
        try:
            return await handler(request)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED_STATUS)

    return handle


async def pool(
    request: Request,
    parts: ModelParts,
    inputs: list[PoolingInput],
    params: PoolingParams,
    queue_timeout: QueueTimeout | None,
) -> tuple[PooledOutput, int]:
    """Run one engine request on `parts`' engine: (its pooled vectors, its
    tokens); ClientGone (the request aborted) if the client leaves first."""
    started_s = time.perf_counter()
    num_tokens = sum(len(one.token_ids) for one in inputs)
    request_id = f"pool-{uuid.uuid4().hex}"
    context = context_of(request.scope)
    context.received(request_id, parts.name, num_tokens)
    if context.key_lease is not None:
        context.key_lease.reserve(num_tokens, 0)
    # Its key's series (else the model's), told to its trace too when traced.
    observer = context.observer(parts.metrics)
    sink = _PooledSink()
    gate = parts.gate
    gate.with_deadline(queue_timeout).add_request(pooling_request(request_id, inputs, params), sink)
    try:
        delta = await unless_disconnected(request.receive, sink.result)
    except asyncio.CancelledError:
        gate.abort([request_id])
        observer.on_abort()
        raise
    if delta is None:
        gate.abort([request_id])
        observer.on_abort()
        raise ClientGone
    assert delta.pooled is not None, "a pooling request finishes with its vectors"
    observer.on_finish(num_tokens, 0, time.perf_counter() - started_s, "stop")
    return delta.pooled, num_tokens


class _PooledSink:
    """The engine's one answer to a pooling request, as a future."""

    def __init__(self) -> None:
        self.result: asyncio.Future[RequestDelta] = asyncio.get_running_loop().create_future()

    def on_delta(self, delta: RequestDelta) -> None:
        if delta.pooled is not None and not self.result.done():
            self.result.set_result(delta)

    def on_error(self, error: BaseException) -> None:
        if not self.result.done():
            self.result.set_exception(error)
