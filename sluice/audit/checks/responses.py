"""Checks of a Responses API stream's events (POST /v1/responses, stream true).

Invariants (the ids are in catalogue.py):
- `agent_framing`: every event is `event: <type>` + `data: <JSON object>`
  (the name, when given, is the data's type); the stream ends with a whole event;
- `responses_sequence`: `sequence_number` counts 0, 1, 2, ... one per event;
- `responses_created_first`: the first event is `response.created`;
- `responses_terminal`: exactly one terminal event (`response.completed`,
  `.incomplete`, `.failed`), the last, whose response's status it names
  (an `error` event may end a stream instead: a note);
- `responses_item_order`: every `output_item.added` (output_index 0, 1, ...)
  is closed by its `output_item.done`, in the order they were added, parts
  (`content_part.added`/`.done`) paired inside their item, nothing open at
  the terminal event;
- `responses_index_mismatch`: an event's output_index, content_index or
  item_id names no open item or part;
- `responses_empty_delta`: a `*.delta` event whose delta is empty;
- `responses_delta_mismatch`: the deltas of an item's part do not concatenate
  to its `.done` value, to the item of its `output_item.done`, or to the
  item of the terminal response.
The terminal response is then checked as a non-streamed body is
(responses_final.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.audit.agent_events import AgentStream, NamedEvent, read_events
from sluice.audit.checks.evidence import escape_bytes, finding
from sluice.audit.checks.responses_fields import missing_index_fields
from sluice.audit.records import RESPONSES, Exchange, Finding
from sluice.audit.stream_view import StreamView

TERMINAL = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "failed",
}
# A delta event's family (its type without ".delta"), and the field of its
# `.done` event that holds the whole value.
DONE_FIELDS = {
    "response.output_text": "text",
    "response.refusal": "refusal",
    "response.reasoning_text": "text",
    "response.reasoning_summary_text": "text",
    "response.function_call_arguments": "arguments",
    "response.custom_tool_call_input": "input",
}

# (check id, event number, message)
Problem = tuple[str, int, str]


def is_responses_stream(exchange: Exchange) -> bool:
    return exchange.endpoint == RESPONSES and exchange.is_stream and exchange.status == 200


def check_responses_stream(exchange: Exchange, view: StreamView) -> list[Finding]:
    if not is_responses_stream(exchange):
        return []
    stream = read_events(exchange)
    problems = framing_problems(stream, needs_names=False)
    events = [event for event in stream.events if event.payload is not None]
    problems += _sequence_problems(events) + _terminal_problems(events, exchange)
    missing, events = missing_index_fields(events)
    problems += missing + _Items().read(events)
    return [finding(check_id, exchange, message, [number], view=view,
                    cause=_CAUSES.get(check_id)) for check_id, number, message in problems]  # fmt: skip


# Findings whose wording names where it showed: one cause, wherever it showed.
_CAUSES = {"responses_delta_mismatch": "an item's deltas do not add up to its whole value"}


def framing_problems(stream: AgentStream, *, needs_names: bool) -> list[Problem]:
    problems = [("agent_framing", e.number, e.problem) for e in stream.events if e.problem]
    if needs_names:
        problems += [("agent_framing", e.number, "no `event:` line")
                     for e in stream.events if e.name is None and not e.problem]  # fmt: skip
    if stream.trailing:
        last = stream.events[-1].number + 1 if stream.events else 0
        problems.append(("agent_framing", last, f"unterminated: {escape_bytes(stream.trailing)}"))
    return problems


def _sequence_problems(events: list[NamedEvent]) -> list[Problem]:
    for position, event in enumerate(events):
        number = event.payload.get("sequence_number")  # type: ignore[union-attr]
        if number != position:
            message = f"event {position} ({event.type}) has sequence_number {number!r}"
            return [("responses_sequence", event.number, message)]
    return []


def _terminal_problems(events: list[NamedEvent], exchange: Exchange) -> list[Problem]:
    if not events:
        return [("responses_terminal", 0, "no event at all")]
    problems: list[Problem] = []
    if events[0].type != "response.created":
        message = f"the first event is {events[0].type!r}"
        problems.append(("responses_created_first", events[0].number, message))
    terminals = [event for event in events if event.type in TERMINAL]
    errors = [event for event in events if event.type == "error"]
    last = events[-1]
    if errors and (not terminals or terminals == [last]):
        message = f"error: {str(errors[0].payload.get('message'))[:120]}"  # type: ignore[union-attr]
        problems.append(("stream_ended_by_error", errors[0].number, message))
    elif len(terminals) != 1 or terminals[0] is not last:
        names = [event.type for event in terminals]
        message = f"terminal events {names}, the last event being {last.type!r}"
        numbers = [event.number for event in terminals] or [last.number]
        problems += [("responses_terminal", number, message) for number in numbers]
    for event in terminals:
        status = (event.payload.get("response") or {}).get("status")  # type: ignore[union-attr]
        if status != TERMINAL[event.type]:
            message = f"{event.type} carries a response whose status is {status!r}"
            problems.append(("responses_terminal", event.number, message))
    return problems


@dataclass(slots=True)
class _Items:
    """Walks the item events in order, tracking what is open and what streamed."""

    # output_index -> item id, for items added and not yet done (in added order).
    open_items: dict[int, Any] = field(default_factory=dict)
    num_added: int = 0
    open_parts: set[tuple[int, int]] = field(default_factory=set)
    # (output_index, part index, family) -> the deltas joined so far.
    streamed: dict[tuple[int, int, str], str] = field(default_factory=dict)
    # output_index -> the item of its output_item.done.
    done_items: dict[int, dict[str, Any]] = field(default_factory=dict)
    # output_index -> the call_id its output_item.added announced.
    call_ids: dict[int, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def read(self, events: list[NamedEvent]) -> list[Problem]:
        for event in events:
            payload: dict[str, Any] = event.payload  # type: ignore[assignment]
            kind = event.type
            if kind == "response.output_item.added":
                self._added(event.number, payload)
            elif kind == "response.output_item.done":
                self._done(event.number, payload)
            elif kind.startswith("response.content_part."):
                self._part(event.number, kind, payload)
            elif kind in TERMINAL:
                self._terminal(event.number, payload.get("response"))
            elif "output_index" in payload:
                self._content(event.number, kind, payload)
        return self.problems

    def _problem(self, check_id: str, number: int, message: str) -> None:
        self.problems.append((check_id, number, message))

    def _added(self, number: int, payload: dict[str, Any]) -> None:
        index, item = payload.get("output_index"), payload.get("item")
        if index != self.num_added or not isinstance(item, dict):
            message = f"output_item.added with output_index {index!r}, expected {self.num_added}"
            self._problem("responses_item_order", number, message)
        self.num_added += 1
        if isinstance(index, int) and isinstance(item, dict):
            self.open_items[index] = item.get("id")
            self.call_ids[index] = item.get("call_id")

    def _done(self, number: int, payload: dict[str, Any]) -> None:
        index, item = payload.get("output_index"), payload.get("item")
        first_open = next(iter(self.open_items), None)
        if index not in self.open_items:
            self._problem("responses_item_order", number, f"output_item.done for item {index!r}, "
                          "which is not open")  # fmt: skip
            return
        if index != first_open:
            self._problem("responses_item_order", number, f"item {index} done before item "
                          f"{first_open}, added earlier")  # fmt: skip
        if any(part[0] == index for part in self.open_parts):
            self._problem("responses_item_order", number, f"item {index} done with a part open")
        item = item if isinstance(item, dict) else {}
        if (item.get("id"), item.get("call_id")) != (
            self.open_items.pop(index),
            self.call_ids.get(index),
        ):
            self._problem("responses_index_mismatch", number, f"output_item.done of item "
                          f"{index} carries another id or call_id than its output_item.added")  # fmt: skip
        self.done_items[index] = item
        self._compare_done_item(number, index, item)

    def _part(self, number: int, kind: str, payload: dict[str, Any]) -> None:
        key = (payload.get("output_index"), payload.get("content_index"))
        if not self._names_open_item(number, kind, payload):
            return
        if kind.endswith(".added"):
            if key in self.open_parts:
                self._problem("responses_item_order", number, f"part {key} added twice")
            self.open_parts.add(key)  # type: ignore[arg-type]
        elif key not in self.open_parts:
            self._problem("responses_item_order", number, f"content_part.done for part {key}, "
                          "which is not open")  # fmt: skip
        else:
            self.open_parts.discard(key)

    def _names_open_item(self, number: int, kind: str, payload: dict[str, Any]) -> bool:
        index = payload.get("output_index")
        if index not in self.open_items:
            message = f"{kind} names output_index {index!r}, which is not open"
            self._problem("responses_index_mismatch", number, message)
            return False
        if "item_id" in payload and payload["item_id"] != self.open_items[index]:
            message = f"{kind} names item_id {payload['item_id']!r}, not item {index}'s"
            self._problem("responses_index_mismatch", number, message)
        return True

    def _content(self, number: int, kind: str, payload: dict[str, Any]) -> None:
        if not self._names_open_item(number, kind, payload):
            return
        family, _, suffix = kind.rpartition(".")
        part = payload.get("content_index", payload.get("summary_index", 0))
        key = (payload["output_index"], part, family)
        if family in ("response.output_text", "response.refusal") and (
            (key[0], part) not in self.open_parts
        ):
            self._problem("responses_index_mismatch", number,
                          f"{kind} names content_index {part!r}, no open part")  # fmt: skip
        if suffix == "delta":
            delta = payload.get("delta")
            if not isinstance(delta, str) or not delta:
                self._problem("responses_empty_delta", number, f"{kind} with delta {delta!r}")
            self.streamed[key] = self.streamed.get(key, "") + (delta or "")
        elif suffix == "done" and family in DONE_FIELDS:
            whole, joined = payload.get(DONE_FIELDS[family]), self.streamed.get(key, "")
            if whole != joined:
                self._mismatch(number, f"{kind}", joined, whole)

    def _mismatch(self, number: int, where: str, joined: str, whole: Any) -> None:
        message = f"deltas join to {joined[:60]!r}, {where} holds {str(whole)[:60]!r}"
        self._problem("responses_delta_mismatch", number, message)

    def _compare_done_item(self, number: int, index: int, item: dict[str, Any]) -> None:
        for (item_index, part, family), joined in self.streamed.items():
            if item_index == index:
                whole = item_value(item, family, part)
                if whole != joined:
                    self._mismatch(number, f"output_item.done of item {index}", joined, whole)

    def _terminal(self, number: int, response: Any) -> None:
        if self.open_items or self.open_parts:
            message = f"terminal event with items {list(self.open_items)} still open"
            self._problem("responses_item_order", number, message)
        output = response.get("output") if isinstance(response, dict) else None
        output = output if isinstance(output, list) else []
        for index, item in self.done_items.items():
            whole = output[index] if index < len(output) and isinstance(output[index], dict) else {}
            if (whole.get("id"), whole.get("call_id")) != (item.get("id"), item.get("call_id")):
                message = f"the terminal response's item {index} has another id or call_id"
                self._problem("responses_index_mismatch", number, message)
        for (index, part, family), joined in self.streamed.items():
            item = output[index] if index < len(output) else {}
            whole = item_value(item if isinstance(item, dict) else {}, family, part)
            if whole != joined:
                self._mismatch(number, f"the terminal response's item {index}", joined, whole)


def item_value(item: dict[str, Any], family: str, part: int) -> Any:
    """What the deltas of `family` (part `part`) must join to, in a whole item."""
    if family in ("response.function_call_arguments", "response.custom_tool_call_input"):
        return item.get("arguments" if family.endswith("arguments") else "input")
    parts_key = "summary" if family == "response.reasoning_summary_text" else "content"
    parts = item.get(parts_key)
    if not isinstance(parts, list) or not 0 <= part < len(parts):
        return None
    text_key = "refusal" if family == "response.refusal" else "text"
    return parts[part].get(text_key) if isinstance(parts[part], dict) else None
