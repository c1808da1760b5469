"""A validated Responses API body -> the chat `GenerationRequest` that serves
it (kind "responses"), and what the store keeps of it.

The body becomes a chat request (`input_items.py` reads items and tools)
checked by the same `chat_request` (apis/chat/to_internal.py) as /v1/chat/completions, so
every limit, grammar and tool rule holds here too; an error it raises names
the Responses field (`input`, `max_output_tokens`, `text.format`, ...).
Choices that differ from chat, for agents (docs/API.md):
- `max_output_tokens` beyond what the context leaves is cut to fit.

A follow-up's prompt is the stored conversation (store.py:
its input and output items, without its instructions), then its own
instructions and input.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

import orjson

from sluice.apis import openai_protocol, openai_request
from sluice.apis.chat import protocol as chat_protocol
from sluice.apis.chat import to_internal as chat_to_internal
from sluice.apis.responses.input_items import chat_tool_choice, chat_tools, input_messages
from sluice.apis.responses.protocol import ResponsesRequest
from sluice.errors import InvalidRequestError, RequestError
from sluice.frontend.request import GenerationRequest, ResponsesSettings
from sluice.server.body.limits import check_json_depth

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# A chat field's name in an error -> the Responses field it came from.
_FIELD_NAMES = (
    ("messages", "input"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("response_format", "text.format"),
    ("logprobs", "include"),
    ("reasoning_effort", "reasoning.effort"),
)


@dataclass(frozen=True, slots=True)
class ResponsesPlan:
    request: GenerationRequest
    # The conversation's messages before this response's output, for the store.
    messages: tuple[dict[str, Any], ...]
    is_stored: bool


async def responses_request(
    body: ResponsesRequest,
    options: openai_request.RequestOptions,
    previous: list[dict[str, Any]],
) -> ResponsesPlan:
    """`previous`: the stored conversation `previous_response_id` continues
    (read from the store on the event loop, its owner)."""
    if body.background:
        raise InvalidRequestError("background responses are not supported", param="background")
    messages = [*previous, *input_messages(body.input)]
    tools, custom_tool_names = chat_tools(body.tools)
    tool_choice = chat_tool_choice(body.tool_choice, {t["function"]["name"] for t in tools})
    chat = _chat_fields(body, messages, tools, tool_choice)
    try:
        chat_body = openai_protocol.validate_body(chat, chat_protocol.ChatCompletionRequest)
        request = await chat_to_internal.chat_request(chat_body, options, clamps_max_tokens=True)
    except RequestError as error:
        raise _renamed(error) from None
    echoed = _echoed(body)
    for field, value in echoed.items():  # what the encoder takes (it stops at 255 levels)
        check_json_depth(value, field)
    settings = ResponsesSettings(orjson.dumps(echoed), custom_tool_names)
    request = replace(
        request, kind="responses", response_id=f"resp_{uuid.uuid4().hex}", responses=settings
    )
    return ResponsesPlan(request, tuple(messages), body.store is not False)


def _chat_fields(
    body: ResponsesRequest,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    tool_choice: Any,
) -> dict[str, Any]:
    if body.instructions:
        messages = [{"role": "system", "content": body.instructions}, *messages]
    wants_logprobs = LOGPROBS_INCLUDE in (body.include or [])
    if body.top_logprobs and not wants_logprobs:
        raise InvalidRequestError(
            f"top_logprobs needs include ['{LOGPROBS_INCLUDE}']", param="top_logprobs"
        )
    chat: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "seed": body.seed,
        "priority": body.priority,
        "stream": body.stream,
        "logprobs": wants_logprobs or None,
        "top_logprobs": body.top_logprobs if wants_logprobs else None,
        "response_format": _response_format(body),
        "reasoning_effort": body.reasoning.effort if body.reasoning is not None else None,
        "chat_template_kwargs": body.chat_template_kwargs,
    }
    if tools:
        chat |= {"tools": tools, "tool_choice": tool_choice,
                 "parallel_tool_calls": body.parallel_tool_calls}  # fmt: skip
    return chat


def _response_format(body: ResponsesRequest) -> dict[str, Any] | None:
    text_format = body.text.format if body.text is not None else None
    if text_format is None or text_format.type == "text":
        return None
    if text_format.type == "json_object":
        return {"type": "json_object"}
    if text_format.schema_ is None:
        raise InvalidRequestError("a json_schema format needs 'schema'", param="text.format.schema")
    json_schema = {"name": text_format.name, "schema": text_format.schema_,
                   "strict": text_format.strict}  # fmt: skip
    return {"type": "json_schema", "json_schema": json_schema}


def _echoed(body: ResponsesRequest) -> dict[str, Any]:
    """The response object's fields that say what was asked."""
    text = {"format": {"type": "text"}}
    if body.text is not None and body.text.format is not None:
        text = {"format": body.text.format.model_dump(by_alias=True, exclude_none=True)}
    reasoning = body.reasoning.model_dump() if body.reasoning is not None else None
    return {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": reasoning or {"effort": None, "summary": None},
        "store": body.store is not False,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": text,
        "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [],
        "top_logprobs": body.top_logprobs or 0,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": "disabled",
        "user": body.user,
    }


def _renamed(error: RequestError) -> RequestError:
    """`error` naming the Responses field where the chat request named its own."""
    param = error.param
    if param is None:
        return error
    for chat_name, responses_name in _FIELD_NAMES:
        if param == chat_name or param.startswith((f"{chat_name}.", f"{chat_name}[")):
            error.param = responses_name + param[len(chat_name) :]
            if param.startswith(f"{chat_name}["):
                error.param = responses_name  # message indices differ from input's
            break
    return error
