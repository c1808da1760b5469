"""A request's structured-output fields -> one checked `StructuredOutputSpec`.

Forms read (chat completions and completions alike):
- OpenAI `response_format`: `{"type": "text"}` (no constraint),
  `{"type": "json_object"}`, `{"type": "json_schema", "json_schema":
  {"name", "schema", "strict"}}`;
- vLLM `structured_outputs`: one of `json`, `regex`, `choice`, `grammar`,
  `json_object`;
- vLLM's older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`.

A request carries at most one constraint: a second is a 400 naming it. A
schema nested deeper than `limits.MAX_JSON_DEPTH`, or whose `$defs` or
`definitions` is not an object, is a 400 naming it (`check_json_schema`). The
spec is compiled here (`GrammarCheck`: in a worker thread, so a large schema
never stalls the event loop), so a bad schema, regex or grammar is a 400
naming the field before anything is queued.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson

from sluice.apis import openai_protocol
from sluice.errors import InvalidRequestError
from sluice.server.body import limits
from sluice.structured.grammar import GrammarError, grammar_of
from sluice.structured.spec import StructuredOutputSpec


@dataclass(frozen=True, slots=True)
class GrammarCheck:
    """Compiles a spec to check it, off the event loop.

    From the loop, the compile runs in a worker thread. A conversion that
    already runs in one (a large body's, `sluice.server.body.body`) must never
    suspend: it compiles right there (`is_inline`), as its Preprocessor
    tokenizes right there."""

    is_inline: bool = False

    async def __call__(self, spec: StructuredOutputSpec, param: str, what: str) -> None:
        """Raises InvalidRequestError naming `param` when `spec` does not compile."""
        try:
            if self.is_inline:
                grammar_of(spec)
            else:
                await asyncio.to_thread(grammar_of, spec)
        except GrammarError as error:
            raise InvalidRequestError(f"invalid {what}: {error}", param=param) from None


@dataclass(frozen=True, slots=True)
class StructuredField:
    """One constraint a request asked for, and the field that asked (for errors)."""

    param: str
    spec: StructuredOutputSpec


async def structured_output(
    body: openai_protocol.SamplingFields, check: GrammarCheck
) -> StructuredOutputSpec | None:
    """The request's constraint, compiled once to check it; None when it has none."""
    field = structured_field(body)
    if field is None:
        return None
    await check(field.spec, field.param, field.param)
    return field.spec


def structured_field(body: openai_protocol.SamplingFields) -> StructuredField | None:
    """The one structured-output form of `body`, not yet compiled."""
    found = [
        *_response_format(body.response_format),
        *_structured_outputs(body.structured_outputs),
        *_guided(body),
    ]
    if len(found) > 1:
        raise InvalidRequestError(
            f"a request takes one structured output constraint; got {found[0].param} "
            f"and {found[1].param}",
            param=found[1].param,
        )
    return found[0] if found else None


def _response_format(
    response_format: openai_protocol.ResponseFormat | None,
) -> list[StructuredField]:
    if response_format is None or response_format.type == "text":
        return []
    if response_format.type == "json_object":
        return [StructuredField("response_format", StructuredOutputSpec.json_object())]
    if response_format.type != "json_schema":
        raise InvalidRequestError(
            f"response_format type {response_format.type[:40]!r} is not supported; "
            "use 'text', 'json_object' or 'json_schema'",
            param="response_format.type",
        )
    json_schema = response_format.json_schema
    if json_schema is None or json_schema.schema_ is None:
        param = "response_format.json_schema" + ("" if json_schema is None else ".schema")
        raise InvalidRequestError(f"{param} is required for type 'json_schema'", param=param)
    param = "response_format.json_schema.schema"
    schema = _schema(json_schema.schema_, param)
    return [StructuredField(param, StructuredOutputSpec.json_schema(schema))]


def _structured_outputs(
    params: openai_protocol.StructuredOutputsParams | None,
) -> list[StructuredField]:
    if params is None:
        return []
    found = _constraints(
        "structured_outputs.",
        json=params.json_,
        regex=params.regex,
        choice=params.choice,
        grammar=params.grammar,
    )
    if params.json_object:
        found.append(
            StructuredField("structured_outputs.json_object", StructuredOutputSpec.json_object())
        )
    return found


def _guided(body: openai_protocol.SamplingFields) -> list[StructuredField]:
    return _constraints(
        "guided_",
        json=body.guided_json,
        regex=body.guided_regex,
        choice=body.guided_choice,
        grammar=body.guided_grammar,
    )


def _constraints(
    prefix: str,
    *,
    json: dict[str, Any] | str | None,
    regex: str | None,
    choice: list[str] | None,
    grammar: str | None,
) -> list[StructuredField]:
    found = []
    if json is not None:
        param = f"{prefix}json"
        found.append(StructuredField(param, StructuredOutputSpec.json_schema(_schema(json, param))))
    if regex is not None:
        found.append(StructuredField(f"{prefix}regex", StructuredOutputSpec.regex(regex)))
    if choice is not None:
        if not choice:
            raise InvalidRequestError("the choice list is empty", param=f"{prefix}choice")
        found.append(StructuredField(f"{prefix}choice", StructuredOutputSpec.choice(choice)))
    if grammar is not None:
        found.append(StructuredField(f"{prefix}grammar", StructuredOutputSpec.grammar(grammar)))
    return found


def check_json_schema(schema: dict[str, Any], param: str) -> None:
    """What the compilers trip over: depth (each recurses once per level), and
    definitions that are not an object (llguidance ignores them; they are no
    JSON Schema)."""
    limits.check_json_depth(schema, param)
    for keyword in ("$defs", "definitions"):
        if keyword in schema and not isinstance(schema[keyword], dict):
            raise InvalidRequestError(
                f"{param}.{keyword} must be an object of named schemas", param=f"{param}.{keyword}"
            )


def _schema(value: dict[str, Any] | str, param: str) -> dict[str, Any]:
    """A checked schema given as an object, or as JSON text of one (vLLM takes both)."""
    schema = value
    if isinstance(value, str):
        try:
            schema = orjson.loads(value)
        except orjson.JSONDecodeError as error:
            raise InvalidRequestError(f"{param} is not valid JSON: {error}", param=param) from None
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"{param} must be a JSON schema object", param=param)
    check_json_schema(schema, param)
    return schema
