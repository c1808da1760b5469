"""Huge bodies never stall the event loop, measured by the server's own metric.

32 chat streams run (real sockets, `LiveServer`, the fake engine) while these
arrive, one after another:

    64 MiB completion body, Content-Length        413 before a byte is read
    64 MiB chat body, chunked                     413 once the limit is passed
    100,000-message chat (~3 MB)                  400 naming the message limit
    chat at the message limit (~0.3 MB)           200, rendered and tokenized
    completion of ~2M token ids, under the limit  400: longer than the context

The big ones are parsed, validated and converted in a worker thread in pieces
that each hold the GIL for about a millisecond, so the server's worst loop
lag (`sluice:event_loop_lag_max_seconds`, sampled every 5 ms: a stall of S
shows as at least S - 5 ms) stays a small share (`LAG_SHARE`) of the time the
big bodies took, and the streams flow throughout. Measured on a shared
2-core machine: before, the loop's worst lag was 1.4-2.1 s (bodies parsed and
validated on it; the 64 MiB ones read whole, then a 400), a third of the
bodies' time or more; after, 8-55 ms of the ~6 s the bodies took (1/100).
A loaded machine stretches the bodies' time along with the lag, so a tenth
keeps a wide margin on both sides where a bound in milliseconds (50 ms was
passed now and then) does not.

The streams end only once every big body has its answer (their script stops
then), so the lag is measured while all 32 run. Bodies are built before the
server starts and sent in 256 KiB writes: the client shares the process (and
the GIL) with the server, and must not stall it itself. They are sent one at
a time: all at once, the 128 MiB of uploads, the client, the server's loop
and its worker want more than the two cores this machine shares with other
jobs, and the lag (up to 120 ms, now and then, while a worker ran pure
Python beside the uploads) measured how those threads were scheduled more
than what a body costs the loop. The collector is tuned as `sluice serve` tunes it
(`tune_gc_for_serving`).
"""

from __future__ import annotations

import asyncio
import gc
import re
import threading
import time
from collections.abc import Iterator
from itertools import cycle
from urllib.parse import urlsplit

import aiohttp
import orjson
import pytest

from sluice.config import RequestLimits
from sluice.server.http.launch import tune_gc_for_serving
from sluice.server.observability.loop_watchdog import SAMPLE_INTERVAL_S
from sluice.testing import FakeEngine
from sluice.testing.event_loops import run
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer
from sluice.testing.stream_reader import read_stream

NUM_STREAMS = 32
# The worst loop lag, at most this share of the time the big bodies took.
LAG_SHARE = 1 / 10
# Reported (samples over it), not asserted.
LAG_BOUND_S = 0.05
LIMITS = RequestLimits()
HUGE_BYTES = 64 * 1024 * 1024 + 1024
WRITE_BYTES = 256 * 1024
MAX_MODEL_LEN = 1_000_000


def stop_when(done: threading.Event):
    """A token script: parrot the prompt until `done` is set, then finish."""

    def script(request_id, prompt_token_ids, params) -> Iterator[int]:
        for token_id in cycle(prompt_token_ids):
            if done.is_set():
                return
            yield token_id

    return script


def chat_body(num_messages: int, content: str = "hi") -> bytes:
    messages = [{"role": "user", "content": content}] * num_messages
    return orjson.dumps({"messages": messages, "max_tokens": 1})


