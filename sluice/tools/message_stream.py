"""One choice's assistant message read from its growing text: reasoning,
content and tool calls, as deltas of what is new.

`MessageStream` is the one owner, per choice on the event loop, of what was
generated and what was sent of it. After each delta of text it parses all the
text so far (reasoning parser, then the tool-call parser on the content) and
returns only what grew since the last call: new reasoning, new content, and
per call index the id, type and name once, then the argument text that extends
what was sent. The parsers promise that a prefix's parse is a prefix of the
whole's (`sluice/tools/calls.py`; this class asserts that nothing shrinks and
no call changes its name), so however the text is cut into deltas, the sent
pieces add up to the parse of the whole text: a streamed message equals the
non-streamed one byte for byte.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from sluice.tools.calls import ParsedText
from sluice.tools.parsers import ToolCallParser
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
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.reasoning and not self.content and not self.tool_calls


@dataclass(slots=True)
class _SentCall:
    id: str
    name: str
    num_argument_chars: int = 0


class MessageStream:
    """The parse of one choice's text so far, and what of it went out."""

    def __init__(
        self,
        tool_call_parser: ToolCallParser | None,
        reasoning_parser: ReasoningParser | None,
        max_calls: int | None = None,
    ):
        self._tool_call_parser = tool_call_parser
        self._reasoning_parser = reasoning_parser
        # parallel_tool_calls false: calls past the first are not read.
        self._max_calls = max_calls
        self._text = ""
        self._num_reasoning_chars = 0
        self._num_content_chars = 0
        self._sent_calls: list[_SentCall] = []

    @property
    def has_tool_calls(self) -> bool:
        return bool(self._sent_calls)

    def push(self, text: str, is_final: bool) -> MessageDelta:
        """Take the choice's next text (`is_final`: it is the last) and return what
        is new; an empty delta when everything new is still undecided."""
        self._text += text
        delta = MessageDelta()
        content = self._text
        if self._reasoning_parser is not None:
            split = self._reasoning_parser(self._text, is_final)
            delta.reasoning = self._grown(split.reasoning, self._num_reasoning_chars, "reasoning")
            self._num_reasoning_chars = len(split.reasoning)
            content = split.content or ""
        parsed = self._parse_calls(content, is_final)
        delta.content = self._grown(parsed.content, self._num_content_chars, "content")
        self._num_content_chars = len(parsed.content)
        for index, call in enumerate(parsed.calls[: self._max_calls]):
            if index == len(self._sent_calls):
                self._sent_calls.append(_SentCall(new_tool_call_id(), call.name))
                sent = self._sent_calls[index]
                delta.tool_calls.append(ToolCallDelta(index, sent.id, call.name, call.arguments))
            else:
                sent = self._sent_calls[index]
                assert call.name == sent.name, "a sent call keeps its name"
                new = self._grown(call.arguments, sent.num_argument_chars, "arguments")
                if new:
                    delta.tool_calls.append(ToolCallDelta(index, None, None, new))
            sent.num_argument_chars = len(call.arguments)
        assert len(parsed.calls[: self._max_calls]) == len(self._sent_calls), "calls never vanish"
        return delta

    def _parse_calls(self, content: str, is_final: bool) -> ParsedText:
        if self._tool_call_parser is None:
            return ParsedText(content)
        return self._tool_call_parser(content, is_final)

    def _grown(self, now: str, num_sent_chars: int, what: str) -> str:
        assert len(now) >= num_sent_chars, f"sent {what} was taken back"
        return now[num_sent_chars:]
