"""Tool calls and reasoning text read from a model's output, exact under any
chunking of the stream.

Re-exports lazily (`sluice.lazy_exports`): the package's modules import each
other, never this package's names.
"""

from typing import TYPE_CHECKING

from sluice.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from sluice.tools.calls import ParsedCall, ParsedText
    from sluice.tools.message_stream import MessageDelta, MessageStream, ToolCallDelta
    from sluice.tools.parsers import TOOL_CALL_PARSERS, guess_tool_call_parser
    from sluice.tools.reasoning import REASONING_PARSERS

__all__ = [
    "REASONING_PARSERS",
    "TOOL_CALL_PARSERS",
    "MessageDelta",
    "MessageStream",
    "ParsedCall",
    "ParsedText",
    "ToolCallDelta",
    "guess_tool_call_parser",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "ParsedCall": "sluice.tools.calls",
        "ParsedText": "sluice.tools.calls",
        "MessageDelta": "sluice.tools.message_stream",
        "MessageStream": "sluice.tools.message_stream",
        "ToolCallDelta": "sluice.tools.message_stream",
        "TOOL_CALL_PARSERS": "sluice.tools.parsers",
        "guess_tool_call_parser": "sluice.tools.parsers",
        "REASONING_PARSERS": "sluice.tools.reasoning",
    },
)
