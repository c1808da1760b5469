"""Helpers shared by the reliability tests (this module holds no tests itself).

- `ServerProcess`: the real server on the fake engine (`sluice.testing.fake_server`)
  in its own process, so signals, exit status, RSS and the loop's timing are
  its own and not shared with the test's clients.
  (Tests that reach into the engine, its records or its pid, use
  `sluice.testing.live_server.LiveServer` on a thread instead.)
- `read_stream`: one SSE request over aiohttp, each event timed as it arrives.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import psutil

DONE_EVENT = b"data: [DONE]\n\n"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_health(url: str, timeout_s: float, expect: int = 200) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                status = response.status
        except urllib.error.HTTPError as error:
            status = error.code
        except OSError:
            status = None
        if status == expect:
            return
        assert time.monotonic() < deadline, f"/health did not answer {expect} in {timeout_s} s"
        time.sleep(0.05)


class ServerProcess:
    """`python -m sluice.testing.fake_server ARGS` on a free port, until stopped."""

    def __init__(self, *args: str, log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._argv = [sys.executable, "-m", "sluice.testing.fake_server",
                      "--port", str(self.port), *args]  # fmt: skip
        self._log_path = log_path
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        with open(self._log_path, "wb") as log:
            self.process = subprocess.Popen(
                self._argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        wait_for_health(self.url, 60)
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_bytes(self) -> int:
        return psutil.Process(self.pid).memory_info().rss

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def log(self) -> str:
        return self._log_path.read_text(errors="replace")


@dataclass(slots=True)
class StreamRecord:
    status: int
    headers: dict[str, str]
    sent_s: float
    # When the response ended (body complete or connection closed).
    ended_s: float = 0.0
    # Each SSE event (b"data: ...\n\n") and its arrival time (monotonic seconds).
    events: list[bytes] = field(default_factory=list)
    times_s: list[float] = field(default_factory=list)
    # The whole body for a non-SSE answer (an HTTP error).
    body: bytes = b""

    @property
    def raw(self) -> bytes:
        return b"".join(self.events)

    @property
    def is_done(self) -> bool:
        return bool(self.events) and self.events[-1] == DONE_EVENT

    @property
    def error(self) -> dict | None:
        for event in self.events:
            if event.startswith(b'data: {"error"'):
                return orjson.loads(event[6:])["error"]
        return None

    def token_event_gaps_s(self) -> list[float]:
        """Gaps between consecutive events that carry generated text."""
        times = [t for e, t in zip(self.events, self.times_s, strict=True) if _has_text(e)]
        return [b - a for a, b in zip(times, times[1:], strict=False)]


def _has_text(event: bytes) -> bool:
    if event == DONE_EVENT or event.startswith(b'data: {"error"'):
        return False
    choices = orjson.loads(event[6:])["choices"]
    return any(c.get("text") or (c.get("delta") or {}).get("content") for c in choices)


async def read_stream(
    session: aiohttp.ClientSession,
    url: str,
    body: dict,
    headers: dict[str, str] | None = None,
    on_event=None,
) -> StreamRecord:
    """POST `body`; every event with its arrival time. `on_event(record)` after each."""
    sent_s = time.monotonic()
    async with session.post(url, json=body, headers=headers) as response:
        record = StreamRecord(response.status, dict(response.headers), sent_s)
        try:
            if response.status != 200 or not body.get("stream"):
                record.body = await response.read()
                return record
            await _read_events(response, record, on_event)
        finally:
            record.ended_s = time.monotonic()
    return record


async def _read_events(response: aiohttp.ClientResponse, record: StreamRecord, on_event) -> None:
    while True:
        try:
            event = await response.content.readuntil(b"\n\n")
        except (asyncio.IncompleteReadError, aiohttp.ClientPayloadError):
            return
        if not event:
            return
        record.events.append(event)
        record.times_s.append(time.monotonic())
        if on_event is not None:
            on_event(record)


def completion_body(max_tokens: int, *, prompt: str = "hello world", stream: bool = True) -> dict:
    return {"model": "fake-model", "prompt": prompt, "max_tokens": max_tokens,
            "stream": stream, "temperature": 0}  # fmt: skip


def run(coroutine, timeout_s: float = 120):
    """Run a test's async body on a fresh loop, bounded so nothing hangs the suite."""
    return asyncio.run(asyncio.wait_for(coroutine, timeout_s))
