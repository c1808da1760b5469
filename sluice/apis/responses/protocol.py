"""Pydantic models of the Responses API's request bodies (`POST /v1/responses`,
`POST /v1/responses/input_tokens`).

The same rules as `apis/openai_protocol.py`: unknown fields are ignored, null means the
default, ranges are checked here so the error names the field. Input items
and tools stay loosely typed (`dict`): the API keeps adding item and tool
types, and an agent that sends one sluice does not know must not get a 400
that stops it; `input_items.py` reads the types it knows, names the
field of anything malformed, and documents what it skips (docs/API.md).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from sluice.apis.openai_protocol import (
    MAX_TOOLS,
    ChatTemplateKwargs,
    Count,
    OpenAIModel,
    Priority,
    Seed,
    Temperature,
    TopLogprobs,
    TopP,
)

# Items one request may carry (a long agent conversation has a few hundred).
MAX_INPUT_ITEMS = 4096
# OpenAI's bounds on `metadata`, which the store keeps with the response.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


class TextFormat(OpenAIModel):
    """`text.format`: "text", "json_object" or "json_schema" (name, schema, strict)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextOptions(OpenAIModel):
    format: TextFormat | None = None
    # "low" / "medium" / "high": accepted, changes nothing.
    verbosity: str | None = None


class ReasoningOptions(OpenAIModel):
    # Chat's `reasoning_effort` (apis/rules/reasoning_fields.py): "none" turns
    # thinking off, the others cap it; checked there, named here.
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(OpenAIModel):
    model: str | None = None
    input: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_INPUT_ITEMS)] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    stream: bool | None = None
    background: bool | None = None
    max_output_tokens: Count | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_logprobs: TopLogprobs | None = None
    seed: Seed | None = None
    # vLLM's extension: lower runs sooner (--scheduling-policy priority).
    priority: Priority | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    # vLLM's extension, as chat's: extra variables of the chat template.
    chat_template_kwargs: ChatTemplateKwargs | None = None
    include: list[str] | None = None
    # Echoed back, as OpenAI does; bounded as OpenAI bounds it.
    metadata: dict[str, str] | None = None
    user: str | None = None
    # Accepted and ignored: they steer OpenAI's own infrastructure.
    truncation: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @field_validator("metadata")
    @classmethod
    def _bounded_metadata(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is None:
            return None
        if len(metadata) > MAX_METADATA_PAIRS:
            raise ValueError(f"at most {MAX_METADATA_PAIRS} key-value pairs, got {len(metadata)}")
        for key, value in metadata.items():
            if len(key) > MAX_METADATA_KEY_CHARS:
                raise ValueError(f"a key is at most {MAX_METADATA_KEY_CHARS} characters, "
                                 f"got one of {len(key)}")  # fmt: skip
            if len(value) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(f"a value is at most {MAX_METADATA_VALUE_CHARS} characters, "
                                 f"got one of {len(value)}")  # fmt: skip
        return metadata


class InputTokensRequest(OpenAIModel):
    """`POST /v1/responses/input_tokens`: what the prompt of a request would count."""

    model: str | None = None
    input: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_INPUT_ITEMS)] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    # vLLM's extension, as chat's: extra variables of the chat template.
    chat_template_kwargs: ChatTemplateKwargs | None = None
