"""Admission control at the edge: a bounded queue, queue timeouts, a drain switch.

`AdmissionGate` wraps the request side of the engine client the frontend
talks to (`EngineRequests`: add_request, abort); the
engine's handle (start, shutdown, stats, health) is `gate.engine`'s. Each engine
request is counted from `add_request` until its sink hears its finish or an
error, or it is aborted. Invariants:
- At most `capacity` engine requests are in flight (running + waiting). The
  engine runs at most max_num_seqs at once, so capacity = max_num_seqs +
  max_waiting_requests bounds its waiting queue. Beyond it `add_request`
  raises QueueFullError at once (503 with Retry-After): nothing piles up.
  An API request whose choices could never all be admitted is a 400 naming
  `n` (`check_open`): retrying could not help.
- A request added through `with_deadline(QueueTimeout)` (the longest its API request may wait
  for its first token: the X-Sluice-Queue-Timeout header or --queue-timeout-s)
  that has produced nothing when it runs out is aborted in the engine and its
  sink gets one QueueTimeoutError: a 503 if its stream has not started, an
  error event and [DONE] if it has. Never a silent drop. The choices of one
  API request share their QueueTimeout: the refusal counts once.
- While draining (shutdown), `add_request` refuses with ServiceUnavailableError;
  `fail_all` ends every open request with one error and aborts it in the engine.
- A sink hears nothing after its finish or its error, also when the gate
  itself ended the request (the wrapped client's promise, kept).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.config import SchedulerConfig
from sluice.engine.client_base import DeltaSink, EngineClient, EngineRequests, QueueTimeout
from sluice.engine.engine_request import EngineRequest
from sluice.engine.outputs import RequestDelta
from sluice.errors import InvalidRequestError, QueueFullError, ServiceUnavailableError

# Request header: the longest this request may wait for its first token, in seconds.
QUEUE_TIMEOUT_HEADER = "x-sluice-queue-timeout"


class QueueTimeoutError(ServiceUnavailableError):
    """The request waited past its queue timeout without producing a token."""


class ShuttingDownError(ServiceUnavailableError):
    """The server is draining for shutdown and takes no new requests."""


_DECIMAL_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?|\.[0-9]+", re.ASCII)


def queue_timeout_s(header_value: str | None, default_s: float | None) -> float | None:
    """The queue timeout a request asked for (header), else the server's default.

    Seconds in ASCII decimal ("5", "0.25", ".5"): `float()` alone would also
    take signs, exponents, underscores, "nan" and other scripts' digits."""
    if header_value is None:
        return default_s
    timeout_s = float("nan")
    if _DECIMAL_SECONDS.fullmatch(header_value):
        timeout_s = float(header_value)
    if not 0 < timeout_s < 86_400:  # NaN fails too
        raise InvalidRequestError(
            f"{QUEUE_TIMEOUT_HEADER} must be a number of seconds in (0, 86400)",
            param=QUEUE_TIMEOUT_HEADER,
        )
    return timeout_s


def capacity_of(config: SchedulerConfig) -> int:
    return config.max_num_seqs + config.max_waiting_requests


class _TrackedSink:
    """Forwards one engine request's output until it ends; then hears nothing."""

    __slots__ = ("_gate", "_request_id", "_sink", "timeout_handle", "is_open")

    def __init__(self, gate: AdmissionGate, request_id: str, sink: DeltaSink):
        self._gate = gate
        self._request_id = request_id
        self._sink = sink
        self.timeout_handle: asyncio.TimerHandle | None = None
        self.is_open = True

    def on_delta(self, delta: RequestDelta) -> None:
        # Runs for every engine step of every request: the checks are inlined.
        if not self.is_open:
            return
        if self.timeout_handle is not None:
            self.cancel_timeout()  # it produced something: no longer waiting
        if delta.finish_reason is not None:
            self._gate._release(self._request_id)
        self._sink.on_delta(delta)

    def on_error(self, error: BaseException) -> None:
        if self.end():
            self._sink.on_error(error)

    def end(self) -> bool:
        """Stop forwarding; True if it was still open."""
        if not self.is_open:
            return False
        self.cancel_timeout()
        self._gate._release(self._request_id)
        return True

    def cancel_timeout(self) -> None:
        if self.timeout_handle is not None:
            self.timeout_handle.cancel()
            self.timeout_handle = None


