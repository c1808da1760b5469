"""Pydantic models of the `/v1/chat/completions` body (OpenAI's and vLLM's
fields), and of vLLM's `/tokenize` and `/detokenize` (whose `messages` are
chat's); the fields chat shares with completions and the rules every model
follows: `sluice.apis.openai_protocol`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from sluice.apis.openai_protocol import (
    INT64_MAX,
    MAX_TOOLS,
    ChatTemplateKwargs,
    Count,
    FunctionName,
    OpenAIModel,
    ReasoningEffort,
    SamplingFields,
    TokenId,
    TopLogprobs,
)


class ContentPart(OpenAIModel):
    # Only "text" is served; other types are refused by `to_internal` by name.
    type: str
    text: str | None = None


ChatRole = Literal["system", "user", "assistant", "tool", "developer"]


class FunctionDefinition(OpenAIModel):
    name: FunctionName
    description: str | None = None
    # A JSON schema of the arguments object.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(OpenAIModel):
    type: Literal["function"]
    function: FunctionDefinition


class ToolChoiceFunction(OpenAIModel):
    name: str


class NamedToolChoice(OpenAIModel):
    type: Literal["function"]
    function: ToolChoiceFunction


class FunctionCall(OpenAIModel):
    name: str
    arguments: str


class MessageToolCall(OpenAIModel):
    """A call in an earlier assistant turn's `tool_calls`."""

    id: str
    type: Literal["function"] | None = None
    function: FunctionCall


class ChatMessage(OpenAIModel):
    role: ChatRole
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[MessageToolCall] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    # Takes precedence over the deprecated `max_tokens`.
    max_completion_tokens: Count | None = None
    # Tool calling (`tool_fields`): tool_choice "none", "auto", "required" or a
    # named function.
    tools: Annotated[list[ChatTool], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # OpenAI's deprecated forms of the same: refused by name, never ignored.
    functions: Any = None
    function_call: Any = None
    # Reasoning controls (apis/rules/reasoning_fields.py): OpenAI's effort ("none"
    # turns thinking off, the others cap it at the server's budget for it).
    reasoning_effort: ReasoningEffort | None = None
    # vLLM extensions.
    add_generation_prompt: bool | None = None
    add_special_tokens: bool | None = None
    # Extra variables of the chat template, e.g. {"enable_thinking": false}.
    chat_template_kwargs: ChatTemplateKwargs | None = None
    # The most tokens the reasoning may take before its end is forced.
    thinking_token_budget: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = None


class TokenizeRequest(OpenAIModel):
    """vLLM's /tokenize: either `prompt` or `messages`."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_generation_prompt: bool | None = None
    # Default: true for a prompt, false for messages (the template adds them).
    add_special_tokens: bool | None = None
    return_token_strs: bool | None = None
    # Extra variables of the chat template, as chat's (vLLM's).
    chat_template_kwargs: ChatTemplateKwargs | None = None


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[TokenId] | None = None
