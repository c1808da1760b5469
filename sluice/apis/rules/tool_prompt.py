"""Tools shown by the server, for a chat template that shows none it knows
(`ToolCallFormat.is_shown_by_server`, `sluice/tools/tool_format.py`).

`shown_tools_messages` rewrites a conversation so that any template renders
it: the tools and the call format go into the system prompt (appended to the
first system message, or a new one first); an earlier assistant turn's calls
become text in that format after its content; each run of `tool` results
becomes one user turn of `<tool_response>` blocks (a role every template
knows, where many refuse `tool`). The format is the parser's own, so what the
model is shown is what is read (hermes by default, as Qwen2.5's template
shows it). Pure: the messages given are never changed.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

from sluice.frontend.preprocess import ChatMessage, MessageToolCall
from sluice.tools.harmony import HARMONY
from sluice.tools.tool_format import DEFAULT_TOOL_CALL_PARSER, ToolCallFormat

# How to write calls, in each parser's format.
_CALL_FORMATS = {
    "hermes": (
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    ),
    "llama3_json": (
        "To call functions, respond with only JSON objects of the form "
        '{"name": <function-name>, "parameters": <args-json-object>}, separated by ";".'
    ),
    "mistral": (
        "To call functions, respond with [TOOL_CALLS] followed by a JSON array of "
        '{"name": <function-name>, "arguments": <args-json-object>} objects.'
    ),
    "harmony": (
        "To call a function, write a commentary message to it: <|start|>assistant"
        "<|channel|>commentary to=functions.<function-name> <|constrain|>json"
        "<|message|><args-json-object><|call|>"
    ),
}


def template_inputs(
    messages: list[ChatMessage], tools: list[dict[str, Any]] | None, tool_format: ToolCallFormat
) -> tuple[list[ChatMessage], list[dict[str, Any]] | None]:
    """What the chat template is given: the messages and the tools as they
    are, or, where the server shows the format, the messages with the tools
    and calls written in (and no tools)."""
    if not tool_format.is_shown_by_server:
        return messages, tools
    parser = tool_format.parser or DEFAULT_TOOL_CALL_PARSER
    return shown_tools_messages(messages, tools, parser), None


def shown_tools_messages(
    messages: Sequence[ChatMessage], tools: list[dict[str, Any]] | None, parser: str
) -> list[ChatMessage]:
    """`messages` with `tools` (None: tool_choice none, or no tools) and earlier
    calls and results written out in `parser`'s format."""
    shown: list[ChatMessage] = []
    for is_result, run in itertools.groupby(messages, key=lambda message: message.role == "tool"):
        if is_result:
            responses = [f"<tool_response>\n{m.content}\n</tool_response>" for m in run]
            shown.append(ChatMessage("user", "\n".join(responses)))
        else:
            shown += [_calls_written_out(message, parser) for message in run]
    if not tools:
        return shown
    block = _tools_block(tools, parser)
    if shown and shown[0].role == "system":
        return [ChatMessage("system", f"{shown[0].content}\n\n{block}", shown[0].name), *shown[1:]]
    return [ChatMessage("system", block), *shown]


def _calls_written_out(message: ChatMessage, parser: str) -> ChatMessage:
    if not message.tool_calls:
        return message
    text = "\n".join(filter(None, [message.content, _calls_text(message.tool_calls, parser)]))
    return ChatMessage(message.role, text, message.name)


def _tools_block(tools: list[dict[str, Any]], parser: str) -> str:
    signatures = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{signatures}\n</tools>\n\n{_CALL_FORMATS[parser]}"
    )


def _calls_text(calls: Sequence[MessageToolCall], parser: str) -> str:
    arguments_key = "parameters" if parser == "llama3_json" else "arguments"
    objects = [
        json.dumps({"name": call.name, arguments_key: _arguments(call)}, ensure_ascii=False)
        for call in calls
    ]
    if parser == "hermes":
        return "\n".join(f"<tool_call>\n{text}\n</tool_call>" for text in objects)
    if parser == "llama3_json":
        return "; ".join(objects)
    if parser == HARMONY:
        return "".join(
            f"<|start|>assistant<|channel|>commentary to=functions.{call.name} "
            f"<|constrain|>json<|message|>{json.dumps(_arguments(call), ensure_ascii=False)}<|call|>"
            for call in calls
        )
    return f"[TOOL_CALLS][{', '.join(objects)}]"


def _arguments(call: MessageToolCall) -> Any:
    return call.as_template_dict()["function"]["arguments"]
