"""The HTTP client of one audited server (aiohttp, nothing else of sluice).

`Client.send` fills an `Exchange` with the response exactly as it arrived:
every piece of the body with its arrival time. Three readers:
- normal: take pieces as fast as they come;
- slow: take a few hundred bytes from the socket, sleep, repeat. Slow readers
  use their own connections with a small receive buffer and a small read
  buffer, so the server's writes back up instead of landing in our memory;
- abandon: close the connection after a few events (a client that goes away);
- pause: read the first event(s), then nothing until told to resume (or a
  while passed), then everything as it comes: on a small-buffer connection,
  a server's writes back up for the whole pause, and a server that merges
  deltas must merge them then.

Transport failures never raise: they are recorded in `transport_error`.
A request that fails on a reused pooled connection before any byte of an
answer came was never taken: the server had closed that connection after its
previous response (llama-server does so after each stream while advertising
keep-alive). It is sent once more on a fresh connection, marked `is_retried`,
and the server's habit is reported once, as a note (`closed_connection_note`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from sluice.audit.checks.evidence import scenario_finding
from sluice.audit.progress import Progress
from sluice.audit.records import Exchange, Finding, Reader, Target

# Set before connect, so the window the server sees is small from the start.
SLOW_RECEIVE_BUFFER_BYTES = 4096
SLOW_READ_BUFFER_BYTES = 1024
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
# Readers whose connections have a small receive buffer and a small read buffer.
_SMALL_BUFFER_READERS = frozenset({"slow", "pause"})


@dataclass(slots=True)
class Probe:
    """The answer to a GET (or a tiny request) used to time the server."""

    status: int | None
    latency_s: float
    body: bytes
    error: str | None

    @property
    def is_ok(self) -> bool:
        return self.error is None and self.status is not None and self.status < 300


def _small_buffer_socket(addr_info: Any) -> socket.socket:
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RECEIVE_BUFFER_BYTES)
    return sock


# How long an idle pooled connection is kept for reuse.
IDLE_CONNECTION_S = 1.0


@dataclass(slots=True)
class _Attempt:
    """One request's trace context: aiohttp tells whether its connection was pooled."""

    is_reused: bool = False


async def _mark_reused(session: Any, context: Any, params: Any) -> None:
    if isinstance(context.trace_request_ctx, _Attempt):  # GETs carry none
        context.trace_request_ctx.is_reused = True


def _never_answered(exchange: Exchange) -> bool:
    """Failed before any byte of an answer: the server never took the request."""
    return exchange.transport_error is not None and exchange.status is None and not exchange.raw


async def _pause(reader: Reader) -> None:
    """Until the reader's `resume` is set, at most `pause_s`."""
    if reader.resume is None:
        await asyncio.sleep(reader.pause_s)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(reader.resume.wait(), reader.pause_s)


