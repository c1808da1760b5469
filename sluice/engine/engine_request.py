"""One engine request as the frontend hands it to the engine: a frozen value.

The frontend builds it once per engine request (one per choice; one per
pooling API request) and every wrapper on the way passes it on unchanged:

    frontend ──EngineRequest──▶ AdmissionGate ──▶ DataParallelEngineClient
        ──▶ RoutedEngineClient ──AddRequest(request), msgpack──▶ engine core

Its payload says what to run: `Generation` (a prompt to continue, sampled)
or `Pooling` (inputs to turn into vectors). One type with a tagged payload
rather than two request types, because the port does the same thing with
either (admit, count, route a sink, send, abort by id): one `add_request`
per wrapper instead of two, and only the two cores and the replica router
look inside. The engine's own mutable state of a request is another type
(`engine/request.py`'s `Request`, built from this one by the core).

Token ids are tuples: the value is shared by every wrapper (and, for the
choices of one prompt, by several requests), so nothing may change it in
place; the core copies the prompt once into the list its `Request` appends to.
It crosses the process boundary as msgpack (`messages.AddRequest`), decoded
into an equal fresh value.
"""

from __future__ import annotations

import msgspec

from sluice.engine.pooling_params import PoolingInput, PoolingParams
from sluice.engine.sampling_params import SamplingParams


class Generation(msgspec.Struct, frozen=True, tag="generate"):
    """Continue a prompt, sampling with `params`."""

    prompt_token_ids: tuple[int, ...]
    params: SamplingParams


class Pooling(msgspec.Struct, frozen=True, tag="pool"):
    """Pool each input into one vector (an embedder's or a reranker's engine):
    answered by one finishing delta whose `pooled` holds a vector per input."""

    inputs: tuple[PoolingInput, ...]
    params: PoolingParams


class EngineRequest(msgspec.Struct, frozen=True):
    # Unique among the engine's live requests; the sink and abort key.
    request_id: str
    payload: Generation | Pooling
    # The W3C traceparent of the API request's span (sluice/tracing.py):
    # the engine's spans continue that trace. None: not traced.
    trace_context: str | None = None


def generation_request(
    request_id: str,
    prompt_token_ids: tuple[int, ...] | list[int],
    params: SamplingParams,
    trace_context: str | None = None,
) -> EngineRequest:
    """An engine request that continues `prompt_token_ids`."""
    return EngineRequest(request_id, Generation(tuple(prompt_token_ids), params), trace_context)


def pooling_request(
    request_id: str,
    inputs: tuple[PoolingInput, ...] | list[PoolingInput],
    params: PoolingParams,
    trace_context: str | None = None,
) -> EngineRequest:
    """An engine request that pools each of `inputs` into one vector."""
    return EngineRequest(request_id, Pooling(tuple(inputs), params), trace_context)
