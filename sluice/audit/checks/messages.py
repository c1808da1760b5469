"""Checks of an Anthropic Messages stream's events (POST /v1/messages, stream true).

Invariants (the ids are in catalogue.py):
- `agent_framing`: every event is `event: <type>` + `data: <JSON object>` of
  that type (Anthropic's SDK dispatches on the event name: it is required);
- `messages_start_first`: the first event is `message_start`, with
  `usage.input_tokens`;
- `messages_block_order`: blocks start at index 0, 1, ...; a delta or a stop
  names a started block not yet stopped; every block stops before
  `message_delta`;
- `messages_delta_type`: a delta fits its block: `text_delta` on `text`,
  `input_json_delta` on `tool_use`, `thinking_delta`/`signature_delta` on
  `thinking`;
- `messages_empty_delta`: a text or thinking delta without text (an empty
  `partial_json` is what Anthropic itself opens a tool_use block with: allowed);
- `messages_end`: one `message_delta`, then one `message_stop`, last;
- `messages_usage`: `message_delta` carries `usage.output_tokens`.
The message the events accumulate to (as the `anthropic` SDK accumulates it)
is then checked as a non-streamed body is (messages_final.py).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import jiter

from sluice.audit.agent_events import NamedEvent, read_events
from sluice.audit.checks.evidence import finding
from sluice.audit.checks.responses import Problem, framing_problems
from sluice.audit.records import MESSAGES, Exchange, Finding
from sluice.audit.stream_view import StreamView

# delta type -> (the block type it extends, the field holding its text)
DELTA_FITS = {
    "text_delta": ("text", "text"),
    "input_json_delta": ("tool_use", "partial_json"),
    "thinking_delta": ("thinking", "thinking"),
    "signature_delta": ("thinking", "signature"),
    "citations_delta": ("text", "citation"),
}
_MAY_BE_EMPTY = frozenset({"partial_json", "signature"})


def is_messages_stream(exchange: Exchange) -> bool:
    return exchange.endpoint == MESSAGES and exchange.is_stream and exchange.status == 200


def check_messages_stream(exchange: Exchange, view: StreamView) -> list[Finding]:
    if not is_messages_stream(exchange):
        return []
    stream = read_events(exchange)
    problems = framing_problems(stream, needs_names=True)
    events = [event for event in stream.events if event.payload is not None]
    problems += accumulate(events).problems
    return [finding(check_id, exchange, message, [number], view=view)
            for check_id, number, message in problems]  # fmt: skip


@dataclass(slots=True)
class Accumulated:
    """A stream's message as the SDK builds it, and what broke on the way."""

    message: dict[str, Any] | None = None
    # Per block index: the joined partial_json of a tool_use block.
    json_texts: dict[int, str] = field(default_factory=dict)
    open_blocks: set[int] = field(default_factory=set)
    num_message_deltas: int = 0
    stop_number: int | None = None
    ended_by_error: bool = False
    problems: list[Problem] = field(default_factory=list)


def accumulate(events: list[NamedEvent]) -> Accumulated:
    state = Accumulated()
    if not events:
        state.problems.append(("messages_start_first", 0, "no event at all"))
        return state
    _start(state, events[0])
    for event in events[1:]:
        if state.stop_number is not None:
            message = f"{event.type} after message_stop"
            state.problems.append(("messages_end", event.number, message))
        _read(state, event)
    if state.ended_by_error:
        return state
    if state.stop_number is None or state.num_message_deltas != 1:
        message = f"{state.num_message_deltas} message_delta events, message_stop " + (
            "missing" if state.stop_number is None else "present")  # fmt: skip
        state.problems.append(("messages_end", events[-1].number, message))
    _parse_inputs(state)
    return state


def _start(state: Accumulated, event: NamedEvent) -> None:
    message = event.payload.get("message") if event.type == "message_start" else None  # type: ignore[union-attr]
    if not isinstance(message, dict):
        problem = f"the first event is {event.type!r}"
        state.problems.append(("messages_start_first", event.number, problem))
        message = {"content": [], "usage": {}}
    usage = message.get("usage")
    if not isinstance(usage, dict) or not isinstance(usage.get("input_tokens"), int):
        problem = f"message_start's usage is {usage!r}, without input_tokens"
        state.problems.append(("messages_start_first", event.number, problem))
    state.message = {**message, "content": [], "usage": dict(usage or {})}


