"""The connection helpers: the stuck-write watch, the body writer, the abort hook.

The watch runs in virtual time (`run_in_virtual_time`): writes last exactly
what the test says and the watch fires exactly when due, so its timing is
asserted exactly, whatever the machine's load. The writer fallback is driven
by hand on an event loop; the
uvicorn protocol's writer is checked over a real socket, under `make_server`,
with a bare ASGI app: the bytes a client reads are exactly the pieces written.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import httpx2

from sluice.config import ServerConfig
from sluice.server.http.connection import (
    ABORT_EXTENSION,
    WRITE_EXTENSION,
    StuckWriteWatch,
    abort_connection,
    body_writer,
)
from sluice.server.http.launch import make_server
from sluice.testing.event_loops import run_in_virtual_time

TIMEOUT_S = 0.05


async def watch_writes(write_s: list[float | None], gap_s: float) -> list[float]:
    """Run a watch over writes lasting `write_s` (None: never ends); when it fired."""
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    started = loop.time()
    watch = StuckWriteWatch(TIMEOUT_S, lambda: fired.append(loop.time() - started))
    try:
        for duration_s in write_s:
            watch.write_started_s = loop.time()
            await asyncio.sleep(1.0 if duration_s is None else duration_s)
            if fired:
                break
            watch.write_started_s = None
            await asyncio.sleep(gap_s)
    finally:
        watch.close()
    return fired


def test_a_write_stuck_past_the_timeout_fires_the_watch_once():
    # A 1 ms write, a 1 ms gap, then a write that never ends.
    (fired_s,) = run_in_virtual_time(watch_writes([0.001, None], gap_s=0.001))
    stuck_since_s, timer_slack_s = 0.002, 0.002
    # When the stuck write has waited the timeout (the watch's timer may fire 2 ms early).
    assert stuck_since_s + TIMEOUT_S - timer_slack_s <= fired_s <= stuck_since_s + TIMEOUT_S


def test_writes_that_complete_never_fire_however_long_the_stream_lasts():
    # 12 writes of 20 ms each, 10 ms apart: the stream outlives several timeouts.
    assert run_in_virtual_time(watch_writes([0.02] * 12, gap_s=0.01)) == []


def test_a_write_just_shorter_than_the_timeout_never_fires():
    assert run_in_virtual_time(watch_writes([TIMEOUT_S * 0.9] * 4, gap_s=0.0)) == []


def test_a_closed_watch_never_fires():
    async def scenario() -> list[int]:
        fired: list[int] = []
        watch = StuckWriteWatch(0.01, lambda: fired.append(1))
        watch.write_started_s = asyncio.get_running_loop().time()
        watch.close()
        await asyncio.sleep(0.05)
        return fired

    assert run_in_virtual_time(scenario()) == []


def test_without_the_servers_writer_body_pieces_go_through_send():
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    writer = body_writer({"type": "http"}, send)
    assert not writer.write_now(b"data: x\n\n")
    asyncio.run(writer.write(b"data: x\n\n"))
    assert sent == [{"type": "http.response.body", "body": b"data: x\n\n", "more_body": True}]


def test_the_servers_writer_is_used_when_offered():
    offered = object()

    async def send(message: dict) -> None:
        raise AssertionError("send is not used when the server offers a writer")

    scope = {"type": "http", "extensions": {WRITE_EXTENSION: offered}}
    assert body_writer(scope, send) is offered


def test_abort_connection_calls_the_servers_abort_or_says_it_could_not():
    calls: list[int] = []
    assert abort_connection({"extensions": {ABORT_EXTENSION: lambda: calls.append(1)}})
    assert calls == [1]
    assert not abort_connection({"type": "http"})


class PiecesApp:
    """ASGI: the first piece through `send`, the rest through the server's writer."""

    state = SimpleNamespace()  # make_server looks for a drain plan here

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces
        self.had_writer = False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        self.had_writer = WRITE_EXTENSION in scope.get("extensions", {})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": self.pieces[0], "more_body": True})
        writer = body_writer(scope, send)
        for piece in self.pieces[1:]:
            if not writer.write_now(piece):
                await writer.write(piece)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def test_the_protocols_writer_frames_body_pieces_as_uvicorn_would():
    pieces = [b"data: one\n\n", b"data: two\n\n", b"x" * 70_000, b"data: [DONE]\n\n"]
    app = PiecesApp(pieces)
    server = make_server(app, ServerConfig(host="127.0.0.1", port=0))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "the server stopped during startup"
            time.sleep(0.01)
        ((_, port),) = server.bound_addresses()
        response = httpx2.get(f"http://127.0.0.1:{port}/", timeout=10)
    finally:
        server.should_exit = True
        thread.join(10)
    assert app.had_writer
    assert response.headers["transfer-encoding"] == "chunked"
    assert response.content == b"".join(pieces)
