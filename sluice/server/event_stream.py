"""The body of a streamed response: SSE events written with a send timeout.

`EventStreamResponse` sends the first event (already in hand, so headers go
out only once it exists) and then the frontend's events. Invariants:
- The frontend's generator is closed in every case (finished, failed, client
  gone, writes stuck), which is what aborts its engine requests.
- A write that waits more than `send_timeout_s` (the client stopped reading)
  cuts the stream and drops the connection (`sluice.server.connection`);
  nothing else ever waits on this client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from sluice.server.connection import SendTimeoutError, abort_connection, timed_send
from sluice.server.middleware import RequestLog

_DONE_EVENT = b"data: [DONE]\n\n"
logger = logging.getLogger("sluice.server")


class EventStreamResponse(StreamingResponse):
    """SSE events, the first already in hand; the event source is always closed.

    Starlette cancels the response when the client disconnects; closing the
    frontend's generator here (whether it finished, failed or was cancelled)
    is what guarantees its engine requests are aborted. A write stuck for
    `send_timeout_s` (the client stopped reading) ends it the same way, and
    drops the connection.
    """

    def __init__(
        self,
        first_event: bytes,
        events: AsyncGenerator[bytes, None],
        usage_counter: UsageCounter | None,
        send_timeout_s: float,
    ):
        self._events = events
        self._send_timeout_s = send_timeout_s
        self._body = self._chain(first_event, events, usage_counter)
        super().__init__(
            self._body,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, timed_send(send, self._send_timeout_s))
        except SendTimeoutError as error:
            logger.warning("stream cut, the client stopped reading: %s", error)
            if abort_connection(scope):
                # Let the server see the disconnect before this returns.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await receive()
        finally:
            await self._body.aclose()
            await self._events.aclose()

    @staticmethod
    async def _chain(
        first_event: bytes, events: AsyncIterator[bytes], usage_counter: UsageCounter | None
    ) -> AsyncIterator[bytes]:
        yield first_event
        async for event in events:
            if usage_counter is not None:
                usage_counter.see(event)
            yield event


class UsageCounter:
    """Completion tokens for the access log, from the usage chunk before [DONE]."""

    def __init__(self, log: RequestLog | None):
        self._log = log
        self._previous = b""

    def see(self, event: bytes) -> None:
        if event == _DONE_EVENT and self._log is not None:
            self._log.num_completion_tokens = completion_tokens(self._previous[6:])
        self._previous = event


def completion_tokens(body: bytes) -> int | None:
    try:
        usage = orjson.loads(body).get("usage") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return None
    tokens = usage.get("completion_tokens")
    return tokens if isinstance(tokens, int) else None
