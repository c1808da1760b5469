"""A validated `/v1/chat/completions` body -> frozen `GenerationRequest`.

Pydantic has already checked types and ranges (protocol.py); this module
reads the messages (text content parts only, tool calls of earlier turns),
plans tools and reasoning (apis/rules/tool_fields.py, reasoning_fields.py),
renders the chat template through the `Preprocessor`, and raises a typed
`RequestError` naming the field for anything it refuses. The agent APIs
(Messages, Responses, Ollama) build a chat body and convert it here. What it
shares with completions: `sluice.apis.openai_request`; its max_tokens: capped
by the server's limit, then fitted to the context, or clamped to it for the
agent APIs (`sluice.apis.max_tokens`).
"""

from __future__ import annotations

from dataclasses import replace

import msgspec

from sluice.apis.chat import protocol
from sluice.apis.max_tokens import effective_max_tokens
from sluice.apis.openai_request import (
    RequestOptions,
    check_model,
    check_priority,
    check_stream_options,
    generation_request,
    or_default,
    sampling_params,
    with_default_stop,
    with_prompt_logprobs,
)
from sluice.apis.rules import reasoning_fields, tool_fields
from sluice.apis.rules.structured_fields import structured_output
from sluice.apis.rules.tool_prompt import template_inputs
from sluice.errors import InvalidRequestError
from sluice.frontend.preprocess import ChatMessage
from sluice.frontend.request import GenerationRequest
from sluice.server.body import limits


async def chat_request(
    body: protocol.ChatCompletionRequest,
    options: RequestOptions,
    *,
    clamps_max_tokens: bool = False,
) -> GenerationRequest:
    """`clamps_max_tokens`: a max_tokens beyond what the context leaves is cut
    to fit instead of refused (the agent APIs: Claude Code asks for 32,000);
    the policy: `sluice.apis.max_tokens`."""
    model_name = check_model(body.model, options.served_model_name)
    limits.check_body(body, options.limits)
    check_priority(body.priority, options)
    n = body.n or 1
    logprobs = _chat_logprobs(body)
    stream = check_stream_options(body)
    structured = await structured_output(body, options.grammar_check)
    # The grammar holds from the first token, so no reasoning comes to split
    # off: the parser would take the whole output for reasoning.
    reasoning_parser = None if structured is not None else options.reasoning_parser
    tools = await tool_fields.tool_plan(
        body, options.tool_format, reasoning_parser, structured, options.grammar_check
    )
    structured = tools.structured_output
    messages, template_tools = template_inputs(
        chat_messages(body.messages), tools.template_tools, options.tool_format
    )
    template = reasoning_fields.template_reasoning(options.preprocessor.tokenizer)
    reasoning = reasoning_fields.reasoning_plan(body, template, options.reasoning_effort_budgets)
    prompt = await options.preprocessor.chat_prompt(
        messages,
        add_generation_prompt=or_default(body.add_generation_prompt, True),
        add_special_tokens=or_default(body.add_special_tokens, False),
        tools=template_tools,
        template_kwargs=reasoning.template_kwargs,
    )
    limits.check_prompts([prompt], options.limits, "messages")
    requested_max_tokens = (
        body.max_completion_tokens or body.max_tokens or options.generation_defaults.max_new_tokens
    )
    max_tokens = effective_max_tokens(
        requested_max_tokens, [prompt], options.preprocessor, options.limits.max_tokens,
        prompt_param="messages", is_clamped_to_context=clamps_max_tokens,
    )  # fmt: skip
    params = sampling_params(
        body, max_tokens, logprobs, options.preprocessor, structured, options.generation_defaults
    )
    params = with_prompt_logprobs(params, body, stream, None)
    budget = reasoning_fields.thinking_budget(reasoning, template, tools, prompt)
    params = msgspec.structs.replace(params, thinking_budget=budget)
    request = generation_request(body, "chat", model_name, (prompt,), n, params, stream, False)
    request = with_default_stop(request, body, options.generation_defaults)
    if tools.reads_special_tokens:
        request = replace(request, skip_special_tokens=False)
    return replace(request, output_parsing=tools.output_parsing)


def chat_messages(messages: list[protocol.ChatMessage] | None) -> list[ChatMessage]:
    if messages is None:
        raise InvalidRequestError("'messages' is required", param="messages")
    return [_chat_message(message, index) for index, message in enumerate(messages)]


def _chat_message(message: protocol.ChatMessage, index: int) -> ChatMessage:
    return ChatMessage(
        role=message.role,
        content=_message_text(message, index),
        name=message.name,
        tool_call_id=message.tool_call_id,
        tool_calls=tool_fields.message_tool_calls(message, index),
    )


def _message_text(message: protocol.ChatMessage, index: int) -> str:
    content = message.content
    if content is None:
        # Assistant turns may carry only tool calls; every other turn needs text.
        if message.role == "assistant":
            return ""
        raise InvalidRequestError(
            f"a {message.role} message needs content", param=f"messages[{index}].content"
        )
    if isinstance(content, str):
        return content
    texts = []
    for part_index, part in enumerate(content):
        param = f"messages[{index}].content[{part_index}]"
        if part.type != "text":
            raise InvalidRequestError(
                f"content part type {part.type[:40]!r} is not supported; only 'text' is",
                param=f"{param}.type",
            )
        if part.text is None:
            raise InvalidRequestError("a text content part needs 'text'", param=f"{param}.text")
        texts.append(part.text)
    # vLLM joins text parts with newlines; so do we, so templates see the same text.
    return "\n".join(texts)


def _chat_logprobs(body: protocol.ChatCompletionRequest) -> int | None:
    if body.logprobs:
        return body.top_logprobs or 0
    if body.top_logprobs:
        raise InvalidRequestError("top_logprobs requires logprobs to be true", param="top_logprobs")
    return None
