"""The events of an agent-API stream (Responses, Messages), read from the raw
bytes: each is `event: <type>` + `data: <one JSON object>` + a blank line,
and the event name equals the data's `type`.

`read_events(exchange)` never throws: an event whose framing is wrong keeps
its number and a `problem`, and its payload when the data was still readable,
so the checks of order and content can read the rest of the stream. Comment
blocks (`: keep-alive`) and a stray `data: [DONE]` are legal SSE that both
SDKs skip; they are not events here. Numbers are positions in the stream as
`sse.parse_sse` counts them (the chunk numbers findings quote).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.audit.records import Exchange
from sluice.audit.sse import DATA_PREFIX, SseEvent, event_time_s, parse_sse

EVENT_PREFIX = b"event: "


@dataclass(slots=True)
class NamedEvent:
    # Position in the stream, 0-based (findings quote it).
    number: int
    # The `event:` line's name; None when the event had none.
    name: str | None
    # The data's JSON object; None when it was no JSON object.
    payload: dict[str, Any] | None
    # What is wrong with the framing; None when well formed.
    problem: str | None
    raw: bytes

    @property
    def type(self) -> str:
        """The data's `type` (the event name when the data has none)."""
        kind = self.payload.get("type") if self.payload is not None else None
        return kind if isinstance(kind, str) else (self.name or "")


@dataclass(slots=True)
class AgentStream:
    events: list[NamedEvent]
    # Bytes after the last blank line: an event that never ended.
    trailing: bytes


def read_events(exchange: Exchange) -> AgentStream:
    parse = parse_sse(exchange.raw)
    events = [_named(event) for event in parse.events if not _is_skipped(event)]
    return AgentStream(events, parse.trailing)


def _is_skipped(event: SseEvent) -> bool:
    return event.is_comment_only or event.is_done


def _named(event: SseEvent) -> NamedEvent:
    lines = [line for line in event.raw.split(b"\n")[:-2] if not line.startswith(b":")]
    names = [line[len(EVENT_PREFIX) :].decode("utf-8", "replace")
             for line in lines if line.startswith(EVENT_PREFIX)]  # fmt: skip
    data = [line for line in lines if line.startswith(DATA_PREFIX)]
    payload = event.payload if isinstance(event.payload, dict) else None
    name = names[0] if names else None
    problem = _problem(event, lines, len(names), len(data), payload)
    if problem is None and name is not None and name != payload.get("type"):  # type: ignore[union-attr]
        problem = f"event: {name} carries data of type {payload.get('type')!r}"  # type: ignore[union-attr]
    return NamedEvent(event.number, name, payload, problem, event.raw)


def _problem(
    event: SseEvent, lines: list[bytes], num_names: int, num_data: int, payload: Any
) -> str | None:
    if b"\r" in event.raw:
        return "line ending is not a bare LF"
    if num_data != 1:
        return f"{num_data} data lines, expected one"
    if num_names > 1 or len(lines) != num_names + num_data:
        return "lines other than one `event: ` and one `data: ` line"
    if num_names == 1 and not lines[0].startswith(EVENT_PREFIX):
        return "the data line comes before the event line"
    if payload is None:
        return "data is not one JSON object"
    if not isinstance(payload.get("type"), str):
        return "data has no `type`"
    return None


def is_delta(event: NamedEvent) -> bool:
    """An event that carries output (both APIs)."""
    return event.type.endswith(".delta") or event.type == "content_block_delta"


def delta_events(exchange: Exchange) -> int:
    return sum(is_delta(event) for event in read_events(exchange).events)


def delta_times_s(exchange: Exchange) -> list[float]:
    """Arrival time of each delta event, in order."""
    parse = parse_sse(exchange.raw)
    named = {event.number for event in read_events(exchange).events if is_delta(event)}
    return [event_time_s(event, exchange.arrival_offsets, exchange.arrival_times_s)
            for event in parse.events if event.number in named]  # fmt: skip


def output_tokens(exchange: Exchange) -> int:
    """Output tokens of a stream, from the last usage it carried (both APIs)."""
    count = 0
    for event in read_events(exchange).events:
        payload = event.payload or {}
        usage = payload.get("usage") or (payload.get("response") or {}).get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
            count = usage["output_tokens"]
    return count
