"""Anthropic Messages bodies -> the equivalent chat request -> `GenerationRequest`.

A Messages request is a chat request underneath: this module builds the
`chat_protocol.ChatCompletionRequest` that says the same (system first, content
blocks flattened to text, `tool_use` blocks as an assistant's `tool_calls`,
`tool_result` blocks as `tool` messages, tools and tool_choice in OpenAI's
shapes) and runs it through chat's `chat_request` (apis/chat/to_internal.py), so tools take the
same parsers and forced-choice grammars, then marks it "messages".
What differs from chat, for what agents need (docs/API.md):
- `max_tokens` beyond what the context leaves is lowered to fit, never a
  400: Claude Code asks for 32,000 or more whatever the model.
- Any `model` name is served by the served model (agents pick their own).
Errors still name the Anthropic field (`messages[1].content[0].type`).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

from sluice.apis import openai_protocol
from sluice.apis.chat import protocol as chat_protocol
from sluice.apis.chat.to_internal import chat_messages, chat_request
from sluice.apis.messages import protocol as messages_protocol
from sluice.apis.openai_request import RequestOptions
from sluice.apis.rules import reasoning_fields, tool_fields
from sluice.apis.rules.tool_prompt import template_inputs
from sluice.errors import InvalidRequestError
from sluice.frontend.request import GenerationRequest
from sluice.server.body import limits
from sluice.tools.harmony import HARMONY

_CUSTOM_TOOL_TYPES = (None, "custom")


async def messages_request(
    body: messages_protocol.MessagesRequest, options: RequestOptions
) -> GenerationRequest:
    options = _with_thinking(body.thinking, options)
    sampling = {"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
                "priority": body.priority}  # fmt: skip
    # Beyond --max-tokens-limit is lowered, not refused (an agent rule, as the
    # context's room is: chat_request clamps to it).
    max_tokens = limits.cap_max_tokens(body.max_tokens, options.limits)
    chat = _chat_body(
        body, options, stream=bool(body.stream), stop=body.stop_sequences,
        response_format=_response_format(body.output_config), max_tokens=max_tokens, **sampling,
        **_thinking_fields(body),
    )  # fmt: skip
    request = await chat_request(chat, options, clamps_max_tokens=True)
    return dataclasses.replace(
        request,
        kind="messages",
        response_id=f"msg_{uuid.uuid4().hex}",
        # The stream's message_delta carries the usage: the access log reads it.
        include_usage=request.stream,
    )


async def count_tokens(body: messages_protocol.CountTokensRequest, options: RequestOptions) -> int:
    """The prompt's tokens as `messages_request` would build it."""
    options = _with_thinking(body.thinking, options)
    chat = _chat_body(body, options, stream=False, **_thinking_fields(body))
    tools = await tool_fields.tool_plan(
        chat, options.tool_format, options.reasoning_parser, check=options.grammar_check
    )
    messages, template_tools = template_inputs(
        chat_messages(chat.messages), tools.template_tools, options.tool_format
    )
    template = reasoning_fields.template_reasoning(options.preprocessor.tokenizer)
    reasoning = reasoning_fields.reasoning_plan(chat, template, options.reasoning_effort_budgets)
    prompt = await options.preprocessor.chat_prompt(
        messages, add_generation_prompt=True, add_special_tokens=False, tools=template_tools,
        template_kwargs=reasoning.template_kwargs,
    )  # fmt: skip
    return len(prompt.token_ids)


def _response_format(
    config: messages_protocol.OutputConfig | None,
) -> openai_protocol.ResponseFormat | None:
    if config is None or config.format is None:
        return None
    schema = openai_protocol.JsonSchemaFormat.model_construct(schema_=config.format.schema_)
    return openai_protocol.ResponseFormat.model_construct(type="json_schema", json_schema=schema)


def _with_thinking(
    thinking: messages_protocol.Thinking | None, options: RequestOptions
) -> RequestOptions:
    # Harmony's channels are its format: read, whatever the thinking.
    if thinking is not None and thinking.type == "disabled" and options.reasoning_parser != HARMONY:
        return dataclasses.replace(options, reasoning_parser=None)
    return options


def _thinking_fields(body: messages_protocol.PromptFields) -> dict[str, Any]:
    """Chat's reasoning controls for `thinking` (apis/rules/reasoning_fields.py):
    disabled is the effort "none", a budget chat's `thinking_token_budget`."""
    thinking = body.thinking
    fields: dict[str, Any] = {"chat_template_kwargs": body.chat_template_kwargs}
    if thinking is not None and thinking.type == "disabled":
        fields["reasoning_effort"] = reasoning_fields.NO_EFFORT
    elif thinking is not None:
        fields["thinking_token_budget"] = thinking.budget_tokens
    return fields


