"""Stuck clients: a write that cannot complete in time cuts the connection.

uvicorn waits for a paused transport to drain before each write, so a client
that stops reading makes `send` wait forever, and closing the transport
gracefully would wait for that same drain. Two pieces fix both:
- `timed_send(send, timeout_s)`: a send that raises `SendTimeoutError` when one
  message cannot be handed to the transport within `timeout_s`;
- `AbortableHttpToolsProtocol`: uvicorn's httptools protocol that also puts
  the transport's `abort` into each request's scope (extension
  `ABORT_EXTENSION`), so `abort_connection(scope)` drops the socket and its
  buffers at once. uvicorn then sees a disconnect, as if the client had left.

Invariant: only a connection whose writes are stuck is ever aborted; every
other stream and the engine carry on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Message, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

ABORT_EXTENSION = "sluice.abort_connection"


class SendTimeoutError(Exception):
    """A response message could not be written in time: the client stopped reading."""


def timed_send(send: Send, timeout_s: float) -> Send:
    async def send_or_time_out(message: Message) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                await send(message)
        except TimeoutError:
            raise SendTimeoutError(f"a write waited more than {timeout_s:g} s") from None

    return send_or_time_out


def abort_connection(scope: Scope) -> bool:
    """Drop the request's connection now; False if the server gave no way to."""
    abort = scope.get("extensions", {}).get(ABORT_EXTENSION)
    if abort is None:
        return False
    abort()
    return True


class AbortableHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, exposing `transport.abort` to the app."""

    def on_message_begin(self) -> None:
        super().on_message_begin()
        extensions: dict[str, Any] = self.scope.setdefault("extensions", {})  # type: ignore[assignment]
        extensions[ABORT_EXTENSION] = self.transport.abort
