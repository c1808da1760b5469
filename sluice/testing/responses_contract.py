"""The Responses API's streaming contract as a checker over parsed events,
for tests: what every stream sluice sends must satisfy (docs/API.md).

`check_responses_stream(events)` asserts, and returns the terminal
response object:
- `sequence_number` counts from 0 by one; exactly one terminal event
  (`response.completed` / `.incomplete` / `.failed`), last;
- `response.created` then `response.in_progress` first;
- every item is added before its events and done once, in output_index
  order, never touched after its `.done`; no delta is empty;
- each item's text / arguments deltas concatenate to its `.done` value and
  to the item in the terminal response; each done item equals the terminal
  response's item at its output_index.
"""

from __future__ import annotations

from typing import Any

import orjson

TERMINAL = ("response.completed", "response.incomplete", "response.failed")
_DELTA_KEYS = {
    "response.output_text.delta": "text",
    "response.reasoning_text.delta": "text",
    "response.function_call_arguments.delta": "arguments",
    "response.custom_tool_call_input.delta": "input",
}
_DONE_KEYS = {
    "response.output_text.done": "text",
    "response.reasoning_text.done": "text",
    "response.function_call_arguments.done": "arguments",
    "response.custom_tool_call_input.done": "input",
}


def parse_events(body: bytes) -> list[dict[str, Any]]:
    """The `data:` payloads of an SSE body whose events are named (`event:`),
    each checked to agree with its `event:` line."""
    events = []
    for block in body.split(b"\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(b": ", 1) for line in block.split(b"\n"))
        payload = orjson.loads(lines[b"data"])
        assert lines[b"event"].decode() == payload["type"], "event: names the data's type"
        events.append(payload)
    return events


def check_responses_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    assert [e["sequence_number"] for e in events] == list(range(len(events))), "sequence"
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    terminals = [e for e in events if e["type"] in TERMINAL]
    assert len(terminals) == 1 and events[-1] is terminals[0], "one terminal event, last"
    final = terminals[0]["response"]
    streamed: dict[int, str] = {}
    done_items: dict[int, dict[str, Any]] = {}
    open_index: int | None = None
    for event in events[2:-1]:
        kind = event["type"]
        if kind == "response.output_item.added":
            assert open_index is None, "items are sequential"
            open_index = event["output_index"]
            assert open_index == len(done_items), "added in output_index order"
            streamed[open_index] = ""
        elif kind == "response.output_item.done":
            assert event["output_index"] == open_index, "done closes the open item"
            done_items[open_index], open_index = event["item"], None
        elif kind == "error":
            continue
        else:
            assert event["output_index"] == open_index, f"{kind} touches the open item"
            if kind in _DELTA_KEYS:
                assert event["delta"], f"{kind} is never empty"
                streamed[open_index] += event["delta"]
            elif kind in _DONE_KEYS:
                assert event[_DONE_KEYS[kind]] == streamed[open_index], "deltas add up to done"
    assert open_index is None, "every item is done before the terminal event"
    assert [done_items[i] for i in range(len(done_items))] == final["output"], "items agree"
    for index, item in enumerate(final["output"]):
        assert _item_text(item) == streamed[index], "the final item is its deltas"
    return final


def _item_text(item: dict[str, Any]) -> str:
    if item["type"] in ("message", "reasoning"):
        return "".join(part.get("text", "") for part in item["content"])
    if item["type"] == "function_call":
        return item["arguments"]
    return item.get("input", "")
