"""Ollama bodies -> the equivalent chat (or completion) request -> `GenerationRequest`.

An Ollama request is a chat request underneath, as Anthropic's Messages are
(`apis/messages/to_internal.py`): this module builds the
`chat_protocol.ChatCompletionRequest` that says the same and runs it through
`apis.chat.to_internal.chat_request`, so templates, tools, structured outputs,
reasoning, limits and the max_tokens policy are the chat API's own:
- `messages` as chat messages: an assistant's `tool_calls` (arguments an
  object) get ids, a `tool` message answers the earliest unanswered call of
  its `tool_name`; `images` are refused (a text-only model);
- `/api/generate`: `system` and `prompt` as a system and a user message;
  `raw` sends the prompt untemplated, through `completion_request`;
  `context` (the token array an earlier answer returned) goes before the
  prompt's tokens, as Ollama puts it;
- `options` as sampling fields (num_predict -> max_tokens, repeat_penalty ->
  repetition_penalty); `format` as response_format; `think` as chat's
  reasoning controls (apis/rules/reasoning_fields.py): false is the effort "none"
  (the template's thinking off) with the reasoning parser off, a level is
  that effort (its budget), true asks for a reasoning parser (a 400 where the
  model has none);
- `num_predict` beyond the context's room is lowered to fit (Ollama never
  refuses it), as the agent APIs do.
Errors name Ollama's fields (`options.num_predict`, `format`), not chat's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

import msgspec

from sluice.apis import openai_protocol
from sluice.apis.chat import protocol as chat_protocol
from sluice.apis.chat.to_internal import chat_request
from sluice.apis.completions import protocol as completions_protocol
from sluice.apis.completions.to_internal import completion_request
from sluice.apis.max_tokens import effective_max_tokens
from sluice.apis.ollama import protocol as ollama
from sluice.apis.openai_request import RequestOptions
from sluice.apis.rules import reasoning_fields
from sluice.errors import InvalidRequestError, ModelNotFoundError, RequestError
from sluice.frontend.request import GenerationRequest, PromptInput
from sluice.server.body import limits

# Ollama's own name for the newest version of a model.
LATEST_TAG = ":latest"
# A Go duration, as Ollama's keep_alive takes: "5m", "1h30m", "-1s", "250ms".
_DURATION = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?(?:ns|us|µs|ms|s|m|h))+")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNIT_S = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
# Chat's parameter names -> Ollama's, for errors raised underneath.
_PARAM_NAMES = {
    "response_format.json_schema.schema": "format",
    "response_format": "format",
    "max_tokens": "options.num_predict",
    "stop": "options.stop",
    "seed": "options.seed",
}


def check_model(requested: str, served_model_name: str) -> str:
    """The name to echo (the client's); any other model than the served one
    (or it with Ollama's ":latest" tag) is a 404 naming the served model."""
    if requested in (served_model_name, served_model_name + LATEST_TAG):
        return requested
    raise ModelNotFoundError(
        f"model '{requested[:100]}' not found; this server serves '{served_model_name}'",
        param="model",
        code="model_not_found",
    )


def keep_alive_s(keep_alive: ollama.KeepAlive | None) -> float | None:
    """How long the model stays loaded after the request, in seconds: Ollama's
    `keep_alive`, seconds or a Go duration; negative: for ever (inf); None:
    not said (the server's default)."""
    if keep_alive is None:
        return None
    if isinstance(keep_alive, str):
        text = keep_alive.strip()
        try:
            seconds = float(text)
        except ValueError:
            if not _DURATION.fullmatch(text):
                raise InvalidRequestError(
                    f'keep_alive {keep_alive[:40]!r} is not a duration (e.g. "5m", "1h", -1)',
                    param="keep_alive",
                ) from None
            parts = _DURATION_PART.findall(text)
            seconds = sum(float(n) * _DURATION_UNIT_S[unit] for n, unit in parts)
            seconds = -seconds if text.startswith("-") else seconds
    else:
        seconds = float(keep_alive)
    return math.inf if seconds < 0 or math.isnan(seconds) else seconds


async def ollama_chat_request(
    body: ollama.ChatRequest, options: RequestOptions
) -> GenerationRequest:
    model_name = check_model(body.model, options.served_model_name)
    messages = _chat_messages(body.messages or [])
    tools = [_chat_tool(tool) for tool in body.tools or ()]
    return await _run_chat(body, messages, tools, options, model_name)


async def ollama_generate_request(
    body: ollama.GenerateRequest, options: RequestOptions
) -> GenerationRequest:
    model_name = check_model(body.model, options.served_model_name)
    _refuse_generate_fields(body)
    if body.raw:
        return await _raw_request(body, options, model_name)
    messages = [] if not body.system else [_message("system", body.system)]
    messages.append(_message("user", body.prompt or ""))
    request = await _run_chat(body, messages, [], options, model_name)
    if body.context:
        request = _after_context(request, body.context, body, options)
    return request


async def _run_chat(
    body: ollama.GenerationFields,
    messages: list[chat_protocol.ChatMessage],
    tools: list[chat_protocol.ChatTool],
    options: RequestOptions,
    model_name: str,
) -> GenerationRequest:
    options = _with_think(body, options)
    # Built from validated parts: constructed, not validated again.
    chat = chat_protocol.ChatCompletionRequest.model_construct(
        model=None,
        messages=messages,
        tools=tools or None,
        tool_choice="auto" if tools else None,
        reasoning_effort=_reasoning_effort(body.think),
        **_sampling_fields(body),
    )
    try:
        request = await chat_request(chat, options, clamps_max_tokens=True)
    except RequestError as error:
        raise _renamed(error) from None
    return _as_ollama(request, model_name)


async def _raw_request(
    body: ollama.GenerateRequest, options: RequestOptions, model_name: str
) -> GenerationRequest:
    """The prompt as it is, no template: a completion over its tokens (after `context`)."""
    if body.think:
        raise InvalidRequestError(
            "think needs the chat template; a raw prompt is sent as it is", param="think"
        )
    context = tuple(body.context or ())
    prompt = await _prompt_tokens(body.prompt or "", context, options)
    max_tokens = effective_max_tokens(
        _num_predict(body), [prompt], options.preprocessor, options.limits.max_tokens,
        prompt_param="prompt", is_clamped_to_context=True,
    )  # fmt: skip
    fields = _sampling_fields(body) | {"max_tokens": max_tokens}
    completion = completions_protocol.CompletionRequest.model_construct(
        model=None, prompt=list(prompt.token_ids), **fields
    )
    try:
        request = await completion_request(completion, options)
    except RequestError as error:
        raise _renamed(error) from None
    return _as_ollama(request, model_name)


async def _prompt_tokens(
    text: str, context: tuple[int, ...], options: RequestOptions
) -> PromptInput:
    options.preprocessor.check_token_ids(context, "context")
    # BOS and the like only where the prompt starts the conversation.
    token_ids = await options.preprocessor.encode(text, add_special_tokens=not context)
    prompt = PromptInput(context + tuple(token_ids), text)
    if not prompt.token_ids:
        raise InvalidRequestError("the prompt encodes to no tokens", param="prompt")
    return prompt


def _after_context(
    request: GenerationRequest,
    context: list[int],
    body: ollama.GenerateRequest,
    options: RequestOptions,
) -> GenerationRequest:
    """`request` with the `context` tokens before its prompt's, refitted."""
    options.preprocessor.check_token_ids(context, "context")
    (prompt,) = request.prompts
    prompt = PromptInput(tuple(context) + prompt.token_ids, prompt.text)
    limits.check_prompts([prompt], options.limits, "context")
    max_tokens = effective_max_tokens(
        _num_predict(body), [prompt], options.preprocessor, options.limits.max_tokens,
        prompt_param="context", is_clamped_to_context=True,
    )  # fmt: skip
    params = msgspec.structs.replace(request.params, max_tokens=max_tokens)
    return dataclasses.replace(request, prompts=(prompt,), params=params)


def _as_ollama(request: GenerationRequest, model_name: str) -> GenerationRequest:
    # The final line carries the counts: the access log reads them there.
    return dataclasses.replace(request, model_name=model_name, include_usage=request.stream)


def _sampling_fields(body: ollama.GenerationFields) -> dict[str, Any]:
    """Chat's sampling fields for Ollama's `options`, `format` and `stream`."""
    if body.logprobs or body.top_logprobs:
        param = "logprobs" if body.logprobs else "top_logprobs"
        raise InvalidRequestError(
            "logprobs are not served on Ollama's API here; /v1/chat/completions has them",
            param=param,
        )
    options = body.options or ollama.Options()
    top_k = options.top_k
    return {
        "max_tokens": _num_predict(body),
        "temperature": options.temperature,
        "top_p": options.top_p,
        "top_k": None if top_k is None else max(top_k, 0),
        "min_p": options.min_p,
        "seed": options.seed,
        "stop": _stop(options.stop),
        "repetition_penalty": options.repeat_penalty,
        "presence_penalty": options.presence_penalty,
        "frequency_penalty": options.frequency_penalty,
        "response_format": _response_format(body.format),
        "stream": True if body.stream is None else body.stream,
    }


def _num_predict(body: ollama.GenerationFields) -> int | None:
    """max_tokens for `options.num_predict`; None (-1, -2, unset): the rest of the context."""
    num_predict = None if body.options is None else body.options.num_predict
    if num_predict == 0:
        raise InvalidRequestError(
            "options.num_predict must be at least 1 (or -1: no limit)",
            param="options.num_predict",
        )
    return None if num_predict is None or num_predict < 0 else num_predict


def _stop(stop: list[str] | str | None) -> list[str] | None:
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else stop
    if any(not s for s in stops):
        raise InvalidRequestError("stop strings must not be empty", param="options.stop")
    return stops or None


def _response_format(format_: ollama.Format | None) -> openai_protocol.ResponseFormat | None:
    if format_ is None or format_ == "":
        return None
    if format_ == "json":
        return openai_protocol.ResponseFormat.model_construct(type="json_object", json_schema=None)
    schema = openai_protocol.JsonSchemaFormat.model_construct(schema_=format_)
    return openai_protocol.ResponseFormat.model_construct(type="json_schema", json_schema=schema)


def _with_think(body: ollama.GenerationFields, options: RequestOptions) -> RequestOptions:
    """false: the output is all content; true or a level: its reasoning split
    off (a 400 where the model shows no reasoning); unset: the server's parser."""
    if body.think is False:
        return dataclasses.replace(options, reasoning_parser=None)
    if body.think is not None and options.reasoning_parser is None:
        raise InvalidRequestError(
            f"'{options.served_model_name}' does not support thinking", param="think"
        )
    return options


def _reasoning_effort(think: bool | str | None) -> str | None:
    """Chat's reasoning_effort for `think`: false is "none", a level itself."""
    if think is False:
        return reasoning_fields.NO_EFFORT
    return think if isinstance(think, str) else None


def _refuse_generate_fields(body: ollama.GenerateRequest) -> None:
    if body.images:
        raise _no_images("images")
    if body.template:
        raise InvalidRequestError(
            "template is not supported: Ollama's Go templates are not run here; the "
            "model's own chat template is applied (or send raw: true with the whole prompt)",
            param="template",
        )
    if body.suffix:
        raise InvalidRequestError("suffix (fill in the middle) is not supported", param="suffix")


def _chat_messages(messages: list[ollama.Message]) -> list[chat_protocol.ChatMessage]:
    chat: list[chat_protocol.ChatMessage] = []
    # Calls not answered yet, oldest first: (tool name, call id).
    unanswered: list[tuple[str, str]] = []
    for index, message in enumerate(messages):
        if message.images:
            raise _no_images(f"messages[{index}].images")
        if message.role == "tool":
            call_id = _answered_call(unanswered, message.tool_name, index)
            chat.append(_message("tool", message.content, tool_call_id=call_id))
            continue
        calls = [_tool_call(call, index, n) for n, call in enumerate(message.tool_calls or ())]
        unanswered += [(call.function.name, call.id) for call in calls]
        chat.append(_message(message.role, message.content, tool_calls=calls or None))
    return chat


def _answered_call(unanswered: list[tuple[str, str]], tool_name: str | None, index: int) -> str:
    """The id of the call a tool message answers: the earliest unanswered
    call of its tool (else the earliest unanswered one)."""
    for position, (name, call_id) in enumerate(unanswered):
        if tool_name is None or name == tool_name:
            del unanswered[position]
            return call_id
    if unanswered:
        return unanswered.pop(0)[1]
    return f"call_{index}"


def _tool_call(call: ollama.ToolCall, index: int, call_index: int) -> chat_protocol.MessageToolCall:
    arguments = json.dumps(call.function.arguments, ensure_ascii=False)
    function = chat_protocol.FunctionCall.model_construct(
        name=call.function.name, arguments=arguments
    )
    return chat_protocol.MessageToolCall.model_construct(
        id=f"call_{index}_{call_index}", type="function", function=function
    )


def _chat_tool(tool: ollama.Tool) -> chat_protocol.ChatTool:
    function = chat_protocol.FunctionDefinition.model_construct(
        name=tool.function.name,
        description=tool.function.description,
        parameters=tool.function.parameters,
        strict=None,
    )
    return chat_protocol.ChatTool.model_construct(type="function", function=function)


def _message(role: str, content: str, **fields: Any) -> chat_protocol.ChatMessage:
    return chat_protocol.ChatMessage.model_construct(role=role, content=content, **fields)


def _no_images(param: str) -> InvalidRequestError:
    return InvalidRequestError(
        "images are not supported: this server serves a text-only model", param=param
    )


def _renamed(error: RequestError) -> RequestError:
    """`error` naming Ollama's field where chat's was named."""
    for chat_name, ollama_name in _PARAM_NAMES.items():
        if error.param is not None and error.param.startswith(chat_name):
            error.message = error.message.replace(chat_name, ollama_name)
            error.param = ollama_name + error.param[len(chat_name) :]
            error.args = (error.message,)
            break
    return error
