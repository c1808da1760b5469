"""Slow and stuck clients stall nothing else.

- 25 clients reading 10 bytes a second alongside 8 normal streams (the
  issue's 50 + 16, halved for a 2-core machine), on the fake engine in its own
  process: the normal streams' median inter-token gap stays within 2x of a
  run without the slow clients, /health answers while they hang, and the
  server's RSS stays flat. Why 2x of the median: the engine steps every
  20 ms, so both runs' gaps are ~20 ms plus the machine's scheduling noise,
  which the median shrugs off; a server that let slow readers hold up the
  others would add their pace (a read a second) to the gaps.
- A client that stops reading altogether: its writes time out after
  `send_timeout_s` (not before), the server says so once, its connection is
  dropped and its engine request aborted, while a normal stream next to it
  completes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import statistics
import time

import aiohttp
import httpx2

from sluice.testing.contract import Expectations, check_stream
from sluice.testing.event_loops import run
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer
from sluice.testing.server_process import ServerProcess
from sluice.testing.stream_reader import completion_body, read_stream

NUM_SLOW = 25
NUM_NORMAL = 8
NORMAL_TOKENS = 60
SLOW_READ_BYTES_PER_S = 10
SEND_TIMEOUT_S = 0.5


async def open_raw_stream(url: str, body: bytes) -> socket.socket:
    """A streaming request on a socket with a tiny receive buffer; nothing read yet."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # backpressure comes early
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    await loop.sock_sendall(sock, head + body)
    return sock


async def read_slowly(sock: socket.socket, stop: asyncio.Event) -> int:
    """Read 10 bytes a second until told to stop; the bytes read."""
    loop = asyncio.get_running_loop()
    num_read = 0
    while not stop.is_set():
        num_read += len(await loop.sock_recv(sock, SLOW_READ_BYTES_PER_S))
        await asyncio.sleep(1.0)
    sock.close()
    return num_read


async def normal_streams(session: aiohttp.ClientSession, url: str) -> list:
    body = completion_body(NORMAL_TOKENS)
    return await asyncio.gather(
        *(read_stream(session, url + "/v1/completions", body) for _ in range(NUM_NORMAL))
    )


def median_gap_s(records) -> float:
    expect = Expectations(kind="completion", num_choices=1)
    gaps = []
    for record in records:
        assert check_stream(record.raw, expect).choices[0].finish_reason == "length"
        gaps.extend(record.token_event_gaps_s())
    return statistics.median(gaps)


def test_slow_readers_do_not_slow_other_streams_and_memory_stays_flat(tmp_path):
    server = ServerProcess(
        "--step-interval-s", "0.02", "--max-model-len", "1000000",
        log_path=tmp_path / "server.log",
    )  # fmt: skip
    slow_body = httpx2.Request(
        "POST", "http://x", json=completion_body(500_000, prompt="hello world " * 8)
    ).content

    async def go() -> dict:
        async with aiohttp.ClientSession() as session:
            await normal_streams(session, server.url)  # warm-up
            baseline = median_gap_s(await normal_streams(session, server.url))
            stop = asyncio.Event()
            socks = [await open_raw_stream(server.url, slow_body) for _ in range(NUM_SLOW)]
            readers = [asyncio.create_task(read_slowly(s, stop)) for s in socks]
            await asyncio.sleep(1.0)
            rss_before = server.rss_bytes()
            loaded = median_gap_s(await normal_streams(session, server.url))
            async with session.get(server.url + "/health") as health:
                health_status = health.status
            await asyncio.sleep(2.0)
            rss_after = server.rss_bytes()
            stop.set()
            num_read = await asyncio.gather(*readers)
        return dict(baseline=baseline, loaded=loaded, health_status=health_status,
                    rss_growth=rss_after - rss_before, num_read=num_read)  # fmt: skip

    with server:
        measured = run(go())
    print(measured)
    # The slow clients were really streaming, at their own pace.
    assert all(0 < n <= 10 * SLOW_READ_BYTES_PER_S for n in measured["num_read"])
    assert measured["loaded"] < 2 * measured["baseline"], measured
    assert measured["health_status"] == 200
    # Each slow stream holds only its own small, bounded buffer.
    assert measured["rss_growth"] < 8 << 20, measured


def test_a_client_that_stops_reading_is_cut_after_the_send_timeout(caplog):
    caplog.set_level(logging.WARNING, logger="sluice.server")
    engine = LoopFakeEngine(tokens_per_step=2000, step_interval_s=0.005, max_model_len=10**8)
    stuck_body = httpx2.Request("POST", "http://x", json=completion_body(50_000_000)).content

    async def go(url: str):
        opened_s = time.monotonic()
        sock = await open_raw_stream(url, stuck_body)  # and never read
        await asyncio.to_thread(engine.wait_until, lambda: bool(engine.added_request_ids))
        stuck_id = engine.added_request_ids[0]
        async with aiohttp.ClientSession() as session:
            normal = await read_stream(session, url + "/v1/completions", completion_body(50))
        await asyncio.to_thread(engine.wait_until, lambda: stuck_id in engine.aborted_request_ids)
        cut_s = time.monotonic()
        is_closed = await connection_is_closed(sock)
        return normal, cut_s - opened_s, is_closed

    tokenizer = ChatFakeTokenizer()
    with LiveServer(
        engine, tokenizer, max_model_len=10**8, send_timeout_s=SEND_TIMEOUT_S
    ) as server:
        normal, cut_after_s, is_closed = run(go(server.url))
    assert check_stream(normal.raw, Expectations(kind="completion", num_choices=1)).error is None
    assert is_closed
    # Cut by the send timeout: once, and no sooner than a write could have
    # waited that long (every write came after the connection opened).
    cuts = [r for r in caplog.records if "a write timed out" in r.getMessage()]
    assert len(cuts) == 1
    assert cut_after_s >= SEND_TIMEOUT_S


async def connection_is_closed(sock: socket.socket) -> bool:
    """Drain what the kernel holds; True once the server's end is gone."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 1)
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        if not data:
            return True
    return False
