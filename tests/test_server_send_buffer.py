"""A client that stops reading pauses its stream after a bounded amount: the
connection's send buffers are `send_buffer_bytes`, and the server counts the
events that had to wait (`sluice:stream_write_waits`). Its stream stays exact."""

from __future__ import annotations

import threading

import httpx2

from sluice.testing import FakeEngine
from sluice.testing.contract import Expectations, check_stream
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer
from sluice.testing.slow_socket import read_slowly

TOKENIZER = ChatFakeTokenizer()


def write_waits(url: str) -> float:
    text = httpx2.get(url + "/metrics").text
    (line,) = [
        row for row in text.splitlines() if row.startswith("sluice:stream_write_waits_total")
    ]
    return float(line.split()[-1])


def test_a_client_that_stops_reading_pauses_its_stream_which_stays_exact():
    engine = FakeEngine(step_interval_s=0.001)
    body = {"model": "fake-model", "prompt": "hello world abc", "max_tokens": 200,
            "stream": True, "logprobs": 20}  # fmt: skip
    with LiveServer(engine, TOKENIZER, send_buffer_bytes=4096) as live:
        paused = threading.Event()

        def wait_until_paused() -> None:
            """Read nothing until the server's writes have had to wait."""
            for _ in range(500):
                if write_waits(live.url) > 0:
                    paused.set()
                    return
                paused.wait(0.02)

        status, raw = read_slowly(
            live.url + "/v1/completions", body, burst_bytes=65536, pause_s=0,
            receive_buffer_bytes=None, before_reading=wait_until_paused,
        )  # fmt: skip
    assert paused.is_set(), "the stream never had to wait: the buffers are not bounded"
    assert status == 200
    result = check_stream(raw, Expectations("completion", 1, logprobs=20))
    assert result.choices[0].finish_reason == "length"
    assert len(result.choices[0].token_logprobs) == 200