def _chat_body(
    body: messages_protocol.PromptFields, options: RequestOptions, **fields: Any
) -> chat_protocol.ChatCompletionRequest:
    tools = _chat_tools(body.tools)
    tool_choice, parallel = _tool_choice(body.tool_choice, tools)
    messages = _system_messages(body.system)
    for index, message in enumerate(body.messages):
        messages += _chat_turn(message, index)
    # Built from validated parts: constructed, not validated again.
    return chat_protocol.ChatCompletionRequest.model_construct(
        model=None,
        messages=messages,
        tools=tools or None,
        tool_choice=tool_choice if tools else None,
        parallel_tool_calls=parallel,
        **fields,
    )


def _system_messages(system: str | list[messages_protocol.TextBlock] | None) -> list:
    if system is None:
        return []
    text = system if isinstance(system, str) else "\n".join(block.text for block in system)
    return [_message("system", text)]


def _chat_turn(message: messages_protocol.Message, index: int) -> list[chat_protocol.ChatMessage]:
    """One Messages turn as chat messages: tool results become `tool` messages."""
    if isinstance(message.content, str):
        return [_message(message.role, message.content)]
    texts: list[str] = []
    results: list[chat_protocol.ChatMessage] = []
    calls: list[chat_protocol.MessageToolCall] = []
    for block_index, block in enumerate(message.content):
        param = f"messages[{index}].content[{block_index}]"
        if block.type == "text":
            texts.append(_required(block.text, f"{param}.text"))
        elif block.type == "tool_use" and message.role == "assistant":
            calls.append(_tool_call(block, param))
        elif block.type == "tool_result" and message.role == "user":
            tool_use_id = _required(block.tool_use_id, f"{param}.tool_use_id")
            text = _result_text(block.content, f"{param}.content")
            results.append(_message("tool", text, tool_call_id=tool_use_id))
        elif block.type not in ("thinking", "redacted_thinking"):
            raise _unsupported_block(block.type, message.role, f"{param}.type")
        # Earlier thinking is left out of the prompt, as chat templates leave reasoning.
    if not texts and (results or calls):
        return [*results, *([_message("assistant", "", tool_calls=calls)] if calls else [])]
    return [*results, _message(message.role, "\n".join(texts), tool_calls=calls or None)]


def _tool_call(block: messages_protocol.ContentBlock, param: str) -> chat_protocol.MessageToolCall:
    function = chat_protocol.FunctionCall.model_construct(
        name=_required(block.name, f"{param}.name"),
        arguments=json.dumps(block.input or {}, ensure_ascii=False),
    )
    call_id = _required(block.id, f"{param}.id")
    return chat_protocol.MessageToolCall.model_construct(
        id=call_id, type="function", function=function
    )


def _result_text(content: str | list[messages_protocol.ContentBlock] | None, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for index, block in enumerate(content):
        if block.type != "text":
            raise _unsupported_block(block.type, "tool_result", f"{param}[{index}].type")
        texts.append(_required(block.text, f"{param}[{index}].text"))
    return "\n".join(texts)


def _chat_tools(tools: list[messages_protocol.Tool] | None) -> list[chat_protocol.ChatTool]:
    chat_tools = []
    for tool in tools or ():
        if tool.type not in _CUSTOM_TOOL_TYPES:
            continue  # Anthropic's own tools: no schema to show the model (docs/API.md)
        function = chat_protocol.FunctionDefinition.model_construct(
            name=tool.name, description=tool.description, parameters=tool.input_schema, strict=None
        )
        chat_tools.append(
            chat_protocol.ChatTool.model_construct(type="function", function=function)
        )
    return chat_tools


def _tool_choice(
    choice: messages_protocol.ToolChoice | None,
    tools: list[chat_protocol.ChatTool],
) -> tuple[Any, bool | None]:
    """OpenAI's tool_choice and parallel_tool_calls for Anthropic's tool_choice."""
    parallel = None if choice is None or not choice.disable_parallel_tool_use else False
    kind = "auto" if choice is None else choice.type
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    name = _required(choice.name if choice else None, "tool_choice.name")
    if name not in {tool.function.name for tool in tools}:
        raise InvalidRequestError(
            f"tool_choice names the tool {name[:64]!r}, which is not among the tools",
            param="tool_choice.name",
        )
    named = chat_protocol.NamedToolChoice.model_construct(
        type="function", function=chat_protocol.ToolChoiceFunction.model_construct(name=name)
    )
    return named, parallel


def _message(role: str, content: str, **fields: Any) -> chat_protocol.ChatMessage:
    return chat_protocol.ChatMessage.model_construct(role=role, content=content, **fields)


def _required(value: str | None, param: str) -> str:
    if value is None:
        raise InvalidRequestError(f"'{param}' is required", param=param)
    return value


def _unsupported_block(block_type: str, where: str, param: str) -> InvalidRequestError:
    if block_type in ("image", "document"):
        reason = "this server serves a text-only model"
    else:
        reason = "only text, tool_use (assistant), tool_result (user) and thinking are"
    return InvalidRequestError(
        f"{block_type[:40]!r} blocks are not supported in {where} content: {reason}", param=param
    )
