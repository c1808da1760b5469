"""What the OpenAI-compatible request bodies share (and vLLM's extensions):
the pydantic base every API's models take, the documented ranges, the
sampling fields of completions and chat, and the one way a body becomes a
model.

Pydantic lives at the HTTP edge (sluice/apis) and nowhere deeper: each API's
`to_internal` turns its models into a frozen `GenerationRequest`. Rules every
model follows: unknown fields are ignored, `null` is accepted for every
optional field and means "the default", NaN and infinities are refused, and
every numeric range the API documents is checked here so the error names the
field. `parse_body` is the one way a body becomes a model: bad JSON and
invalid fields become a 400 `InvalidRequestError`, a body not declared JSON a
415. Its steps (`check_content_type`, `json_object`, `validate_body`) are
public for `sluice.server.body.body`, which runs them off the event loop, in
pieces, for large bodies. Checks that need the model (vocabulary, context
length, the served name) or relate several fields live in the `to_internal`
modules (what completions and chat share: `openai_request`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from sluice.errors import InvalidRequestError, UnsupportedMediaTypeError
from sluice.server.http.errors import validation_error

# Limits a client cannot exceed (OpenAI documents the same ranges).
MAX_LOGPROBS = 20
MAX_N = 128
MAX_STOP_STRINGS = 16
MAX_STOP_TOKEN_IDS = 256
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Count = Annotated[int, Field(ge=1, le=INT64_MAX)]
NumChoices = Annotated[int, Field(ge=1, le=MAX_N)]
TopLogprobs = Annotated[int, Field(ge=0, le=MAX_LOGPROBS)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]
# vLLM's request priority: lower runs sooner (--scheduling-policy priority).
Priority = Annotated[int, Field(strict=True, ge=INT64_MIN, le=INT64_MAX)]


# OpenAI's reasoning efforts ("none": no thinking); config.REASONING_EFFORTS
# are the ones with a budget.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
# A chat template's extra variables: names as Jinja reads them, values any JSON.
MAX_TEMPLATE_KWARGS = 64
ChatTemplateKwargs = Annotated[
    dict[Annotated[str, StringConstraints(max_length=64)], Any],
    Field(max_length=MAX_TEMPLATE_KWARGS),
]


# OpenAI's rule for function names.
FunctionName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
MAX_TOOLS = 128


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(OpenAIModel):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class JsonSchemaFormat(OpenAIModel):
    """`response_format.json_schema`: `name`, `description` and `strict` are
    accepted and change nothing (the schema is always enforced)."""

    name: str | None = None
    description: str | None = None
    # Named `schema` on the wire; the attribute would shadow pydantic's own.
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIModel):
    # "text", "json_object" or "json_schema"; others are refused by name.
    type: str
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsParams(OpenAIModel):
    """vLLM's `structured_outputs`: exactly one of these constraints."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class SamplingFields(OpenAIModel):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    # Token id (as a string, per the OpenAI API) -> bias in [-100, 100].
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    max_tokens: Count | None = None
    # vLLM's: each prompt token's logprob and top N alternatives (not with stream).
    prompt_logprobs: TopLogprobs | None = None
    n: NumChoices | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    user: str | None = None
    # vLLM extensions.
    top_k: Annotated[int, Field(ge=-1, le=INT64_MAX)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    include_stop_str_in_output: bool | None = None
    priority: Priority | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    # Structured outputs: at most one of these per request (`structured_fields`).
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsParams | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _check_stop(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise ValueError("stop must be a string or a list of strings")
        if len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        return value


Body = TypeVar("Body", bound=OpenAIModel)


def parse_body(raw: bytes, content_type: str | None, model: type[Body]) -> Body:
    """A request body as `model`; InvalidRequestError (400) for anything malformed."""
    check_content_type(content_type)
    return validate_body(json_object(raw), model)


def check_content_type(content_type: str | None) -> None:
    """A body must be declared JSON (application/json or application/*+json,
    parameters such as charset allowed), else 415. Missing is refused too: a
    web page can make a browser POST across origins, with no preflight, only
    as a form, as text/plain or with no type, so none of these reaches a
    local keyless server's generation routes."""
    if content_type is None or not _is_json_media_type(content_type):
        got = "none" if content_type is None else repr(content_type[:80])
        raise UnsupportedMediaTypeError(
            f"Content-Type must be application/json (or application/*+json), got {got}",
            code="unsupported_media_type",
        )


def json_object(
    raw: bytes | bytearray, loads: Callable[[bytes | bytearray], Any] = orjson.loads
) -> dict[str, Any]:
    """The body's JSON object, parsed by `loads` (which raises ValueError on bad JSON)."""
    try:
        data = loads(raw)
    except ValueError as exc:
        raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return data


def validate_body(data: dict[str, Any], model: type[Body]) -> Body:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False)) from None


def _is_json_media_type(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )
