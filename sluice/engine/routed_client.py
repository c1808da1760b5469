"""What every engine client that feeds one engine shares: its sinks and its inputs.

`RoutedEngineClient` keeps the open requests' sinks in a `SinkRouter` and
turns the app's calls into the engine protocol's inputs (`AddRequest`,
`AbortRequests`, `ResetPrefixCache`), which a subclass
hands to its engine (`_send`): over ZMQ (`zmq_client`), through a queue to an engine thread
(`inproc_client`), or to the test fakes' own stepping (sluice/testing). So
the client side of the contract in `client_base` is kept in one place:

- `add_request` registers the sink, then sends; a
  dead engine refuses it.
- `abort` unregisters the sinks of the requests still open, then sends one
  AbortRequests for them: the consumer is gone, so its sink hears nothing
  more, not even the engine's final "abort" delta, which the router drops.
- `_on_step` delivers one engine step (`SinkRouter.dispatch`) and aborts the
  requests whose sinks failed on it; `_mark_dead` ends every open request
  once with EngineDeadError.
"""

from __future__ import annotations

import abc

from sluice.engine.client_base import DeltaSink, EngineClient
from sluice.engine.engine_request import EngineRequest
from sluice.engine.messages import (
    AbortRequests,
    AddRequest,
    EngineInput,
    EngineStatsSnapshot,
    ResetPrefixCache,
)
from sluice.engine.outputs import EngineError, RequestDelta
from sluice.engine.sink_router import SinkRouter
from sluice.errors import EngineDeadError


class RoutedEngineClient(EngineClient):
    def __init__(self) -> None:
        self._router = SinkRouter()
        self._stats = EngineStatsSnapshot()
        self._is_alive = False

    @abc.abstractmethod
    def _send(self, message: EngineInput) -> None:
        """Hand one input to the engine, in order, without blocking the loop."""

    def add_request(self, request: EngineRequest, sink: DeltaSink) -> None:
        if not self._is_alive:
            raise EngineDeadError("the engine is not running")
        self._router.register(request.request_id, sink)
        self._send(AddRequest(request))

    def abort(self, request_ids: list[str]) -> None:
        live = [request_id for request_id in request_ids if request_id in self._router]
        for request_id in live:
            self._router.unregister(request_id)
        if live and self._is_alive:
            self._send(AbortRequests(live))

    def reset_prefix_cache(self) -> None:
        if self._is_alive:
            self._send(ResetPrefixCache())

    @property
    def is_alive(self) -> bool:
        return self._is_alive

    def stats(self) -> EngineStatsSnapshot:
        return self._stats

    @property
    def num_open_requests(self) -> int:
        return len(self._router)

    def _on_step(
        self, deltas: list[RequestDelta], errors: list[EngineError], stats: EngineStatsSnapshot
    ) -> None:
        """One engine step's outputs, on the event loop."""
        self._stats = stats
        failed = self._router.dispatch(deltas, errors)
        if failed and self._is_alive:
            self._send(AbortRequests(failed))  # their sinks failed: free the engine's work

    def _mark_dead(self, message: str) -> None:
        self._is_alive = False
        self._router.fail_all(message)
