"""The contract between the frontend (on the event loop) and an engine.

An engine client lives on the asyncio event loop. Requests are added with a
sink; the client calls the sink's methods on the event loop thread only, once
per engine step for the whole batch (never one loop callback per token):

    frontend ──add_request(EngineRequest, sink)──▶ client ──▶ engine core
    frontend ◀──sink.on_delta(RequestDelta) / sink.on_error(exc)── client

Guarantees every implementation keeps:
- every delta of a request reaches its sink exactly once, in engine order;
- after a delta with a finish_reason, after on_error, or after `abort`, the
  sink hears nothing more: an aborting consumer is gone, so not even the
  engine's final "abort" delta reaches it. The engine frees the request at
  its next step. `abort` is idempotent; unknown or finished ids are ignored;
- if the engine dies, every open sink gets on_error(EngineDeadError) once;
- a sink whose on_delta raises gets that error through on_error, then nothing
  more (`sink_router.deliver_delta`), and its request is aborted; the other
  sinks are not affected.

The port has two sides: `EngineRequests` (add_request, abort: what the
frontend uses; a request is one `engine_request.EngineRequest` value) and `EngineHandle` (start, shutdown, restart,
stats, replicas, reset_prefix_cache, is_alive: what the app's model pool,
supervisor, health and metrics use); an `EngineClient` is both. The clients
of one engine keep the guarantees in one place, `routed_client.RoutedEngineClient`
(the process, in-process and Ray replica clients, and the test fakes); the
wrappers keep them by passing calls on to such clients, and implement only
the side they change: the `AdmissionGate` the requests (its engine's handle
is `gate.engine`), `DataParallelEngineClient` both (it routes requests and
sums its replicas' state).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Protocol

import msgspec

from sluice.engine.engine_request import EngineRequest
from sluice.engine.messages import EngineReady, EngineStatsSnapshot
from sluice.engine.outputs import RequestDelta


class ReplicaState(msgspec.Struct, frozen=True):
    """One engine replica behind a client, as /health and /metrics show it."""

    # The replica's name in metrics labels ("0", "1", ...).
    name: str
    # Where it runs (the node's IP for a Ray replica).
    node: str
    is_healthy: bool
    # Requests the router sent here since the server started.
    num_requests_routed: int
    # ...of which for the prompt's cached prefix (prefix affinity).
    num_routed_by_prefix: int
    # Routing load now: prompt tokens not yet prefilled + max_tokens left.
    num_outstanding_tokens: int
    # Times it was replaced after a death or hang.
    num_restarts: int
    stats: EngineStatsSnapshot


@dataclass(slots=True, eq=False)
class QueueTimeout:
    """The longest one API request may wait for its first token: a value its
    engine requests (one per choice) share. The `AdmissionGate` enforces it
    (sluice/server/in_flight/admission.py, `with_deadline`); engines never see it."""

    timeout_s: float
    # Set when the first of its engine requests ran out of time, so that the
    # refusal counts once per API request however many choices waited.
    has_expired: bool = False


class DeltaSink(Protocol):
    def on_delta(self, delta: RequestDelta) -> None: ...

    def on_error(self, error: BaseException) -> None: ...


class EngineRequests(abc.ABC):
    """The request side of the port: what the frontend uses, per API request.
    An engine's client implements it (`EngineClient`); so does a wrapper that
    changes how requests go in (the `AdmissionGate`), and only it."""

    @abc.abstractmethod
    def add_request(self, request: EngineRequest, sink: DeltaSink) -> None:
        """Queue `request` (generation or pooling: its payload says; a pooling
        request's one finishing delta carries `pooled`, a vector per input).
        Raises EngineDeadError if the engine is down."""

    @abc.abstractmethod
    def abort(self, request_ids: list[str]) -> None:
        """Cancel requests: their sinks hear nothing more from now on, the
        engine frees them at its next step; unknown or finished ids, and any
        id once the engine is dead, are ignored."""


class EngineHandle(abc.ABC):
    """The lifecycle side of the port: what the app's model pool, supervisor,
    health and metrics use of one engine (replicated or not)."""

    # Whether `restart` can replace a dead engine; the app supervises those.
    can_restart: bool = False
    # What the engine said once it came up: the model it loaded (the app
    # checks it against its `ServedModel`). None before `start`, and for an
    # engine that loads no model (the test fakes).
    info: EngineReady | None = None

    @abc.abstractmethod
    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix block (running requests are unaffected);
        takes effect before the engine's next step."""

    @property
    @abc.abstractmethod
    def is_alive(self) -> bool: ...

    @abc.abstractmethod
    def stats(self) -> EngineStatsSnapshot:
        """The engine's state after its latest step (read by /metrics at scrape time)."""

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def shutdown(self) -> None: ...

    def replicas(self) -> list[ReplicaState]:
        """The engine replicas behind this client (data parallel), one entry
        each; empty for a single engine, whose health is `is_alive`."""
        return []

    async def restart(self) -> None:
        """Replace a dead engine with a fresh one (only where `can_restart`);
        raises ModelLoadError on failure."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart")


class EngineClient(EngineRequests, EngineHandle):
    """Everything the app needs of an engine: its requests and its handle.
    What the app needs of the model (name, tokenizer, context length) is a
    `ServedModel` value beside it."""
