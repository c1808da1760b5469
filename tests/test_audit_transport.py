"""The client records bodies piece by piece, reads slowly, abandons, and never raises."""

from __future__ import annotations

import asyncio
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
