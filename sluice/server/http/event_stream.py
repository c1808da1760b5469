"""The body of a streamed response: SSE events written straight to the connection.

`EventStreamResponse` is a lean ASGI response (no Starlette StreamingResponse,
no generator between it and the frontend): it sends the first event (already
in hand, so headers go out only once it exists), then each of the frontend's
events as one write, then the end of the body. This runs once per token, so
it runs in a task of its own, whose wake-ups resume two frames instead of the
whole middleware stack's. Invariants:
- The start message, the first event and the end of the body pass through the
  middleware's `send` (headers, first-byte time, access log); the events in
  between go to the connection's own writer when the server offers one
  (`connection.body_writer`), one write each, never delayed or merged. That
  writer's `write_now` is also attached to the frontend's stream, whose
  output writes delta events with it while its generator is parked, without
  waking this task (sluice/frontend/stream_output.py); the closing events
  always come through here.
- The frontend's generator is closed in every case (finished, failed, client
  gone, writes stuck), which is what aborts its engine requests.
- A client that goes away is noticed by one task waiting on `receive` for
  `http.disconnect` (no polling); it cuts the stream.
- A write that waits more than `send_timeout_s` (the client stopped reading)
  cuts the stream and drops the connection; nothing else ever waits on this
  client. One timer per stream watches for it (`StuckWriteWatch`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Literal

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sluice.frontend.serving import EventStream
from sluice.server.http.connection import StuckWriteWatch, abort_connection, body_writer

EVENT_STREAM_MEDIA_TYPE = "text/event-stream"
_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# After dropping a stuck connection, how long to wait for the server to see it.
_ABORT_NOTICE_S = 1.0
logger = logging.getLogger("sluice.server")

CutReason = Literal["disconnect", "stuck"]


class EventStreamResponse(Response):
    """SSE events, the first already in hand; the event source is always closed.

    `on_write_wait` is called for each event that
    has to wait for a paused connection; `media_type`: the events' (Ollama's
    NDJSON lines go out the same way).
    """

    def __init__(
        self,
        first_event: bytes,
        events: EventStream,
        send_timeout_s: float,
        on_write_wait: Callable[[], object] | None = None,
        media_type: str = EVENT_STREAM_MEDIA_TYPE,
    ):
        # Not Response.__init__: there is no body to render.
        self.media_type = media_type
        self.status_code = 200
        self.background = None
        self.init_headers(_HEADERS)
        self._first_event = first_event
        self._events = events
        self._send_timeout_s = send_timeout_s
        self._on_write_wait = on_write_wait

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The events are sent from a task of their own: this task's await chain
        # runs through every middleware and the router (a dozen frames), and a
        # task resumes its whole chain at every wake-up, i.e. at every token.
        cut = _StreamCut(scope)
        watch = StuckWriteWatch(self._send_timeout_s, lambda: cut("stuck"))
        sending = cut.task = asyncio.ensure_future(self._send_all(scope, send, watch))
        watcher = asyncio.ensure_future(_cut_on_disconnect(receive, cut))
        try:
            await sending  # cancelling this task cancels `sending` too
        except asyncio.CancelledError:
            if cut.reason is None or _is_cancelling():
                raise  # cancelled from outside (server shutdown): not ours to swallow
        finally:
            watch.close()
            self._events.detach()
            await self._events.aclose()
            if cut.is_aborted:  # let the server see the disconnect before this returns
                await asyncio.wait({watcher}, timeout=_ABORT_NOTICE_S)
            watcher.cancel()

    async def _send_all(self, scope: Scope, send: Send, watch: StuckWriteWatch) -> None:
        """Headers, every event, the end of the body; each write watched."""
        loop_time = asyncio.get_running_loop().time
        writer = body_writer(scope, send)
        watch.write_started_s = loop_time()
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self._first_event, "more_body": True})
        watch.write_started_s = None
        if writer.writes_now:  # delta events may now be written without waking us
            self._events.attach(writer.write_now)
        async for event in self._events:
            if not writer.write_now(event):  # only a write that must wait is watched
                if self._on_write_wait is not None:
                    self._on_write_wait()
                watch.write_started_s = loop_time()
                await writer.write(event)
                watch.write_started_s = None
        watch.write_started_s = loop_time()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        watch.write_started_s = None


class _StreamCut:
    """Why a stream was cut, once: its sending task cancelled, a stuck connection dropped."""

    __slots__ = ("reason", "is_aborted", "task", "_scope")

    def __init__(self, scope: Scope):
        self.reason: CutReason | None = None
        self.is_aborted = False
        # The task sending the events; set before anything can cut it.
        self.task: asyncio.Future[None] | None = None
        self._scope = scope

    def __call__(self, reason: CutReason) -> None:
        if self.reason is not None:
            return
        self.reason = reason
        if reason == "stuck":
            logger.warning("stream cut, the client stopped reading: a write timed out")
            self.is_aborted = abort_connection(self._scope)
        assert self.task is not None, "the sending task exists before anything runs"
        self.task.cancel()


def _is_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _cut_on_disconnect(receive: Receive, cut: _StreamCut) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    cut("disconnect")
