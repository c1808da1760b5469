"""JSON schemas that force a tool call: what `tool_choice` "required" or a named
function asks of constrained decoding (the same shapes as vLLM's).

- named: the output is that function's arguments, so the schema is its
  `parameters` (an empty object schema when it has none).
- required: the output is a JSON array of `{"name": ..., "parameters": {...}}`,
  one `anyOf` branch per tool (its name as a one-value enum), at least one
  item, at most one unless parallel tool calls are allowed. Each tool's
  parameters move whole (their `$defs` or `definitions` with them) to
  `#/items/anyOf/<i>/properties/parameters`, and every local reference in them
  (`#`, `#/$defs/...`, `#/definitions/...`, `#/properties/...`) is rewritten
  to point there: a reference means in the array what it meant in the tool,
  and two tools may define the same name differently. (vLLM hoists `$defs` to
  the root instead, which breaks every other local reference.)
- one call object (`call_object_schema`, for tool_choice "auto" with a
  response format: `sluice/tools/call_grammar.py`): `{"name": ...,
  "arguments": {...}}` (or "parameters"), one `anyOf` branch per tool, each
  tool's parameters moved to `#/anyOf/<i>/properties/<key>` as above.
Pure functions of the tools: the inputs are never changed. Without recursion:
the edge bounds a schema's depth, and so does nothing here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
# Keywords whose value maps names to schemas (their keys are no keywords).
SCHEMA_MAP_KEYWORDS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
# Keywords whose value is data: a "$ref" in it refers to nothing.
DATA_KEYWORDS = frozenset({"const", "default", "enum", "examples"})


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """One entry of a request's `tools` (type "function")."""

    name: str
    description: str | None = None
    # A JSON schema of the arguments object; None: the function takes none.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def as_template_dict(self) -> dict[str, Any]:
        """The tool as chat templates expect it (OpenAI's request shape)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        return {"type": "function", "function": function}


def named_function_schema(tool: FunctionTool) -> dict[str, Any]:
    return relocated(tool.parameters, "#") if tool.parameters else dict(EMPTY_PARAMETERS)


def required_schema(tools: Sequence[FunctionTool], parallel_tool_calls: bool) -> dict[str, Any]:
    assert tools, "tool_choice required comes with tools"
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                _call_schema(tool, "parameters", f"#/items/anyOf/{index}/properties/parameters")
                for index, tool in enumerate(tools)
            ],
        },
    }
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    return schema


def call_object_schema(tools: Sequence[FunctionTool], arguments_key: str) -> dict[str, Any]:
    """One call object of any of `tools`: `{"name": ..., <arguments_key>: {...}}`."""
    assert tools, "a call is of one of the tools"
    calls = [
        _call_schema(tool, arguments_key, f"#/anyOf/{index}/properties/{arguments_key}")
        for index, tool in enumerate(tools)
    ]
    return {"type": "object", "anyOf": calls}


def _call_schema(tool: FunctionTool, arguments_key: str, pointer: str) -> dict[str, Any]:
    """A call of `tool`, its parameters to sit at `pointer` of the whole schema."""
    parameters = relocated(tool.parameters, pointer) if tool.parameters else dict(EMPTY_PARAMETERS)
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": [tool.name]}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def relocated(schema: dict[str, Any], pointer: str) -> dict[str, Any]:
    """A copy of `schema` to sit at `pointer` ("#/..."; "#": the root) of a
    larger schema: every local `$ref` points where its target now is."""
    root: dict[str, Any] = {}
    # (a dict or list of `schema`, its copy, whether it is a map of named schemas)
    stack: list[tuple[Any, Any, bool]] = [(schema, root, False)]
    while stack:
        source, copied, is_schema_map = stack.pop()
        is_schema = isinstance(source, dict) and not is_schema_map
        for key, value in source.items() if isinstance(source, dict) else enumerate(source):
            if is_schema and key in DATA_KEYWORDS:
                pass  # shared: never changed, and never looked into
            elif is_schema and key == "$ref" and isinstance(value, str):
                value = _moved_reference(value, pointer)
            elif isinstance(value, (dict, list)):
                inner = {} if isinstance(value, dict) else [None] * len(value)
                stack.append((value, inner, is_schema and key in SCHEMA_MAP_KEYWORDS))
                value = inner
            copied[key] = value
    return root


def _moved_reference(reference: str, pointer: str) -> str:
    """A local JSON pointer reference, made relative to `pointer`; others unchanged."""
    if reference == "#" or reference.startswith("#/"):
        return pointer + reference[1:]
    return reference
