"""Pydantic models of Ollama's request bodies (`POST /api/chat`, `/api/generate`,
`/api/show`).

The rules of `apis/openai_protocol.py`: unknown fields are ignored (as Ollama
ignores them), `null` means the default, NaN and infinities are refused and
every range is checked here so the error names the field. `options` is
Ollama's bag of runner settings: the sampling ones are read, the others
(num_gpu, num_thread, mirostat, ...) ignored as Ollama ignores an option its
runner does not know. What each field does: docs/API.md, "Ollama's API".
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from sluice.apis.openai_protocol import (
    INT64_MAX,
    INT64_MIN,
    MAX_STOP_STRINGS,
    MAX_TOOLS,
    FunctionName,
    OpenAIModel,
    Penalty,
    Temperature,
    TokenId,
    TopP,
)

# Ollama's `think`: on, off, or an effort level (gpt-oss's; served as on).
ThinkLevel = Literal["low", "medium", "high"]
# Ollama's `format`: "" (none), "json", or a JSON schema object.
Format = Literal["", "json"] | dict[str, Any]
# Ollama's `keep_alive`: a duration ("5m", "1h"), seconds, or -1 / 0.
KeepAlive = str | Annotated[float, Field(ge=-(2**53), le=2**53)]


class Options(OpenAIModel):
    """The options sluice reads; any other key is accepted and ignored."""

    # -1: no limit, -2: fill the context (both: the rest of the context).
    num_predict: Annotated[int, Field(ge=-2, le=INT64_MAX)] | None = None
    # Accepted and ignored: the context is the model's (--max-model-len).
    num_ctx: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = None
    temperature: Temperature | None = None
    # 0 (or below): no top-k cut, as in Ollama.
    top_k: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    top_p: TopP | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stop: Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | str | None = None
    repeat_penalty: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None


class ToolCallFunction(OpenAIModel):
    name: str
    # An object, as Ollama sends it (not OpenAI's JSON text).
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(OpenAIModel):
    function: ToolCallFunction


class Message(OpenAIModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    # Base64 images: refused (a text-only model), by name.
    images: list[str] | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOLS)] | None = None
    # A tool message: the tool whose result it carries.
    tool_name: str | None = None
    # An earlier assistant turn's reasoning: left out of the prompt, as
    # chat templates leave it.
    thinking: str | None = None


class FunctionDefinition(OpenAIModel):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(OpenAIModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class GenerationFields(OpenAIModel):
    """Fields /api/chat and /api/generate share."""

    # Required, as in Ollama; the served model's name (":latest" accepted).
    model: Annotated[str, Field(min_length=1)]
    # Ollama streams unless told not to.
    stream: bool | None = None
    format: Format | None = None
    options: Options | None = None
    think: bool | ThinkLevel | None = None
    # Accepted: one model stays loaded for the server's life.
    keep_alive: KeepAlive | None = None
    # Refused when true: Ollama's API here carries no logprobs yet.
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None


class ChatRequest(GenerationFields):
    # None or []: Ollama's "load the model" call (answered done_reason "load").
    messages: list[Message] | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None


class GenerateRequest(GenerationFields):
    # None or "": Ollama's "load the model" call (answered done_reason "load").
    prompt: str | None = None
    # Refused when non-empty: fill-in-the-middle needs a template that has it.
    suffix: str | None = None
    system: str | None = None
    # Refused when non-empty: Ollama's Go templates are not run here.
    template: str | None = None
    # The token array a previous answer returned: the conversation so far.
    context: list[TokenId] | None = None
    raw: bool | None = None
    images: list[str] | None = None


class ShowRequest(OpenAIModel):
    # `name` is the older spelling; one of the two is needed (routes.py).
    model: str | None = None
    name: str | None = None
    verbose: bool | None = None