def _read(state: Accumulated, event: NamedEvent) -> None:
    payload: dict[str, Any] = event.payload  # type: ignore[assignment]
    kind = event.type
    if kind == "content_block_start":
        _block_start(state, event.number, payload)
    elif kind == "content_block_delta":
        _block_delta(state, event.number, payload)
    elif kind == "content_block_stop":
        if payload.get("index") not in state.open_blocks:
            message = f"content_block_stop of block {payload.get('index')!r}, which is not open"
            state.problems.append(("messages_block_order", event.number, message))
        state.open_blocks.discard(payload.get("index"))
    elif kind == "message_delta":
        _message_delta(state, event.number, payload)
    elif kind == "message_stop":
        state.stop_number = event.number
    elif kind == "error":
        state.ended_by_error = True
        message = f"error: {str(payload.get('error'))[:120]}"
        state.problems.append(("stream_ended_by_error", event.number, message))


def _block_start(state: Accumulated, number: int, payload: dict[str, Any]) -> None:
    content = state.message["content"]  # type: ignore[index]
    index, block = payload.get("index"), payload.get("content_block")
    if index != len(content) or not isinstance(block, dict):
        message = f"content_block_start of block {index!r}, expected {len(content)}"
        state.problems.append(("messages_block_order", number, message))
    content.append(dict(block) if isinstance(block, dict) else {})
    state.open_blocks.add(len(content) - 1)


def _block_delta(state: Accumulated, number: int, payload: dict[str, Any]) -> None:
    index, delta = payload.get("index"), payload.get("delta")
    content = state.message["content"]  # type: ignore[index]
    if index not in state.open_blocks:
        message = f"content_block_delta on block {index!r}, which is not open"
        state.problems.append(("messages_block_order", number, message))
        return
    delta = delta if isinstance(delta, dict) else {}
    block_type, key = DELTA_FITS.get(delta.get("type"), (None, ""))  # type: ignore[arg-type]
    block = content[index]
    if block_type != block.get("type"):
        message = f"a {delta.get('type')!r} on a {block.get('type')!r} block (block {index})"
        state.problems.append(("messages_delta_type", number, message))
        return
    piece = delta.get(key)
    if key not in _MAY_BE_EMPTY and (not isinstance(piece, str) or not piece):
        state.problems.append(("messages_empty_delta", number, f"{delta.get('type')} {piece!r}"))
    if key == "partial_json":
        state.json_texts[index] = state.json_texts.get(index, "") + str(piece or "")
    elif isinstance(piece, str):
        block[key] = str(block.get(key, "")) + piece


def _message_delta(state: Accumulated, number: int, payload: dict[str, Any]) -> None:
    state.num_message_deltas += 1
    if state.open_blocks:
        message = f"message_delta with blocks {sorted(state.open_blocks)} still open"
        state.problems.append(("messages_block_order", number, message))
    delta, usage = payload.get("delta"), payload.get("usage")
    message_ = state.message
    assert message_ is not None, "set by the first event"
    if isinstance(delta, dict):
        message_["stop_reason"] = delta.get("stop_reason")
        message_["stop_sequence"] = delta.get("stop_sequence")
    if isinstance(usage, dict):
        message_["usage"].update(usage)
    if not isinstance(usage, dict) or not isinstance(usage.get("output_tokens"), int):
        # message_start's output_tokens are a placeholder: these are the count.
        state.problems.append(("messages_usage", number, f"message_delta's usage is {usage!r}"))


def _parse_inputs(state: Accumulated) -> None:
    """A tool_use block's input: its joined partial_json ({} when there was
    none). In a message cut by max_tokens, a cut input is read as Anthropic's
    SDK reads it (jiter's partial mode), which is what its users get."""
    content = state.message["content"]  # type: ignore[index]
    is_cut = state.message.get("stop_reason") == "max_tokens"  # type: ignore[union-attr]
    for index, text in state.json_texts.items():
        try:
            content[index]["input"] = json.loads(text) if text else {}
        except ValueError:
            content[index]["input"] = text  # not JSON: messages_final reports it
            if is_cut:
                with contextlib.suppress(ValueError):
                    content[index]["input"] = jiter.from_json(text.encode(), partial_mode=True)


def streamed_message(exchange: Exchange) -> tuple[dict[str, Any] | None, list[int]]:
    """The message a stream accumulates to (None when it broke off), and its last event."""
    events = [event for event in read_events(exchange).events if event.payload is not None]
    state = accumulate(events)
    if state.ended_by_error or state.stop_number is None or state.message is None:
        return None, []
    return state.message, [state.stop_number]
