"""One choice's assistant message read from its growing text: reasoning,
content and tool calls, as deltas of what is new.

`MessageStream` is the one owner, per choice on the event loop, of what was
generated and what was sent of it. Each delta of text goes to the reasoning
parser, and the content it decides to the tool-call parser (gpt-oss's
harmony: one reader, `sluice/tools/harmony.py`, decides all three); each keeps where
it stopped and returns only what the new text decided (`sluice/tools/calls.py`),
so a delta costs about the time of its own text however long the message is.
The stream adds an id to each call's first delta (its name and first argument
text), then sends argument text that extends it. What a parser sends it never
takes back, so however the text is cut into deltas, the sent pieces add up to
the parse of the whole text: a streamed message equals the non-streamed one
byte for byte.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from sluice.tools.calls import CallPiece, ToolCallParser
from sluice.tools.harmony import HarmonyReader
from sluice.tools.reasoning import ReasoningParser


def new_tool_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass(slots=True)
class ToolCallDelta:
    index: int
    # id and name: on the call's first delta only.
    id: str | None
    name: str | None
    # Argument text that extends what was sent ("" on a first delta with none yet).
    arguments: str


@dataclass(slots=True)
class MessageDelta:
    """What one push adds: reasoning (which comes before everything else the
    push decided), then content (a str) and calls' deltas in the text's
    order. A projection that builds items or blocks in order (Responses,
    Messages) applies `parts` in order: one token may end a call and begin
    the text after it (`"}}.`)."""

    reasoning: str = ""
    parts: list[str | ToolCallDelta] = field(default_factory=list)

    @classmethod
    def of_content(cls, content: str) -> MessageDelta:
        return cls(parts=[content] if content else [])

    @property
    def content(self) -> str:
        return "".join(part for part in self.parts if isinstance(part, str))

    @property
    def tool_calls(self) -> list[ToolCallDelta]:
        return [part for part in self.parts if isinstance(part, ToolCallDelta)]

    @property
    def is_empty(self) -> bool:
        return not self.reasoning and not self.parts


class MessageStream:
    """The parse of one choice's text so far, and what of it went out."""

    def __init__(
        self,
        tool_call_parser: ToolCallParser | None,
        reasoning_parser: ReasoningParser | None,
        max_calls: int | None = None,
        harmony: HarmonyReader | None = None,
    ):
        # One reader of each per choice: each keeps where it stopped.
        self._tool_calls = None if tool_call_parser is None else tool_call_parser()
        self._reasoning = None if reasoning_parser is None else reasoning_parser()
        # gpt-oss's harmony: one reader splits reasoning, content and calls.
        self._harmony = harmony
        # parallel_tool_calls false: calls past the first are not read.
        self._max_calls = max_calls
        self._num_calls = 0

    @property
    def has_tool_calls(self) -> bool:
        return self._num_calls > 0

    def push(self, text: str, is_final: bool) -> MessageDelta:
        """Take the choice's next text (`is_final`: it is the last) and return what
        is new; an empty delta when everything new is still undecided."""
        delta = MessageDelta()
        if self._harmony is not None:
            piece = self._harmony.push(text, is_final)
            delta.reasoning = piece.reasoning
            self._add_parts(delta, piece.parts)
            return delta
        content = text
        if self._reasoning is not None:
            split = self._reasoning.push(text, is_final)
            delta.reasoning, content = split.reasoning, split.content
        if self._tool_calls is None:
            delta.parts = [content] if content else []
            return delta
        self._add_parts(delta, self._tool_calls.push(content, is_final).parts)
        return delta

    def _add_parts(self, delta: MessageDelta, parts: list[str | CallPiece]) -> None:
        for part in parts:
            if isinstance(part, str):
                delta.parts.append(part)
            elif self._max_calls is None or part.index < self._max_calls:
                delta.parts.append(self._call_delta(part))

    def _call_delta(self, call: CallPiece) -> ToolCallDelta:
        if call.name is None:
            return ToolCallDelta(call.index, None, None, call.arguments)
        assert call.index == self._num_calls, "calls are announced in order, once"
        self._num_calls += 1
        return ToolCallDelta(call.index, new_tool_call_id(), call.name, call.arguments)
