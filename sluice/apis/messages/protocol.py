"""Pydantic models of Anthropic's Messages API bodies (`POST /v1/messages`,
`POST /v1/messages/count_tokens`).

The same rules as `apis/openai_protocol.py`: unknown fields are ignored (Claude Code
sends `context_management`, `output_config`, beta fields), `null` means the
default, NaN and infinities are refused, every documented range is checked
here so the error names the field. Content blocks are one model with a
`type` and the fields of every block type: `to_internal` refuses
the types sluice cannot serve (images, documents) by name, which a
discriminated union would turn into a list of every branch's errors.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from sluice.apis.openai_protocol import (
    INT64_MAX,
    MAX_STOP_STRINGS,
    MAX_TOOLS,
    ChatTemplateKwargs,
    OpenAIModel,
    Priority,
)

# Anthropic's rule for tool names.
ToolName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,128}$")]


class TextBlock(OpenAIModel):
    """A `system` block: text (its `cache_control` is accepted and ignored)."""

    type: Literal["text"]
    text: str


class ContentBlock(OpenAIModel):
    """One block of a message's content, any type; the fields of each:
    text: `text`; tool_use: `id`, `name`, `input`; tool_result: `tool_use_id`,
    `content`, `is_error`; thinking: `thinking` (`signature` ignored)."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[ContentBlock] | None = None
    is_error: bool | None = None
    thinking: str | None = None


class Message(OpenAIModel):
    # "system" turns mid-conversation: Claude Code sends them (its environment notes).
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(OpenAIModel):
    # None or "custom": a tool the client runs, described by `input_schema`.
    # Anthropic's own tool types ("bash_20250124", "web_search_20250305", ...)
    # have no schema here: they are left out of the prompt (docs/API.md).
    type: str | None = None
    name: ToolName
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class ToolChoice(OpenAIModel):
    type: Literal["auto", "any", "tool", "none"]
    # type "tool": the tool to call.
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(OpenAIModel):
    # "disabled": the output is all text; any other ("enabled", "adaptive",
    # "between_tools", types newer than sluice): the reasoning parser reads
    # the output, if the server has one.
    type: str
    # The most tokens the reasoning may take before its end is forced (chat's
    # `thinking_token_budget`: apis/rules/reasoning_fields.py). Below max_tokens
    # (MessagesRequest checks), as Anthropic requires.
    budget_tokens: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = None


class OutputFormat(OpenAIModel):
    type: Literal["json_schema"]
    # Named `schema` on the wire; the attribute would shadow pydantic's own.
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(OpenAIModel):
    # Accepted and ignored: the model's effort is what it is.
    effort: str | None = None
    # Structured outputs, through llguidance as chat's response_format.
    format: OutputFormat | None = None


class PromptFields(OpenAIModel):
    """What makes the prompt: shared by messages and count_tokens."""

    # Any name: the served model answers (agents pick their own model names).
    model: str | None = None
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    # vLLM's extension, as chat's: extra variables of the chat template.
    chat_template_kwargs: ChatTemplateKwargs | None = None


class MessagesRequest(PromptFields):
    # Required, as in Anthropic's API; beyond what the context leaves it is
    # lowered to fit (Claude Code asks for 32,000 or more).
    max_tokens: Annotated[int, Field(ge=1, le=INT64_MAX)]
    stop_sequences: Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool | None = None
    output_config: OutputConfig | None = None
    # Not in Anthropic's newest API, still sent by older clients: served.
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = None
    # vLLM's extension: lower runs sooner (--scheduling-policy priority).
    priority: Priority | None = None
    # Accepted and ignored: nothing here depends on them.
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None

    @model_validator(mode="after")
    def _budget_below_max_tokens(self) -> MessagesRequest:
        """Anthropic's rule, in its words: the thinking budget is part of
        max_tokens, so it must leave room for the answer. (Its other rule,
        budget_tokens >= 1024, is a product minimum sluice does not copy:
        docs/API.md.)"""
        thinking = self.thinking
        if thinking is None or thinking.type == "disabled" or thinking.budget_tokens is None:
            return self
        if thinking.budget_tokens >= self.max_tokens:
            raise PydanticCustomError(
                "thinking_budget", "`max_tokens` must be greater than `thinking.budget_tokens`"
            )
        return self


class CountTokensRequest(PromptFields):
    pass
