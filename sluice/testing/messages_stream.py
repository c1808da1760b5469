"""Read an Anthropic Messages stream as a client does, checking its shape.

`read_message_stream(raw)` parses the `event: <type>\\ndata: <json>` events
of a /v1/messages stream, checks the rules sluice promises (the event name
equals the data's type; message_start then one ping first; blocks opened,
extended and closed in index order, one open at a time; no empty delta; a
delta's type fits its block's; message_delta then message_stop last) and
returns the message the events add up to, as the `anthropic` SDK
accumulates it (a tool_use block's input parsed from its joined
`partial_json`), with the events' types in order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_DELTA_FITS = {
    "text_delta": ("text", "text"),
    "thinking_delta": ("thinking", "thinking"),
    "input_json_delta": ("tool_use", "partial_json"),
}


@dataclass(frozen=True, slots=True)
class MessageStream:
    message: dict[str, Any]
    event_types: list[str]
    # Per block index: how many deltas it got.
    num_deltas: list[int]


def parse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for frame in raw.decode().split("\n\n"):
        if not frame:
            continue
        name_line, data_line = frame.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: "), frame
        name, data = name_line[len("event: ") :], json.loads(data_line[len("data: ") :])
        assert data["type"] == name, f"event {name} carries type {data['type']}"
        events.append((name, data))
    assert raw.endswith(b"\n\n"), "the stream ends with a whole event"
    return events


def read_message_stream(raw: bytes) -> MessageStream:
    events = parse_events(raw)
    types = [name for name, _ in events]
    assert types[:2] == ["message_start", "ping"], types[:3]
    assert types[-2:] == ["message_delta", "message_stop"], types[-3:]
    message = events[0][1]["message"]
    assert message["content"] == [] and message["stop_reason"] is None
    state = _Accumulator(message)
    for name, data in events[2:-2]:
        state.add(name, data)
    assert state.open is None, "every block is closed before message_delta"
    delta = events[-2][1]
    message["stop_reason"] = delta["delta"]["stop_reason"]
    message["stop_sequence"] = delta["delta"]["stop_sequence"]
    message["usage"] = {**message["usage"], **delta["usage"]}
    for block, text in zip(message["content"], state.json_texts, strict=True):
        if block["type"] == "tool_use":
            block["input"] = json.loads(text) if text else {}
    return MessageStream(message, types, state.num_deltas)


class _Accumulator:
    def __init__(self, message: dict[str, Any]):
        self.message = message
        self.open: int | None = None
        self.json_texts: list[str] = []
        self.num_deltas: list[int] = []

    def add(self, name: str, data: dict[str, Any]) -> None:
        content = self.message["content"]
        if name == "content_block_start":
            assert self.open is None, "one block open at a time"
            assert data["index"] == len(content), "blocks open in index order"
            content.append(dict(data["content_block"]))
            self.json_texts.append("")
            self.num_deltas.append(0)
            self.open = data["index"]
        elif name == "content_block_delta":
            assert data["index"] == self.open, "a delta extends the open block"
            delta = data["delta"]
            block_type, key = _DELTA_FITS[delta["type"]]
            block = content[self.open]
            assert block["type"] == block_type, f"{delta['type']} on a {block['type']} block"
            assert delta[key], "no empty delta"
            if key == "partial_json":
                self.json_texts[self.open] += delta[key]
            else:
                block[key] += delta[key]
            self.num_deltas[self.open] += 1
        elif name == "content_block_stop":
            assert data["index"] == self.open, "the open block is the one closed"
            self.open = None
        else:
            assert name == "ping", f"unexpected event {name} inside the message"
