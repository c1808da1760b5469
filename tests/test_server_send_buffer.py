"""A client that stops reading pauses its stream after a bounded amount: the
connection's send buffers are `send_buffer_bytes`, and the server counts the
events that had to wait (`sluice:stream_write_waits`). Its stream stays exact."""

from __future__ import annotations

import socket
import threading

import httpx2
import orjson

from sluice.testing import FakeEngine
from sluice.testing.contract import Expectations, check_stream
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer
from sluice.testing.slow_socket import _parse_response

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
    with LiveServer(engine, TOKENIZER, stats=lambda: engine, send_buffer_bytes=4096) as live:
        host, port = live.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            payload = orjson.dumps(body)
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(payload), payload)
            )
            # Read nothing until the server's writes have had to wait.
            paused = threading.Event()
            for _ in range(500):
                if write_waits(live.url) > 0:
                    paused.set()
                    break
                paused.wait(0.02)
            received = bytearray()
            while chunk := sock.recv(65536):
                received += chunk
    assert paused.is_set(), "the stream never had to wait: the buffers are not bounded"
    status, raw = _parse_response(bytes(received))
    assert status == 200
    result = check_stream(raw, Expectations("completion", 1, has_logprobs=True))
    assert result.choices[0].finish_reason == "length"
    assert len(result.choices[0].token_logprobs) == 200