class Client:
    def __init__(
        self, target: Target, *, timeout_s: float, origin_s: float, progress: Progress | None = None
    ):
        self.target = target
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=timeout_s)
        self._origin_s = origin_s
        self._progress = progress
        # (is slow reader, is fresh connection) -> session.
        self._sessions: dict[tuple[bool, bool], aiohttp.ClientSession] = {}
        # Requests that failed on a dead pooled connection, and the first error.
        self._stale_failures = 0
        self._stale_error = ""

    async def __aenter__(self) -> Client:
        for is_slow in (False, True):
            for is_fresh in (False, True):
                self._sessions[(is_slow, is_fresh)] = self._new_session(is_slow, is_fresh)
        return self

    def _new_session(self, is_slow: bool, is_fresh: bool) -> aiohttp.ClientSession:
        # Idle pooled connections are dropped well before a server's own
        # keep-alive timeout (uvicorn's is 5 s), so fewer requests meet a
        # connection the server is closing; fresh sessions never pool.
        trace = aiohttp.TraceConfig()
        trace.on_connection_reuseconn.append(_mark_reused)
        connector = aiohttp.TCPConnector(
            limit=0,
            keepalive_timeout=None if is_fresh else IDLE_CONNECTION_S,
            force_close=is_fresh,
            socket_factory=_small_buffer_socket if is_slow else None,
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            read_bufsize=SLOW_READ_BUFFER_BYTES if is_slow else 2**16,
            trace_configs=[trace],
        )

    async def __aexit__(self, *exc_info: object) -> None:
        for session in self._sessions.values():
            await session.close()

    def closed_connection_note(self) -> Finding | None:
        """One note when the server closed kept-alive connections under requests."""
        if not self._stale_failures:
            return None
        message = (
            f"{self._stale_failures} requests sent on a kept-alive connection failed before "
            f"any response byte ({self._stale_error}); each was retried on a fresh connection"
        )
        return scenario_finding(
            "connection_closed_after_response", "transport", self.target.label, message
        )

    def now_s(self) -> float:
        return time.perf_counter() - self._origin_s

    def _headers(self, content_type: str = "application/json") -> dict[str, str]:
        headers = {"Content-Type": content_type}
        if self.target.api_key:
            headers["Authorization"] = f"Bearer {self.target.api_key}"
        return headers

    async def send(self, exchange: Exchange, reader: Reader | None = None) -> Exchange:
        """POST the exchange's body and record the response into it."""
        reader = reader or Reader()
        exchange.reader = reader.kind
        assert self._sessions, "use Client inside `async with`"
        data = exchange.raw_request
        if data is None:
            data = json.dumps(exchange.body, ensure_ascii=False).encode()
        if self._progress is not None:
            self._progress.request_started()
        exchange.sent_s = self.now_s()
        is_reused = await self._post(exchange, reader, data, is_fresh=False)
        if is_reused and _never_answered(exchange):
            self._stale_failures += 1
            self._stale_error = self._stale_error or str(exchange.transport_error)
            exchange.transport_error, exchange.is_retried = None, True
            await self._post(exchange, reader, data, is_fresh=True)
        exchange.end_s = self.now_s()
        if self._progress is not None:
            self._progress.request_finished(exchange.is_ok or exchange.expects_error)
        return exchange

    async def _post(
        self, exchange: Exchange, reader: Reader, data: bytes, *, is_fresh: bool
    ) -> bool:
        """One attempt; whether it went out on a reused pooled connection."""
        session = self._sessions[(reader.kind in _SMALL_BUFFER_READERS, is_fresh)]
        attempt = _Attempt()
        try:
            url = self.target.base_url + exchange.endpoint
            async with session.post(
                url, data=data, headers=self._headers(), trace_request_ctx=attempt
            ) as response:
                exchange.status = response.status
                exchange.content_type = response.headers.get("Content-Type", "")
                exchange.retry_after = response.headers.get("Retry-After")
                exchange.headers_s = self.now_s()
                await self._read(response, exchange, reader)
        except _TRANSPORT_ERRORS as error:
            exchange.transport_error = f"{type(error).__name__}: {error}".strip()
        return attempt.is_reused

    async def _read(
        self, response: aiohttp.ClientResponse, exchange: Exchange, reader: Reader
    ) -> None:
        pieces: list[bytes] = []
        try:
            await self._read_pieces(response, exchange, reader, pieces)
        finally:
            exchange.raw = b"".join(pieces)

    async def _read_pieces(
        self,
        response: aiohttp.ClientResponse,
        exchange: Exchange,
        reader: Reader,
        pieces: list[bytes],
    ) -> None:
        received, separators, last_byte, has_paused = 0, 0, b"", False
        stream = response.content
        while piece := await (
            stream.read(reader.read_bytes) if reader.kind == "slow" else stream.readany()
        ):
            pieces.append(piece)
            received += len(piece)
            exchange.arrival_offsets.append(received)
            exchange.arrival_times_s.append(self.now_s())
            if reader.kind == "slow":
                await asyncio.sleep(reader.interval_s)
                continue
            separators += (last_byte + piece).count(b"\n\n")
            last_byte = piece[-1:]
            if reader.kind == "abandon" and separators >= reader.abandon_after_events:
                response.close()  # drops the connection: the server sees a disconnect
                return
            if (
                reader.kind == "pause"
                and not has_paused
                and separators >= reader.pause_after_events
            ):
                has_paused = True
                await _pause(reader)

    async def get(self, path: str) -> Probe:
        assert self._sessions, "use Client inside `async with`"
        started_s = self.now_s()
        try:
            async with self._sessions[(False, False)].get(
                self.target.base_url + path, headers=self._headers()
            ) as response:
                body = await response.read()
                return Probe(response.status, self.now_s() - started_s, body, None)
        except _TRANSPORT_ERRORS as error:
            return Probe(None, self.now_s() - started_s, b"", f"{type(error).__name__}: {error}")
