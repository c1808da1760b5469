"""A recording proxy: forwards every request to a server and keeps its body.

The agent talks to the proxy as if it were the server; the proxy sends each
request on unchanged (method, path, query, body, headers less the hop ones)
and streams the answer back as it comes, chunk by chunk, so the agent sees
the server's own events. Each request is kept as a `Recorded` with the turn
the driver set in `RecordingProxy.turn` when it arrived.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from _agent_session import RAW_TEXT, Recorded, kept_headers
from aiohttp import web

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}


class RecordingProxy:
    """aiohttp app forwarding to `upstream`; `requests` grows as the agent sends."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.turn = 0
        self.requests: list[Recorded] = []
        self._client: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def start(self, port: int) -> str:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        self._client = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._client is not None:
            await self._client.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._client is not None, "start() opens the client"
        raw = await request.read()
        record = Recorded(turn=self.turn, method=request.method, path=request.path,
                          query=request.query_string, headers=kept_headers(dict(request.headers)),
                          body=parse_body(raw))  # fmt: skip
        self.requests.append(record)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        url = self.upstream + request.path_qs
        async with self._client.request(request.method, url, data=raw, headers=headers) as answer:
            record.status = answer.status
            response = web.StreamResponse(status=answer.status)
            for name, value in answer.headers.items():
                if name.lower() not in HOP_HEADERS:
                    response.headers[name] = value
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


def parse_body(raw: bytes) -> Any:
    """The JSON body, or its text when it is not JSON, or None when empty."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {RAW_TEXT: raw.decode("utf-8", "replace")}
