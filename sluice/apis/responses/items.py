"""The output items of one Responses API request, grown from its message deltas.

`OutputItems` is the one owner, per request on the event loop, of the
response's `output`: which item is open, what each item holds, and the
events that describe each change. A stream sends the events; a non-streamed
response keeps only the items. Both run this same class over the same kind
of deltas, so a stream's items are the items of its final object, and the
deltas of each item concatenate to its `.done` value by construction.

Items are sequential, as OpenAI sends them: at most one is open; a new kind
of output closes it (its `.done` events go first) and opens the next.
Within one message delta (which may hold many engine steps when the reader
lags, or one token that ends a call and begins text, like `"}}.`) the order
is reasoning, then content and tool calls in the text's order (`parts`): the
order in which the reasoning parser and the tool-call parsers read a text.
- reasoning text: a `reasoning` item with one `reasoning_text` part;
- content: a `message` item with one `output_text` part (and its logprobs);
- a function tool's call: a `function_call` item whose arguments stream;
- a custom tool's call (sluice offers it to the model as a function with one
  string argument, `input`): a `custom_tool_call` item, whose input is the
  decoded string, so it goes out whole when the call is complete (its item
  closes), not in JSON fragments.
Every delta event carries text; none is empty. An item left open by a
`length` finish closes with status "incomplete".
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import orjson

from sluice.tools.message_stream import MessageDelta, ToolCallDelta


@dataclass(frozen=True, slots=True)
class ItemEvent:
    # The event's `type`, e.g. "response.output_text.delta".
    type: str
    # Its other fields, without `type` and `sequence_number`.
    fields: dict[str, Any]


@dataclass(slots=True)
class _Item:
    kind: str  # "reasoning" | "message" | "function_call" | "custom_tool_call"
    id: str
    output_index: int
    parts: list[str] = field(default_factory=list)
    # message: logprob entries of its text; calls: call_id and name.
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    status: str = "in_progress"

    @property
    def text(self) -> str:
        return "".join(self.parts)


_ID_PREFIX = {"reasoning": "rs", "message": "msg", "function_call": "fc", "custom_tool_call": "ctc"}


class OutputItems:
    def __init__(self, custom_tool_names: frozenset[str] = frozenset()):
        self._custom_tool_names = custom_tool_names
        self._items: list[_Item] = []
        self._open: _Item | None = None
        # Per tool-call index of the message stream: its item.
        self._calls: list[_Item] = []

    @property
    def is_in_reasoning(self) -> bool:
        """The open item is reasoning (the tokens just read were reasoning's)."""
        return self._open is not None and self._open.kind == "reasoning"

    def push(self, delta: MessageDelta, entries: list[dict[str, Any]] | None) -> list[ItemEvent]:
        """The events of what `delta` adds; `entries`: logprob entries that go
        with its content (None without logprobs)."""
        events: list[ItemEvent] = []
        if delta.reasoning:
            events += self._grow("reasoning", delta.reasoning)
        for part in delta.parts:
            if isinstance(part, str):
                events += self._grow("message", part, entries or [])
                entries = None  # all of them ride on the delta's first content
            else:
                events += self._grow_call(part)
        return events

    def close(self, status: str = "completed") -> list[ItemEvent]:
        """Close the open item (the request finished): its `.done` events."""
        if self._open is None:
            return []
        return self._close(status)

    def output(self) -> list[dict[str, Any]]:
        """Every item as the response's `output` lists it."""
        return [self._item_json(item, item.status) for item in self._items]

    # -- growing ----------------------------------------------------------------

    def _grow(self, kind: str, text: str, entries: list[dict[str, Any]] | None = None) -> list:
        events = [] if self._is_open(kind) else self._open_item(kind)
        item = self._open
        assert item is not None, "an item is open"
        item.parts.append(text)
        if entries is not None:
            item.logprobs += entries
        fields = {"item_id": item.id, "output_index": item.output_index, "content_index": 0}
        if kind == "message":
            events.append(_event("output_text.delta", fields, delta=text, logprobs=entries or []))
        else:
            events.append(_event("reasoning_text.delta", fields, delta=text))
        return events

    def _grow_call(self, call: ToolCallDelta) -> list[ItemEvent]:
        events: list[ItemEvent] = []
        if call.id is not None:
            assert call.name is not None, "a call's first delta names it"
            if call.name in self._custom_tool_names:  # announced with its input, at close
                events += self._open_item("custom_tool_call", is_announced=False)
            else:
                events += self._open_item("function_call", call.name, call.id)
            assert self._open is not None, "an item is open"
            self._open.call_id, self._open.name = call.id, call.name
            self._calls.append(self._open)
        item = self._calls[call.index]
        assert item is self._open, "only the newest call grows"
        if not call.arguments:
            return events
        item.parts.append(call.arguments)
        if item.kind == "function_call":
            fields = {"item_id": item.id, "output_index": item.output_index}
            events.append(_event("function_call_arguments.delta", fields, delta=call.arguments))
        return events

    # -- opening and closing ----------------------------------------------------

    def _is_open(self, kind: str) -> bool:
        return self._open is not None and self._open.kind == kind

    def _open_item(
        self, kind: str, name: str = "", call_id: str = "", is_announced: bool = True
    ) -> list[ItemEvent]:
        events = self._close("completed") if self._open is not None else []
        item = _Item(kind, f"{_ID_PREFIX[kind]}_{secrets.token_hex(16)}", len(self._items))
        item.name, item.call_id = name, call_id
        self._items.append(item)
        self._open = item
        if not is_announced:
            return events
        events.append(_event("output_item.added", {}, output_index=item.output_index,
                             item=self._item_json(item, "in_progress")))  # fmt: skip
        if kind in ("message", "reasoning"):
            part = _part(kind, "", [])
            fields = {"item_id": item.id, "output_index": item.output_index, "content_index": 0}
            events.append(_event("content_part.added", fields, part=part))
        return events

    def _close(self, status: str) -> list[ItemEvent]:
        item = self._open
        assert item is not None, "an item is open"
        self._open = None
        item.status = status
        fields = {"item_id": item.id, "output_index": item.output_index}
        events: list[ItemEvent] = []
        if item.kind in ("message", "reasoning"):
            part = _part(item.kind, item.text, item.logprobs)
            fields["content_index"] = 0
            if item.kind == "message":
                events.append(_event("output_text.done", fields, text=item.text,
                                     logprobs=item.logprobs))  # fmt: skip
            else:
                events.append(_event("reasoning_text.done", fields, text=item.text))
            events.append(_event("content_part.done", fields, part=part))
        elif item.kind == "function_call":
            events.append(_event("function_call_arguments.done", fields, name=item.name,
                                 arguments=item.text))  # fmt: skip
        else:  # a custom tool's call: added, its whole input, done
            added = self._item_json(item, "in_progress") | {"input": ""}
            events.append(_event("output_item.added", {}, output_index=item.output_index,
                                 item=added))  # fmt: skip
            custom_input = _custom_input(item.text)
            if custom_input:
                events.append(_event("custom_tool_call_input.delta", fields, delta=custom_input))
            events.append(_event("custom_tool_call_input.done", fields, input=custom_input))
        item_json = self._item_json(item, status)
        events.append(_event("output_item.done", {}, output_index=item.output_index,
                             item=item_json))  # fmt: skip
        return events

    def _item_json(self, item: _Item, status: str) -> dict[str, Any]:
        is_started = bool(item.parts) or status != "in_progress"
        if item.kind == "message":
            content = [_part("message", item.text, item.logprobs)] if is_started else []
            return {"id": item.id, "type": "message", "status": status, "role": "assistant",
                    "content": content}  # fmt: skip
        if item.kind == "reasoning":
            content = [_part("reasoning", item.text, [])] if is_started else []
            return {"id": item.id, "type": "reasoning", "summary": [], "content": content,
                    "status": status}  # fmt: skip
        common = {"id": item.id, "type": item.kind, "status": status, "call_id": item.call_id,
                  "name": item.name}  # fmt: skip
        if item.kind == "function_call":
            return common | {"arguments": item.text}
        return common | {"input": _custom_input(item.text)}


def _event(event_name: str, base: dict[str, Any], **fields: Any) -> ItemEvent:
    return ItemEvent(f"response.{event_name}", base | fields)


def _part(kind: str, text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def _custom_input(arguments: str) -> str:
    """A custom tool's input: the `input` string of the arguments the model
    wrote, or their raw text when they are not that shape (a cut call)."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return value["input"]
    return arguments
