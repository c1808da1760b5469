"""One request over aiohttp, each SSE event timed as it arrives, for tests.

`read_stream` returns a `StreamRecord`: status, headers, every event with its
arrival time (monotonic seconds), or the whole body of a non-streamed answer.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

DONE_EVENT = b"data: [DONE]\n\n"


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
