"""EventStreamResponse on a hand-driven ASGI connection: what goes where, and
the event source is closed whatever ends the stream (done, disconnect, stuck
writes, server cancellation)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from sluice.frontend.serving import EventStream
from sluice.frontend.stream_output import StreamOutput
from sluice.server.http.connection import ABORT_EXTENSION, WRITE_EXTENSION
from sluice.server.http.event_stream import EventStreamResponse

USAGE_EVENT = b'data: {"choices":[],"usage":{"completion_tokens":7}}\n\n'
DONE_EVENT = b"data: [DONE]\n\n"


@dataclass
class Source:
    """An event source that records being closed; `endless` never finishes."""

    events: list[bytes]
    endless: bool = False
    is_closed: bool = False

    async def generate(self):
        try:
            for event in self.events:
                yield event
            while self.endless:
                await asyncio.sleep(0.001)
                yield b"data: more\n\n"
        finally:
            self.is_closed = True


@dataclass
class Connection:
    """The ASGI side: what went through `send`, what through the writer."""

    writes_now = True

    sent: list[dict] = field(default_factory=list)
    written: list[bytes] = field(default_factory=list)
    incoming: asyncio.Queue = field(default_factory=asyncio.Queue)
    aborted: bool = False
    # Set to make every write wait forever (a client that stopped reading).
    is_stuck: bool = False

    def scope(self) -> dict:
        return {"type": "http", "extensions": {ABORT_EXTENSION: self.abort, WRITE_EXTENSION: self}}

    def write_now(self, body: bytes) -> bool:
        if self.is_stuck:
            return False
        self.written.append(body)
        return True

    async def receive(self) -> dict:
        return await self.incoming.get()

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    async def write(self, body: bytes) -> None:
        if self.is_stuck:
            await asyncio.Event().wait()
        self.written.append(body)

    def abort(self) -> None:
        self.aborted = True
        self.incoming.put_nowait({"type": "http.disconnect"})


async def respond(source: Source, connection: Connection, **options) -> None:
    first, *rest = source.events
    source.events = rest
    events = EventStream(source.generate(), StreamOutput(1, lambda taken: []))
    response = EventStreamResponse(first, events, options.pop("send_timeout_s", 30.0), **options)
    await response(connection.scope(), connection.receive, connection.send)


def test_headers_first_event_and_end_go_through_send_the_rest_through_the_writer():
    source = Source([b"data: 1\n\n", b"data: 2\n\n", USAGE_EVENT, DONE_EVENT])
    connection = Connection()
    asyncio.run(respond(source, connection))
    start, first, end = connection.sent
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    assert first == {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True}
    assert end == {"type": "http.response.body", "body": b"", "more_body": False}
    assert connection.written == [b"data: 2\n\n", USAGE_EVENT, DONE_EVENT]
    assert source.is_closed


def test_a_disconnect_cuts_the_stream_closes_the_source_and_returns_quietly():
    async def scenario() -> tuple[Source, Connection]:
        source, connection = Source([b"data: 1\n\n"], endless=True), Connection()
        task = asyncio.ensure_future(respond(source, connection))
        await asyncio.sleep(0.02)
        connection.incoming.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(task, 5)  # returns: no CancelledError escapes
        return source, connection

    source, connection = asyncio.run(scenario())
    assert source.is_closed and not connection.aborted
    assert connection.written  # it was streaming until then
    assert connection.sent[-1]["more_body"] is True  # the body never ended


def test_a_write_stuck_past_the_send_timeout_drops_the_connection():
    async def scenario() -> tuple[Source, Connection]:
        source, connection = Source([b"data: 1\n\n"], endless=True), Connection(is_stuck=True)
        await asyncio.wait_for(respond(source, connection, send_timeout_s=0.05), 5)
        return source, connection

    source, connection = asyncio.run(scenario())
    assert connection.aborted and source.is_closed
    assert connection.written == []


def test_a_cancellation_from_the_server_propagates_and_still_closes_the_source():
    async def scenario() -> Source:
        source, connection = Source([b"data: 1\n\n"], endless=True), Connection()
        task = asyncio.ensure_future(respond(source, connection))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return source

    assert asyncio.run(scenario()).is_closed


def test_a_failing_source_fails_the_response_and_is_closed():
    class Broken(Source):
        async def generate(self):
            try:
                yield b"data: 1\n\n"
                raise RuntimeError("bug")
            finally:
                self.is_closed = True

    source = Broken([])
    events = EventStream(source.generate(), StreamOutput(1, lambda taken: []))

    async def scenario() -> None:
        first = await anext(events)
        connection = Connection()
        response = EventStreamResponse(first, events, 30.0)
        await response(connection.scope(), connection.receive, connection.send)

    with pytest.raises(RuntimeError, match="bug"):
        asyncio.run(scenario())
    assert source.is_closed
