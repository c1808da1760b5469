"""JSON schemas that force a tool call: what `tool_choice` "required" or a named
function asks of constrained decoding (the same shapes as vLLM's).

- named: the output is that function's arguments, so the schema is its
  `parameters` (an empty object schema when it has none).
- required: the output is a JSON array of `{"name": ..., "parameters": {...}}`,
  one `anyOf` branch per tool (its name as a one-value enum), at least one
  item, at most one unless parallel tool calls are allowed. `$defs` of the
  tools' parameters are hoisted to the root, where their `#/$defs/...`
  references point once the parameters are nested; two tools defining the same
  name differently is a 400.
Pure functions of the tools: the inputs are never changed.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sluice.errors import InvalidRequestError

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


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
    return copy.deepcopy(tool.parameters) if tool.parameters else dict(EMPTY_PARAMETERS)


def required_schema(tools: Sequence[FunctionTool], parallel_tool_calls: bool) -> dict[str, Any]:
    assert tools, "tool_choice required comes with tools"
    parameters = [copy.deepcopy(tool.parameters) if tool.parameters else None for tool in tools]
    definitions = _hoisted_definitions(parameters)
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                _call_schema(tool.name, tool_parameters)
                for tool, tool_parameters in zip(tools, parameters, strict=True)
            ],
        },
    }
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    if definitions:
        schema["$defs"] = definitions
    return schema


def _call_schema(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": [name]},
            "parameters": parameters if parameters else dict(EMPTY_PARAMETERS),
        },
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }


def _hoisted_definitions(parameters: list[dict[str, Any] | None]) -> dict[str, Any]:
    """Take `$defs` out of each (copied) parameters schema; all of them, merged."""
    merged: dict[str, Any] = {}
    for index, schema in enumerate(parameters):
        if not schema:
            continue
        for name, definition in schema.pop("$defs", {}).items():
            if name in merged and merged[name] != definition:
                raise InvalidRequestError(
                    f"tools define '$defs/{name[:40]}' differently; "
                    "tool_choice 'required' needs one definition per name",
                    param=f"tools[{index}].function.parameters",
                )
            merged[name] = definition
    return merged
