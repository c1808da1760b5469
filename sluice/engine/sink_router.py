"""Routes each engine step's deltas to the sinks of their requests.

Owned by the event loop. It keeps the client-side promise of
`client_base.EngineClient`: each delta reaches its sink once, in order; after a
finishing delta or an error the sink hears nothing more; if the engine dies,
every open sink gets one EngineDeadError; a sink whose `on_delta` raises gets
that error through `on_error` (its stream ends with an error event instead of
hanging) and hears nothing more, and the other sinks carry on.
"""

from __future__ import annotations

import logging

from sluice.engine.client_base import DeltaSink
from sluice.engine.outputs import EngineError, RequestDelta
from sluice.errors import EngineDeadError, InvalidRequestError

logger = logging.getLogger("sluice.engine")


class SinkRouter:
    def __init__(self) -> None:
        self._sinks: dict[str, DeltaSink] = {}

    def __len__(self) -> int:
        return len(self._sinks)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._sinks

    def register(self, request_id: str, sink: DeltaSink) -> None:
        assert request_id not in self._sinks, f"duplicate engine request id {request_id}"
        self._sinks[request_id] = sink

    def unregister(self, request_id: str) -> None:
        self._sinks.pop(request_id, None)

    def dispatch(self, deltas: list[RequestDelta], errors: list[EngineError]) -> list[str]:
        """Deliver one step's output. Called once per engine step. Returns the
        unfinished requests whose sinks failed: nobody listens to them any more."""
        failed: list[str] = []
        for delta in deltas:
            sink = self._sinks.get(delta.request_id)
            if sink is None:
                continue  # already finished or unregistered (aborted by its consumer)
            if delta.is_finished:
                del self._sinks[delta.request_id]
            if not deliver_delta(sink, delta) and not delta.is_finished:
                del self._sinks[delta.request_id]
                failed.append(delta.request_id)
        for error in errors:
            sink = self._sinks.pop(error.request_id, None)
            if sink is not None:
                _deliver(sink.on_error, InvalidRequestError(error.message))
        return failed

    def fail_all(self, message: str) -> None:
        sinks, self._sinks = self._sinks, {}
        for sink in sinks.values():
            _deliver(sink.on_error, EngineDeadError(message))


def deliver_delta(sink: DeltaSink, delta: RequestDelta) -> bool:
    """Hand `delta` to `sink`; False when the sink failed (it then got the error)."""
    try:
        sink.on_delta(delta)
    except Exception as error:
        logger.exception("delta sink raised; its request ends with the error")
        _deliver(sink.on_error, error)
        return False
    return True


def _deliver(method, value) -> None:
    # A sink that raises must not stop the others from hearing their deltas.
    try:
        method(value)
    except Exception:
        logger.exception("delta sink raised")
