"""Server-sent events, parsed strictly from the raw bytes of a response body.

Each event gets a number (its position in the stream, 0-based, `[DONE]`
included): that number is the "chunk number" every finding quotes. The parser
never throws on a malformed body; it records a `problem` per event instead, so
the framing check can report it and the other checks can still read the rest.

The contract (STREAMING_CONTRACT.md, "The wire"): every event is exactly
`data: ` + one line of JSON + `\\n\\n`, LF only, no `event:` lines, and the
last event is `data: [DONE]` with nothing after it. Comment lines (`: ping`)
are legal SSE that every client skips: they are counted, not a framing
problem (sluice's own stricter rule reports them under --strict).
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

_LINE = re.compile(rb"([^\r\n]*)(\r\n|\n|\r)")
DATA_PREFIX = b"data: "
DONE = b"[DONE]"


@dataclass(slots=True)
class SseEvent:
    # Position in the stream, 0-based: the chunk number findings quote.
    number: int
    # Byte range of the event in the body, its blank line included.
    start: int
    end: int
    raw: bytes
    # The decoded JSON value; None for [DONE] and for undecodable data.
    payload: Any
    is_done: bool
    # What is wrong with the framing of this event; None when well formed.
    problem: str | None
    # The data as a client reads it (None when the event has no data line).
    data: bytes | None = None
    # Comment lines (starting with ':') in the event; alone they make a
    # block that clients do not dispatch.
    comment_lines: int = 0

    @property
    def is_comment_only(self) -> bool:
        return self.data is None and self.comment_lines > 0 and self.problem is None


@dataclass(slots=True)
class SseParse:
    events: list[SseEvent]
    # Bytes after the last blank line: an event that never ended.
    trailing: bytes


def parse_sse(raw: bytes) -> SseParse:
    """Split a body into events at blank lines, checking each one's framing."""
    events: list[SseEvent] = []
    lines: list[tuple[bytes, bytes]] = []
    event_start = 0
    position = 0
    for match in _LINE.finditer(raw):
        position = match.end()
        content, ending = match.group(1), match.group(2)
        if content == b"":
            if lines:
                events.append(
                    _event(len(events), event_start, position, raw, lines + [(b"", ending)])
                )
            lines = []
            event_start = position
            continue
        lines.append((content, ending))
    return SseParse(events=events, trailing=raw[event_start:])


def _event(
    number: int, start: int, end: int, raw: bytes, lines: list[tuple[bytes, bytes]]
) -> SseEvent:
    """One event from its lines (the last one being the blank separator)."""
    content_lines = [content for content, _ in lines[:-1] if not content.startswith(b":")]
    comment_lines = len(lines) - 1 - len(content_lines)
    problem = _framing_problem(lines, content_lines)
    data = _data_of(content_lines)
    is_done = data == DONE
    payload = None
    if not is_done and data is not None:
        payload, decode_problem = _decode_json(data)
        problem = problem or decode_problem
    return SseEvent(
        number, start, end, raw[start:end], payload, is_done, problem, data, comment_lines
    )


def _framing_problem(lines: list[tuple[bytes, bytes]], content_lines: list[bytes]) -> str | None:
    if any(ending != b"\n" for _, ending in lines):
        return "line ending is not a bare LF"
    names = [_field_name(line) for line in content_lines]
    if not content_lines:
        return None  # comment lines only
    if len(content_lines) != 1:
        return f"event has {len(content_lines)} lines ({', '.join(names)}), expected one data line"
    if names[0] != "data":
        return f"a {names[0]} line, not 'data: '"
    if not content_lines[0].startswith(DATA_PREFIX):
        return "line does not start with 'data: '"
    return None


def _field_name(line: bytes) -> str:
    return line.split(b":", 1)[0].decode("latin-1")


def _data_of(content_lines: list[bytes]) -> bytes | None:
    """The data of an event, as a lenient client would read it."""
    data_lines = [line for line in content_lines if line.startswith(b"data:")]
    if not data_lines:
        return None
    parts = [line[5:].removeprefix(b" ") for line in data_lines]
    return b"\n".join(parts)


def _decode_json(data: bytes) -> tuple[Any, str | None]:
    # The stdlib decoder accepts NaN and Infinity, so the logprob check can see them.
    try:
        return json.loads(data), None
    except (ValueError, UnicodeDecodeError) as error:
        return None, f"data is not one JSON value ({error})"


def event_time_s(event: SseEvent, offsets: list[int], times_s: list[float]) -> float:
    """Arrival time of an event: that of the piece that carried its last byte."""
    if not offsets:
        return 0.0
    piece = bisect_left(offsets, event.end)
    return times_s[min(piece, len(times_s) - 1)]
