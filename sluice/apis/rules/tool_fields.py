"""A chat request's tool fields -> what they mean for the prompt, the
sampling and the reading of the output: one `ToolPlan`.

- `tools` are checked (unique names, object parameter schemas nested at most
  `limits.MAX_JSON_DEPTH` deep, `$defs` an object) and shown to the model in
  the request's shape: by the chat template, or by the server in the system
  prompt where the template shows no format it knows (`ToolCallFormat`,
  `sluice/tools/tool_format.py`; `sluice/apis/rules/tool_prompt.py`).
- `tool_choice` defaults to "auto" with tools, "none" without; any value
  without tools is a 400 (as OpenAI), and so is a named function not in them.
  - "auto": the output is read by the server's tool-call parser
    (`--tool-call-parser`, the one the chat template shows, or the default
    the server shows). With a response format, constrained decoding allows
    either calls or the format's answer (`sluice/tools/call_grammar.py`).
  - "required" / a named function: constrained decoding forces the calls (a
    JSON schema from `sluice/tools/schema.py`), so even a small model answers
    with valid ones; the output is read as that JSON whatever the parser. A
    response format beside it is accepted, as OpenAI and vLLM do: the forced
    call's grammar governs, and no text is left for the format. The
    reasoning parser is off for such a request: the grammar holds from the
    first token, so there is no reasoning to split (`to_internal` turns it
    off for response_format and structured outputs, for the same reason).
  - "none": no tools are shown and nothing is parsed (vLLM with
    `--exclude-tools-when-tool-choice-none`): the model answers in prose.
    So is "auto" on a server started with `--tool-call-parser none`.
- `parallel_tool_calls: false`: at most one call (the schema's maxItems, the
  grammar's one call, or the parser keeps the first).
- An assistant message's `tool_calls` go to the template (their arguments
  parsed from JSON, as HF templates expect, so nested at most
  `limits.MAX_JSON_DEPTH` deep); a `tool` message needs its `tool_call_id`. OpenAI's deprecated `functions` / `function_call` are
  refused by name rather than ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.apis.chat import protocol as chat_protocol
from sluice.apis.rules.structured_fields import GrammarCheck, check_json_schema
from sluice.errors import InvalidRequestError
from sluice.frontend.preprocess import MessageToolCall
from sluice.server.body import limits
from sluice.structured.spec import StructuredOutputSpec
from sluice.tools.call_grammar import calls_or_answer
from sluice.tools.output_parsing import NAMED_FORMAT, REQUIRED_FORMAT, OutputParsing
from sluice.tools.parsers import KEEPS_SPECIAL_TOKENS
from sluice.tools.schema import FunctionTool, named_function_schema, required_schema
from sluice.tools.tool_format import ToolCallFormat


@dataclass(frozen=True, slots=True)
class ToolPlan:
    # The tools shown to the model (by the template or the server); None: no tools.
    template_tools: list[dict[str, Any]] | None = None
    # How the choices' text is read; None: it is the content.
    output_parsing: OutputParsing | None = None
    # The request's one constraint: the forced calls', the calls-or-answer
    # union, or the response format's; None: free text.
    structured_output: StructuredOutputSpec | None = None
    # The parser reads special tokens: the detokenizer must keep them.
    keeps_special_tokens: bool = False

    @property
    def reads_special_tokens(self) -> bool:
        """The text must keep special tokens: mistral's calls, harmony's channels."""
        parsing = self.output_parsing
        return self.keeps_special_tokens or (parsing is not None and parsing.is_harmony)


async def tool_plan(
    body: chat_protocol.ChatCompletionRequest,
    tool_format: ToolCallFormat,
    reasoning_parser: str | None,
    answer: StructuredOutputSpec | None = None,
    check: GrammarCheck = GrammarCheck(),
) -> ToolPlan:
    """`answer`: the request's response format (already checked), if any."""
    _refuse_deprecated_fields(body)
    tools = _function_tools(body.tools)
    choice, function_name = _tool_choice(body.tool_choice, tools)
    reasoning_only = OutputParsing(reasoning_parser=reasoning_parser) if reasoning_parser else None
    if choice == "auto" and tool_format.parser is None:
        # --tool-call-parser none: auto is none, and the tools are not shown at all.
        return ToolPlan(output_parsing=reasoning_only, structured_output=answer)
    template_tools = [tool.as_template_dict() for tool in tools]
    if choice == "none":
        # Shown but not called, as vLLM and OpenAI do: a conversation's prompt
        # keeps one prefix whatever each turn's tool_choice (prefix caching).
        return ToolPlan(template_tools or None, reasoning_only, answer)
    is_parallel = body.parallel_tool_calls is not False
    max_calls = None if is_parallel else 1
    if choice == "auto":
        parser = tool_format.parser
        assert parser is not None, "auto without a parser is served as none"
        parsing = OutputParsing(parser, None, reasoning_parser, max_calls)
        union = None if answer is None else calls_or_answer(tools, parser, is_parallel, answer)
        if union is not None:
            await check(union, "tools", "tool parameters")
        return ToolPlan(template_tools, parsing, union or answer, parser in KEEPS_SPECIAL_TOKENS)
    if choice == "required":
        schema = required_schema(tools, is_parallel)
        parsing = OutputParsing(REQUIRED_FORMAT, max_calls=max_calls)
    else:
        (tool,) = [tool for tool in tools if tool.name == function_name]
        schema = named_function_schema(tool)
        parsing = OutputParsing(NAMED_FORMAT, function_name=tool.name)
    # The forced calls' grammar governs: no text is left for a response format.
    spec = StructuredOutputSpec.json_schema(schema)
    await check(spec, "tools", "tool parameters")
    return ToolPlan(template_tools, parsing, spec)


