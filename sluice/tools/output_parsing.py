"""How a chat request's choices are read: one frozen value, `OutputParsing`,
built at the HTTP edge and carried by the `GenerationRequest`; the chunk
builder asks it for one `MessageStream` per choice."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.tools.call_lists import RequiredParser, named_function_parser
from sluice.tools.calls import ToolCallParser
from sluice.tools.harmony import HARMONY, HarmonyReader
from sluice.tools.message_stream import MessageStream
from sluice.tools.parsers import TOOL_CALL_PARSERS
from sluice.tools.reasoning import REASONING_PARSERS

# What constrained decoding forces for tool_choice "required" / a named function.
REQUIRED_FORMAT, NAMED_FORMAT = "required", "named"


@dataclass(frozen=True, slots=True)
class OutputParsing:
    # How tool calls are read: a name of TOOL_CALL_PARSERS, REQUIRED_FORMAT (a
    # JSON array of calls) or NAMED_FORMAT (the arguments of `function_name`);
    # None: no tool calls.
    tool_call_format: str | None = None
    function_name: str | None = None
    # A name of REASONING_PARSERS, HARMONY (which reads tool calls too, when
    # tool_call_format is HARMONY), or None.
    reasoning_parser: str | None = None
    # parallel_tool_calls false: 1; None: no bound.
    max_calls: int | None = None

    def __post_init__(self) -> None:
        known = {*TOOL_CALL_PARSERS, REQUIRED_FORMAT, NAMED_FORMAT, HARMONY, None}
        assert self.tool_call_format in known, f"unknown format {self.tool_call_format!r}"
        assert (self.tool_call_format == NAMED_FORMAT) == (self.function_name is not None), (
            "a function name exactly with the named format"
        )
        assert self.reasoning_parser in {*REASONING_PARSERS, HARMONY, None}, "known parser"

    @property
    def reads_tool_calls(self) -> bool:
        return self.tool_call_format is not None

    @property
    def is_harmony(self) -> bool:
        """gpt-oss's harmony text, read whole by one reader (its channels are
        its format: split even where only its calls were asked for), with its
        special tokens kept."""
        return HARMONY in (self.reasoning_parser, self.tool_call_format)

    def message_stream(self) -> MessageStream:
        """A new stream for one choice."""
        if self.is_harmony:
            harmony = HarmonyReader(reads_calls=self.tool_call_format == HARMONY)
            return MessageStream(None, None, self.max_calls, harmony)
        reasoning = None
        if self.reasoning_parser is not None:
            reasoning = REASONING_PARSERS[self.reasoning_parser]
        return MessageStream(self._tool_call_parser(), reasoning, self.max_calls)

    def _tool_call_parser(self) -> ToolCallParser | None:
        if self.tool_call_format == REQUIRED_FORMAT:
            return RequiredParser
        if self.tool_call_format == NAMED_FORMAT:
            assert self.function_name is not None, "checked at construction"
            return named_function_parser(self.function_name)
        if self.tool_call_format is None:
            return None
        return TOOL_CALL_PARSERS[self.tool_call_format]