class AdmissionGate(EngineRequests):
    """The requests of `engine`, at most `capacity` of them at once."""

    def __init__(self, engine: EngineClient, capacity: int):
        assert capacity >= 1, "the gate must admit at least one request"
        self.engine = engine
        self.capacity = capacity
        self.is_draining = False
        self._open: dict[str, _TrackedSink] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        # Requests refused or cut by the gate, by reason (read by /metrics).
        self.num_refused = {"queue_full": 0, "queue_timeout": 0, "shutting_down": 0}

    @property
    def num_in_flight(self) -> int:
        return len(self._open)

    @property
    def is_full(self) -> bool:
        return len(self._open) >= self.capacity

    def check_open(self, num_engine_requests: int = 1) -> None:
        """Refuse at once, before any work, an API request whose engine requests
        (one per choice) could not all be admitted now (503), or ever (400)."""
        if num_engine_requests > self.capacity:
            raise InvalidRequestError(
                f"the request asks for {num_engine_requests} choices at once (n times the "
                f"prompts); this server admits at most {self.capacity} "
                "(--max-num-seqs + --max-waiting-requests)",
                param="n",
            )
        if self.is_draining:
            self.num_refused["shutting_down"] += 1
            raise ShuttingDownError("the server is shutting down; retry on another instance")
        if len(self._open) + num_engine_requests > self.capacity:
            self.num_refused["queue_full"] += 1
            raise QueueFullError(
                f"the waiting queue is full ({self.capacity} requests in flight); retry later"
            )

    # -- EngineRequests ----------------------------------------------------------

    def with_deadline(self, queue_timeout: QueueTimeout | None) -> EngineRequests:
        """The gate's requests of one API request, each ended with
        QueueTimeoutError if it produces nothing within `queue_timeout` (its
        choices share it); None: the gate itself (no deadline)."""
        return self if queue_timeout is None else _DeadlineRequests(self, queue_timeout)

    def add_request(self, request: EngineRequest, sink: DeltaSink) -> None:
        """Admit and add one engine request (no deadline: `with_deadline`)."""
        self._add_request(request, sink, None)

    def _add_request(
        self, request: EngineRequest, sink: DeltaSink, queue_timeout: QueueTimeout | None
    ) -> None:
        tracked = self._admit(request.request_id, sink)
        try:
            self.engine.add_request(request, tracked)
        except BaseException:
            tracked.end()
            raise
        self._start_timeout(request.request_id, tracked, queue_timeout)

    def _admit(self, request_id: str, sink: DeltaSink) -> _TrackedSink:
        self.check_open()
        tracked = _TrackedSink(self, request_id, sink)
        self._open[request_id] = tracked
        self._idle.clear()
        return tracked

    def _start_timeout(
        self, request_id: str, tracked: _TrackedSink, queue_timeout: QueueTimeout | None
    ) -> None:
        if queue_timeout is not None and tracked.is_open:
            loop = asyncio.get_running_loop()
            tracked.timeout_handle = loop.call_later(
                queue_timeout.timeout_s, self._expire, request_id, queue_timeout
            )

    def abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            tracked = self._open.get(request_id)
            if tracked is not None:
                tracked.end()
        self.engine.abort(request_ids)

    # -- draining ----------------------------------------------------------------

    def start_draining(self) -> None:
        """Refuse every new request from now on."""
        self.is_draining = True

    async def until_idle(self) -> None:
        """Return once no request is in flight."""
        await self._idle.wait()

    def kill(self) -> None:
        """Kill the engine now where it can be killed (a forced exit)."""
        kill = getattr(self.engine, "kill", None)
        if kill is not None:
            kill()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight; False if `timeout_s` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def fail_all(self, error: ServiceUnavailableError) -> int:
        """End every open request with `error` and abort it in the engine; how many."""
        request_ids = list(self._open)
        for request_id in request_ids:
            self._open[request_id].on_error(error)
        if request_ids and self.engine.is_alive:
            self.engine.abort(request_ids)
        return len(request_ids)

    # -- internals -----------------------------------------------------------------

    def _expire(self, request_id: str, queue_timeout: QueueTimeout) -> None:
        tracked = self._open.get(request_id)
        if tracked is None:
            return
        tracked.timeout_handle = None
        if not queue_timeout.has_expired:  # its API request's first choice to run out
            queue_timeout.has_expired = True
            self.num_refused["queue_timeout"] += 1
        tracked.on_error(
            QueueTimeoutError(
                f"the request waited {queue_timeout.timeout_s:g} s without being served "
                "(queue timeout); retry later"
            )
        )
        if self.engine.is_alive:
            self.engine.abort([request_id])

    def _release(self, request_id: str) -> None:
        tracked = self._open.pop(request_id, None)
        if tracked is not None:
            tracked.is_open = False
        if not self._open:
            self._idle.set()


class _DeadlineRequests(EngineRequests):
    """The gate's requests of one API request, which share its queue timeout."""

    def __init__(self, gate: AdmissionGate, queue_timeout: QueueTimeout):
        self._gate = gate
        self._queue_timeout = queue_timeout

    def add_request(self, request: EngineRequest, sink: DeltaSink) -> None:
        self._gate._add_request(request, sink, self._queue_timeout)

    def abort(self, request_ids: list[str]) -> None:
        self._gate.abort(request_ids)


class AdmissionCounts(Protocol):
    """What /metrics reads of one model's admission (its gates', stopped ones' too)."""

    @property
    def num_in_flight(self) -> int: ...

    @property
    def num_refused(self) -> dict[str, int]: ...


class AdmissionCollector(Collector):
    """/metrics: each model's requests in flight and requests its gate refused,
    by reason (labelled `model_name`); `read()` gives {model name: counts}."""

    def __init__(self, read: Callable[[], Mapping[str, AdmissionCounts]]):
        self._read = read

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            "sluice:num_requests_in_flight",
            "Engine requests admitted and not yet ended.",
            labels=["model_name"],
        )
        refused = CounterMetricFamily(
            "sluice:requests_refused",
            "Requests refused (queue full, shutting down) or cut (queue timeout).",
            labels=["model_name", "reason"],
        )
        for model_name, counts in self._read().items():
            in_flight.add_metric([model_name], counts.num_in_flight)
            for reason, count in counts.num_refused.items():
                refused.add_metric([model_name, reason], count)
        yield in_flight
        yield refused