def message_tool_calls(
    message: chat_protocol.ChatMessage, index: int
) -> tuple[MessageToolCall, ...]:
    """An assistant message's earlier calls; checks a tool message's id."""
    if message.role == "tool" and not message.tool_call_id:
        raise InvalidRequestError(
            "a tool message needs the tool_call_id of the call it answers",
            param=f"messages[{index}].tool_call_id",
        )
    if not message.tool_calls:
        return ()
    if message.role != "assistant":
        raise InvalidRequestError(
            f"only assistant messages carry tool_calls, not {message.role}",
            param=f"messages[{index}].tool_calls",
        )
    for call_index, call in enumerate(message.tool_calls):
        param = f"messages[{index}].tool_calls[{call_index}].function.arguments"
        limits.check_json_text_depth(call.function.arguments, param)
    return tuple(
        MessageToolCall(call.id, call.function.name, call.function.arguments)
        for call in message.tool_calls
    )


def _refuse_deprecated_fields(body: chat_protocol.ChatCompletionRequest) -> None:
    for name in ("functions", "function_call"):
        if getattr(body, name) is not None:
            raise InvalidRequestError(
                f"'{name}' is deprecated and not supported; use 'tools' and 'tool_choice'",
                param=name,
            )


def _function_tools(tools: list[chat_protocol.ChatTool] | None) -> list[FunctionTool]:
    seen: set[str] = set()
    functions = []
    for index, tool in enumerate(tools or ()):
        function = tool.function
        param = f"tools[{index}].function"
        if function.name in seen:
            raise InvalidRequestError(
                f"two tools are named {function.name!r}", param=f"{param}.name"
            )
        seen.add(function.name)
        parameters = function.parameters
        if parameters is not None:
            if parameters.get("type", "object") != "object":
                raise InvalidRequestError(
                    "a function's parameters must be a JSON schema of an object",
                    param=f"{param}.parameters",
                )
            check_json_schema(parameters, f"{param}.parameters")
        functions.append(
            FunctionTool(function.name, function.description, parameters, function.strict)
        )
    return functions


def _tool_choice(
    tool_choice: str | chat_protocol.NamedToolChoice | None, tools: list[FunctionTool]
) -> tuple[str, str | None]:
    """("none" | "auto" | "required", None) or ("named", the function's name)."""
    if tool_choice is None:
        return ("auto" if tools else "none"), None
    if not tools:
        raise InvalidRequestError(
            "tool_choice is only allowed when tools are given", param="tool_choice"
        )
    if isinstance(tool_choice, str):
        return tool_choice, None
    name = tool_choice.function.name
    if name not in {tool.name for tool in tools}:
        raise InvalidRequestError(
            f"tool_choice names the function {name[:64]!r}, which is not among the tools",
            param="tool_choice.function.name",
        )
    return "named", name
