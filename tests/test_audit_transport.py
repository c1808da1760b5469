"""The client records bodies piece by piece, reads slowly, abandons, and never raises."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time

from sluice.audit.records import CHAT, COMPLETIONS, Exchange, Reader, Target
from sluice.audit.transport import Client
from tests.broken_servers import MODEL, ScriptServer

STREAM = {"model": MODEL, "prompt": "Once", "max_tokens": 40, "stream": True, "logprobs": 2}


async def with_server(body):
    server = ScriptServer(token_delay_s=0.002)
    url = await server.start()
    try:
        async with Client(
            Target("server", url, MODEL), timeout_s=10, origin_s=time.perf_counter()
        ) as client:
            return await body(client, server)
    finally:
        await server.stop()


def test_a_stream_is_recorded_byte_for_byte_with_increasing_arrival_times():
    async def body(client: Client, server: ScriptServer) -> Exchange:
        return await client.send(Exchange("s", "server", COMPLETIONS, dict(STREAM)))

    exchange = asyncio.run(with_server(body))
    assert exchange.status == 200 and exchange.content_type.startswith("text/event-stream")
    assert exchange.raw.endswith(b"data: [DONE]\n\n")
    assert exchange.arrival_offsets[-1] == len(exchange.raw)
    assert len(exchange.arrival_times_s) > 3
    assert exchange.arrival_times_s == sorted(exchange.arrival_times_s)


def normalised(raw: bytes) -> bytes:
    return re.sub(rb'"created": \d+', b"", re.sub(rb"cmpl-\d+", b"cmpl", raw))


def test_a_slow_reader_takes_small_reads_and_still_gets_every_byte():
    async def body(client: Client, server: ScriptServer) -> tuple[Exchange, Exchange]:
        fast = await client.send(Exchange("s", "server", COMPLETIONS, dict(STREAM)))
        slow = await client.send(
            Exchange("s", "server", COMPLETIONS, dict(STREAM)), Reader("slow", 200, 0.001)
        )
        return fast, slow

    fast, slow = asyncio.run(with_server(body))
    # The same bytes but for the response id and timestamp.
    assert normalised(slow.raw) == normalised(fast.raw)
    sizes = [b - a for a, b in zip([0, *slow.arrival_offsets], slow.arrival_offsets, strict=False)]
    assert max(sizes) <= 200 and len(sizes) >= len(slow.raw) // 200


def test_an_abandoning_reader_closes_after_n_events_and_the_server_sees_it():
    async def body(client: Client, server: ScriptServer) -> Exchange:
        long_stream = dict(STREAM, max_tokens=5000)
        exchange = await client.send(
            Exchange("s", "server", COMPLETIONS, long_stream),
            Reader("abandon", abandon_after_events=3),
        )
        async with asyncio.timeout(30):  # until the server sees the disconnect
            while server.running:
                await asyncio.sleep(0.01)
        return exchange

    exchange = asyncio.run(with_server(body))
    assert exchange.raw.count(b"\n\n") >= 3 and b"[DONE]" not in exchange.raw
    assert exchange.transport_error is None


def test_a_refused_connection_is_recorded_not_raised():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def run() -> tuple[Exchange, object]:
        async with Client(
            Target("x", f"http://127.0.0.1:{port}", MODEL),
            timeout_s=5,
            origin_s=time.perf_counter(),
        ) as client:
            exchange = await client.send(Exchange("s", "x", CHAT, {"model": MODEL}))
            return exchange, await client.get("/health")

    exchange, probe = asyncio.run(run())
    assert exchange.status is None and "Connect" in exchange.transport_error
    assert probe.error is not None and not probe.is_ok


def test_the_api_key_is_sent_as_a_bearer_token():
    seen: list[str] = []

    async def run() -> None:
        from aiohttp import web

        async def models(request: web.Request) -> web.Response:
            seen.append(request.headers.get("Authorization", ""))
            return web.json_response({"data": []})

        app = web.Application()
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        async with Client(
            Target("x", url, MODEL, api_key="k-123"), timeout_s=5, origin_s=time.perf_counter()
        ) as client:
            await client.get("/v1/models")
        await runner.cleanup()

    asyncio.run(run())
    assert seen == ["Bearer k-123"]


async def one_answer_per_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Answers the first request of a connection advertising keep-alive, then
    closes it under the next one without a byte: llama-server's close after a
    stream, with the next request already sent on the pooled connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
    await reader.readexactly(length)
    body = b'{"choices": []}'
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    with contextlib.suppress(asyncio.IncompleteReadError):
        await reader.readuntil(b"\r\n\r\n")  # the next request: never answered
    writer.close()


def test_a_request_a_dead_pooled_connection_never_took_is_retried_once_and_noted_once():
    async def run() -> tuple[list[Exchange], object]:
        server = await asyncio.start_server(one_answer_per_connection, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        target = Target("server", f"http://127.0.0.1:{port}", MODEL)
        try:
            async with Client(target, timeout_s=5, origin_s=time.perf_counter()) as client:
                sent = []
                for _ in range(4):
                    exchange = Exchange("s", "server", COMPLETIONS, {"prompt": "x"})
                    sent.append(await client.send(exchange))
                return sent, client.closed_connection_note()
        finally:
            server.close()

    sent, note = asyncio.run(run())
    assert [(e.status, e.transport_error, e.is_retried) for e in sent] == [
        (200, None, False),
        (200, None, True),  # on a fresh connection, which is not pooled
        (200, None, False),
        (200, None, True),
    ]
    assert note.check_id == "connection_closed_after_response" and note.severity == "note"
    assert note.message.startswith("2 requests sent on a kept-alive connection failed")