def ids_body(num_bytes: int) -> bytes:
    """A completion prompt of token id 7 repeated, `num_bytes` long in all."""
    head, tail = b'{"prompt":[', b'7],"max_tokens":16}'
    return head + b"7," * ((num_bytes - len(head) - len(tail)) // 2) + tail


def huge_ids_writes() -> Iterator[bytes]:
    """A HUGE_BYTES completion body, one write at a time (never whole in memory)."""
    head, tail = b'{"prompt":[', b"7]}"
    yield head
    num_ids_bytes = HUGE_BYTES - len(head) - len(tail)
    piece = b"7," * (WRITE_BYTES // 2)
    for _ in range(num_ids_bytes // len(piece)):
        yield piece
    yield b"7," * ((num_ids_bytes % len(piece)) // 2) + tail


def writes_of(body: bytes) -> Iterator[bytes]:
    view = memoryview(body)
    for start in range(0, len(body), WRITE_BYTES):
        yield bytes(view[start : start + WRITE_BYTES])


async def post_raw(
    url: str, path: str, writes: Iterator[bytes], content_length: int | None
) -> tuple[int, dict]:
    """POST over a plain socket, chunked when `content_length` is None: (status, JSON)."""
    address = urlsplit(url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    framing = (
        f"Content-Length: {content_length}" if content_length is not None
        else "Transfer-Encoding: chunked"
    )  # fmt: skip
    head = f"POST {path} HTTP/1.1\r\nHost: {address.netloc}\r\n"
    head += f"Content-Type: application/json\r\n{framing}\r\n\r\n"
    writer.write(head.encode())
    for piece in writes:
        writer.write(piece if content_length is not None else b"%x\r\n%b\r\n" % (len(piece), piece))
        await writer.drain()
    if content_length is None:
        writer.write(b"0\r\n\r\n")
    await writer.drain()
    status_line = await reader.readline()
    length = 0
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    body = await reader.readexactly(length)
    writer.close()
    return int(status_line.split()[1]), orjson.loads(body)


@pytest.fixture
def served_gc():
    """The collector as `sluice serve` leaves it; restored afterwards."""
    previous = gc.get_threshold()
    tune_gc_for_serving()
    yield
    gc.unfreeze()
    gc.set_threshold(*previous)


def lag_figures(metrics: str) -> tuple[float, float, float]:
    """(worst lag seen, samples over LAG_BOUND_S, samples) from /metrics."""

    def value(series: str) -> float:
        match = re.search(rf"^{re.escape(series)} (\S+)$", metrics, re.MULTILINE)
        assert match, f"{series} is on /metrics"
        return float(match.group(1))

    count = value("sluice:event_loop_lag_seconds_count")
    within = value(f'sluice:event_loop_lag_seconds_bucket{{le="{LAG_BOUND_S}"}}')
    return value("sluice:event_loop_lag_max_seconds"), count - within, count


def test_huge_bodies_beside_32_streams_keep_the_loop_lag_a_small_share_of_their_time(
    served_gc,
):
    many_messages = chat_body(100_000)
    messages_at_limit = chat_body(LIMITS.max_chat_messages)
    near_limit_ids = ids_body(LIMITS.max_request_body_bytes - 1024)
    assert HUGE_BYTES > LIMITS.max_request_body_bytes > len(many_messages)
    bodies_done = threading.Event()
    engine = FakeEngine(stop_when(bodies_done), step_interval_s=0.02, max_model_len=MAX_MODEL_LEN)

    async def big_bodies(url: str) -> list[tuple[int, dict]]:
        return [
            await post_raw(url, "/v1/completions", huge_ids_writes(), HUGE_BYTES),
            await post_raw(url, "/v1/chat/completions", huge_ids_writes(), None),
            await post_raw(url, "/v1/chat/completions", writes_of(many_messages),
                           len(many_messages)),
            await post_raw(url, "/v1/chat/completions", writes_of(messages_at_limit),
                           len(messages_at_limit)),
            await post_raw(url, "/v1/completions", writes_of(near_limit_ids),
                           len(near_limit_ids)),
        ]  # fmt: skip

    async def go(url: str):
        flowing = [asyncio.Event() for _ in range(NUM_STREAMS)]
        stream_body = {"messages": [{"role": "user", "content": "hello"}], "stream": True,
                       "max_tokens": 100_000}  # fmt: skip
        async with aiohttp.ClientSession() as session:
            streams = [
                asyncio.create_task(
                    read_stream(
                        session, url + "/v1/chat/completions", stream_body,
                        on_event=lambda record, event=event: len(record.events) > 3
                        and event.set(),
                    )
                )
                for event in flowing
            ]  # fmt: skip
            await asyncio.gather(*(event.wait() for event in flowing))
            started_s = time.monotonic()
            answers = await big_bodies(url)
            bodies_s = time.monotonic() - started_s
            num_streams_running = sum(not task.done() for task in streams)
            bodies_done.set()
            records = await asyncio.gather(*streams)
            async with session.get(url + "/metrics") as response:
                metrics = await response.text()
        return answers, bodies_s, num_streams_running, records, metrics

    with LiveServer(engine, ChatFakeTokenizer(), max_model_len=MAX_MODEL_LEN) as live:
        answers, bodies_s, num_streams_running, records, metrics = run(go(live.url), timeout_s=300)
    worst_lag_s, num_over, num_samples = lag_figures(metrics)
    print(f"loop lag: worst {worst_lag_s * 1000:.1f} ms, {num_over:.0f} of {num_samples:.0f} "
          f"samples over {LAG_BOUND_S * 1000:.0f} ms; the bodies took {bodies_s:.2f} s")  # fmt: skip

    (by_length, chunked, too_many, at_limit, too_long) = answers
    for status, body in (by_length, chunked):
        assert status == 413, body
        assert body["error"]["code"] == "request_too_large"
    assert too_many[0] == 400 and too_many[1]["error"]["param"] == "messages"
    assert f"limit of {LIMITS.max_chat_messages}" in too_many[1]["error"]["message"]
    assert at_limit[0] == 200, at_limit[1]
    assert at_limit[1]["usage"]["completion_tokens"] == 1
    assert too_long[0] == 400 and too_long[1]["error"]["code"] == "context_length_exceeded"
    # Every stream was still running when the last big body was answered, and then finished.
    assert num_streams_running == NUM_STREAMS
    assert all(record.status == 200 and record.is_done for record in records)
    assert worst_lag_s + SAMPLE_INTERVAL_S < LAG_SHARE * bodies_s
