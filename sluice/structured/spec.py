"""What a request's output must match: one frozen value, `StructuredOutputSpec`.

The HTTP edge builds it from `response_format`, `structured_outputs` or the
`guided_*` fields (`sluice.apis.rules.structured_fields`), tool calling builds it
from a tool's parameters (`StructuredOutputSpec.json_schema`); it rides in
`SamplingParams` across the process boundary, and the engine compiles it
(`sluice.structured.grammar`). It imports nothing heavier than msgspec, so
every layer may hold one.

Invariant: equal specs compile to the same grammar, so a spec is the key of
every grammar cache. `json_schema` keeps the schema's key order: the order of
`properties` is the order the output's keys come in.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

StructuredOutputKind = Literal[
    "json_schema", "json_object", "regex", "choice", "grammar", "llguidance"
]


class StructuredOutputSpec(msgspec.Struct, frozen=True):
    kind: StructuredOutputKind
    # json_schema: the schema as JSON text; regex: the pattern (whole output);
    # choice: a JSON array of the allowed strings; grammar: Lark or GBNF text
    # as llguidance reads it; json_object: empty (any JSON object);
    # llguidance: a top-level llguidance grammar as JSON, built by the server
    # (`sluice/tools/call_grammar.py`), never taken from a client.
    value: str = ""

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool) -> StructuredOutputSpec:
        """Output that is one JSON value matching `schema` (a JSON Schema)."""
        return cls("json_schema", _json(schema))

    @classmethod
    def json_object(cls) -> StructuredOutputSpec:
        """Output that is one JSON object, any keys."""
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> StructuredOutputSpec:
        """Output that matches `pattern` entirely."""
        return cls("regex", pattern)

    @classmethod
    def choice(cls, choices: list[str] | tuple[str, ...]) -> StructuredOutputSpec:
        """Output that is exactly one of `choices`."""
        return cls("choice", _json(list(choices)))

    @classmethod
    def grammar(cls, text: str) -> StructuredOutputSpec:
        """Output that the Lark (or GBNF) grammar `text` derives."""
        return cls("grammar", text)

    @classmethod
    def llguidance(cls, grammars: list[dict[str, Any]]) -> StructuredOutputSpec:
        """Output that the first of `grammars` (llguidance's own form: each a
        `lark_grammar` or `json_schema`, the others named for `@name`) derives."""
        return cls("llguidance", _json({"grammars": grammars}))


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()
