"""One chat choice read through its `OutputParsing` (sluice/tools): reasoning,
content and tool calls in OpenAI's shapes, for stream deltas and for the
non-streamed message.

`ParsedChoice` is the owner, per choice on the event loop, of everything the
parsing adds to a choice: its `MessageStream` (the text so far and what of it
was sent), logprob entries waiting for a chunk (tokens whose text is still
undecided: a cut tag, a call without its name yet), and, folded, the message
of a non-streamed response. Streamed deltas and the folded message come from
the same `MessageDelta`s, so they carry the same calls byte for byte.
Shapes (vLLM's and OpenAI's):
- a delta: `reasoning_content` and `reasoning` (the same text: the older and
  the newer name), `content`, `tool_calls` entries `{"index", "id", "type":
  "function", "function": {"name", "arguments"}}` on a call's first delta,
  then `{"index", "function": {"arguments"}}` with what extends them;
- the message: `content` (null when empty and there are calls or reasoning),
  `tool_calls` when there are any, `reasoning_content` and `reasoning` when
  a reasoning parser is on (null when empty);
- `finish_reason` "tool_calls" in place of "stop" when the choice made calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.tools.message_stream import MessageDelta, ToolCallDelta
from sluice.tools.output_parsing import OutputParsing


@dataclass(slots=True)
class _FoldedCall:
    id: str
    name: str
    argument_parts: list[str] = field(default_factory=list)


class ParsedChoice:
    def __init__(self, parsing: OutputParsing):
        self._stream = parsing.message_stream()
        self._has_reasoning = parsing.reasoning_parser is not None
        # Logprob entries of tokens whose text no chunk carried yet.
        self._pending_entries: list[dict[str, Any]] = []
        self._reasoning_parts: list[str] = []
        self._content_parts: list[str] = []
        self._calls: list[_FoldedCall] = []

    def push(self, text: str, is_final: bool) -> MessageDelta:
        return self._stream.push(text, is_final)

    def finish_reason(self, finish_reason: str | None) -> str | None:
        if finish_reason == "stop" and self._stream.has_tool_calls:
            return "tool_calls"
        return finish_reason

    def entries(self, entries: list[dict[str, Any]] | None, is_sent: bool) -> list | None:
        """The logprob entries a chunk carries: those held back first. Not
        `is_sent` (the chunk is skipped): they wait for the next one. A chunk
        without tokens of its own (a finish with none) still carries the held
        ones: none may be lost."""
        if entries is not None:
            self._pending_entries += entries
        if not is_sent or (entries is None and not self._pending_entries):
            return None
        sent, self._pending_entries = self._pending_entries, []
        return sent

    # -- folded (non-streamed) ------------------------------------------------

    def fold(self, delta: MessageDelta) -> None:
        self._reasoning_parts.append(delta.reasoning)
        self._content_parts.append(delta.content)
        for call in delta.tool_calls:
            if call.id is not None:
                assert call.name is not None, "a call's first delta names it"
                self._calls.append(_FoldedCall(call.id, call.name))
            self._calls[call.index].argument_parts.append(call.arguments)

    def message(self) -> dict[str, Any]:
        content = "".join(self._content_parts)
        reasoning = "".join(self._reasoning_parts)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if not content and (self._calls or reasoning):
            message["content"] = None
        if self._calls:
            message["tool_calls"] = [_message_tool_call(call) for call in self._calls]
        if self._has_reasoning:
            message["reasoning_content"] = message["reasoning"] = reasoning or None
        return message


def delta_fields(delta: MessageDelta) -> dict[str, Any]:
    """A stream chunk's `delta` object for what `delta` adds."""
    fields: dict[str, Any] = {}
    if delta.reasoning:
        fields["reasoning_content"] = fields["reasoning"] = delta.reasoning
    if delta.content:
        fields["content"] = delta.content
    if delta.tool_calls:
        fields["tool_calls"] = [_tool_call_delta(call) for call in delta.tool_calls]
    return fields


def _tool_call_delta(call: ToolCallDelta) -> dict[str, Any]:
    if call.id is None:
        return {"index": call.index, "function": {"arguments": call.arguments}}
    return {
        "index": call.index,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _message_tool_call(call: _FoldedCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": "".join(call.argument_parts)},
    }
