"""One HTTP connection to the real ASGI app, driven by the test.

`PausableConnection` is what a streamed response sees of its client through
the interfaces uvicorn gives it (sluice/server/http/connection.py): ASGI `receive`
and `send`, and the connection's body writer (`write_now`, `write`). The
test pauses and resumes it as a slow reader's TCP window would: while paused,
`write_now` refuses and `write` waits for `resume()`. Everything written, by
whichever path, lands in `events` in the order it was written, which is the
order the client would read.

    connection = PausableConnection()
    task = asyncio.create_task(connection.post(app, "/v1/completions", body))
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from sluice.server.http.connection import ABORT_EXTENSION, WRITE_EXTENSION


class PausableConnection:
    writes_now = True

    def __init__(self) -> None:
        # Body pieces in the order the client receives them.
        self.events: list[bytes] = []
        self.status: int | None = None
        self.is_complete = False
        self.is_aborted = False
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        # Set at the first body byte: the stream has started.
        self.started = asyncio.Event()

    @property
    def body(self) -> bytes:
        return b"".join(self.events)

    @property
    def is_paused(self) -> bool:
        return not self._resumed.is_set()

    def pause(self) -> None:
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    def disconnect(self) -> None:
        self._incoming.put_nowait({"type": "http.disconnect"})

    # -- the body writer (sluice.server.http.connection.BodyWriter) -------------------

    def write_now(self, body: bytes) -> bool:
        if self.is_paused or self.is_aborted:
            return False
        self.events.append(body)
        return True

    async def write(self, body: bytes) -> None:
        await self._resumed.wait()
        self.events.append(body)

    # -- ASGI ----------------------------------------------------------------------

    async def post(self, app: Any, path: str, body: dict[str, Any]) -> None:
        """Send one POST to `app` and run it until the response is complete."""
        raw = orjson.dumps(body)
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"host", b"127.0.0.1"),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(raw)).encode()),
            ],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
            "extensions": {ABORT_EXTENSION: self._abort, WRITE_EXTENSION: self},
        }
        self._incoming.put_nowait({"type": "http.request", "body": raw, "more_body": False})
        await app(scope, self._receive, self._send)

    async def _receive(self) -> dict[str, Any]:
        return await self._incoming.get()

    async def _send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            return
        if message.get("body"):
            await self._resumed.wait()
            self.events.append(message["body"])
            self.started.set()
        if not message.get("more_body", False):
            self.is_complete = True

    def _abort(self) -> None:
        self.is_aborted = True
        self.disconnect()
