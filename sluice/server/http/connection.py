"""What a streamed response needs from its connection beyond plain ASGI.

- `AbortableHttpToolsProtocol`: uvicorn's httptools protocol that also puts
  into each request's scope (`extensions`) the transport's `abort`
  (`ABORT_EXTENSION`), so `abort_connection(scope)` drops the socket and its
  buffers at once (uvicorn then sees a disconnect, as if the client had
  left), and a writer of body chunks (`WRITE_EXTENSION`), so a stream can
  write each event as uvicorn's `send` would, without an ASGI message, without
  passing through every middleware's send wrapper and, when the transport is
  not paused, without a coroutine (`body_writer`).
- Each connection's kernel send buffer and its transport's high-water mark
  are `send_buffer_bytes` (ServerConfig), so a client that stops reading
  pauses its stream's transport after a bounded amount: from there its
  deltas coalesce in sluice rather than queueing in buffers.
- `unless_disconnected(receive, work)`: `work`'s result, or None once the
  client has gone (the work cancelled): the generation and pooling routes'
  way to abort an engine request whose client left before its answer.
- `StuckWriteWatch`: one timer per stream that notices a write waiting longer
  than `timeout_s` (the client stopped reading: uvicorn waits for a paused
  transport to drain before each write, forever). Only a write that has to
  wait is watched, at the cost of two attribute stores: no timeout is armed
  and cancelled per event.

Invariant: only a connection whose writes are stuck is ever aborted; every
other stream and the engine carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

ABORT_EXTENSION = "sluice.abort_connection"
WRITE_EXTENSION = "sluice.write_body"
# A timer may fire a little early (uvloop counts milliseconds): a write this
# close to its deadline counts as stuck rather than re-arming the timer.
_TIMER_SLACK_S = 0.002

T = TypeVar("T")


def abort_connection(scope: Scope) -> bool:
    """Drop the request's connection now; False if the server gave no way to."""
    abort = scope.get("extensions", {}).get(ABORT_EXTENSION)
    if abort is None:
        return False
    abort()
    return True


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None (work cancelled) if the client disconnects first.

    Waits on the ASGI receive channel, which yields `http.disconnect` once the
    body was read and the client goes away: no polling.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return None
    return task.result()


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class BodyWriter(Protocol):
    """Writes non-empty pieces of a started response's body, more to come."""

    # Whether `write_now` can ever write (else every piece goes through `write`).
    writes_now: bool

    def write_now(self, body: bytes) -> bool:
        """Write `body` if that cannot wait; False: nothing written, `await write`."""

    async def write(self, body: bytes) -> None:
        """Write `body`, waiting while the transport is paused (flow control)."""


def body_writer(scope: Scope, send: Send) -> BodyWriter:
    """The connection's own writer when the server offers one, else one over `send`.

    Only for the body between the first body message and the last, which the
    middleware passes through unchanged: the start message and the last body
    message must still go through `send`, where the middleware sees them
    (headers, access log).
    """
    writer = scope.get("extensions", {}).get(WRITE_EXTENSION)
    return _SendWriter(send) if writer is None else writer


class _SendWriter:
    """Body pieces as ASGI messages through `send`: never written at once."""

    __slots__ = ("_send",)
    writes_now = False

    def __init__(self, send: Send):
        self._send = send

    def write_now(self, body: bytes) -> bool:
        return False

    async def write(self, body: bytes) -> None:
        await self._send({"type": "http.response.body", "body": body, "more_body": True})


class _ChunkWriter:
    """`cycle.send` of a body piece with more to come, for a chunked response:
    the same flow control, the same bytes, no message to build and parse."""

    __slots__ = ("_cycle",)
    writes_now = True

    def __init__(self, cycle: RequestResponseCycle):
        self._cycle = cycle

    def write_now(self, body: bytes) -> bool:
        cycle = self._cycle
        if (
            cycle.flow.write_paused
            or cycle.disconnected
            or not cycle.chunked_encoding
            or cycle.response_complete
        ):
            return False
        cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return True

    async def write(self, body: bytes) -> None:
        cycle = self._cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if not self.write_now(body) and not cycle.disconnected:
            # Not a chunked body in progress: uvicorn decides what is right.
            await cycle.send({"type": "http.response.body", "body": body, "more_body": True})


class StuckWriteWatch:
    """Calls `on_stuck` once when a write has waited `timeout_s`.

    The writer sets `write_started_s` (loop time) before each write that may
    wait and None after it. One timer per stream checks it every `timeout_s`
    and re-arms itself for the deadline of the write in progress, so a stuck
    write is noticed `timeout_s` after it started, within the timer's precision.
    """

    __slots__ = ("write_started_s", "_loop", "_timeout_s", "_on_stuck", "_handle")

    def __init__(self, timeout_s: float, on_stuck: Callable[[], Any]):
        self.write_started_s: float | None = None
        self._loop = asyncio.get_running_loop()
        self._timeout_s = timeout_s
        self._on_stuck = on_stuck
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(timeout_s, self._check)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        started_s = self.write_started_s
        now_s = self._loop.time()
        if started_s is not None and now_s >= started_s + self._timeout_s - _TIMER_SLACK_S:
            self._handle = None
            self._on_stuck()
            return
        deadline_s = (now_s if started_s is None else started_s) + self._timeout_s
        self._handle = self._loop.call_at(deadline_s, self._check)


class AbortableHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, exposing `transport.abort` and a body
    writer to the app (see the module docstring)."""

    def __init__(self, *args: Any, send_buffer_bytes: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._send_buffer_bytes = send_buffer_bytes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self._send_buffer_bytes is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer_bytes)
        transport.set_write_buffer_limits(high=self._send_buffer_bytes)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
        extensions[ABORT_EXTENSION] = self.transport.abort

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        # No cycle of its own when the request was an upgrade: nothing to expose.
        if self.cycle is not None and self.cycle.scope is self.scope:
            extensions: dict[str, Any] = self.scope["extensions"]
            extensions[WRITE_EXTENSION] = _ChunkWriter(self.cycle)
