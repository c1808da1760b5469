"""The schemas that force tool calls: their shape (vLLM's), every local
reference pointing where its target moved, inputs untouched, and llguidance
compiles them."""

from __future__ import annotations

import copy

import pytest

from sluice.structured.grammar import grammar_of
from sluice.structured.spec import StructuredOutputSpec
from sluice.tools.schema import (
    EMPTY_PARAMETERS,
    FunctionTool,
    named_function_schema,
    relocated,
    required_schema,
)

WEATHER = FunctionTool(
    "get_weather",
    "Current weather",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/unit"}},
        "required": ["city"],
        "$defs": {"unit": {"enum": ["celsius", "fahrenheit"]}},
    },
)
NOW = FunctionTool("now")


def test_a_named_function_is_forced_by_its_parameters():
    assert named_function_schema(WEATHER) == WEATHER.parameters
    assert named_function_schema(NOW) == EMPTY_PARAMETERS


def test_required_is_an_array_of_one_branch_per_tool():
    before = copy.deepcopy(WEATHER.parameters)
    schema = required_schema([WEATHER, NOW], parallel_tool_calls=True)
    assert WEATHER.parameters == before, "the tool's schema is not changed"
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    weather, now = schema["items"]["anyOf"]
    assert weather["properties"]["name"] == {"type": "string", "enum": ["get_weather"]}
    assert weather["required"] == ["name", "parameters"]
    parameters = weather["properties"]["parameters"]
    assert parameters["$defs"] == WEATHER.parameters["$defs"]
    assert parameters["properties"]["unit"] == {
        "$ref": "#/items/anyOf/0/properties/parameters/$defs/unit"
    }
    assert now["properties"]["parameters"] == EMPTY_PARAMETERS


def test_without_parallel_calls_at_most_one_item():
    assert required_schema([NOW], parallel_tool_calls=False)["maxItems"] == 1


def test_two_tools_may_define_one_name_differently():
    other = FunctionTool("other", None, {"type": "object", "$defs": {"unit": {"type": "integer"}},
                                          "properties": {"u": {"$ref": "#/$defs/unit"}}})  # fmt: skip
    schema = required_schema([WEATHER, other], parallel_tool_calls=True)
    reference = schema["items"]["anyOf"][1]["properties"]["parameters"]["properties"]["u"]
    assert reference == {"$ref": "#/items/anyOf/1/properties/parameters/$defs/unit"}
    grammar_of(StructuredOutputSpec.json_schema(schema))


def test_every_local_reference_moves_and_nothing_else_does():
    schema = {
        "properties": {
            "self": {"$ref": "#"},
            "old": {"$ref": "#/definitions/A", "default": {"$ref": "#/data"}},
            "sibling": {"anyOf": [{"$ref": "#/properties/old"}, {"$ref": "other.json#/A"}]},
            # Properties named like keywords are schemas all the same.
            "enum": {"$ref": "#/$defs/B"},
            "$ref": {"type": "string"},
        },
        "enum": [{"$ref": "#/data"}],
        "definitions": {"A": {"type": "integer"}},
        "$defs": {"B": {"items": {"$ref": "#/definitions/A"}}},
    }
    before = copy.deepcopy(schema)
    moved = relocated(schema, "#/x/0")
    assert schema == before
    properties = moved["properties"]
    assert properties["self"] == {"$ref": "#/x/0"}
    assert properties["old"] == {"$ref": "#/x/0/definitions/A", "default": {"$ref": "#/data"}}
    assert properties["sibling"]["anyOf"] == [
        {"$ref": "#/x/0/properties/old"}, {"$ref": "other.json#/A"}
    ]  # fmt: skip
    assert properties["enum"] == {"$ref": "#/x/0/$defs/B"}
    assert properties["$ref"] == {"type": "string"}
    assert moved["enum"] == [{"$ref": "#/data"}]
    assert moved["$defs"]["B"] == {"items": {"$ref": "#/x/0/definitions/A"}}
    assert relocated(schema, "#") == schema


def test_relocating_a_deep_schema_needs_no_recursion():
    schema: dict = {"type": "object"}
    for _ in range(5000):
        schema = {"type": "object", "properties": {"a": schema}}
    moved = relocated(schema, "#/x")
    for _ in range(5000):
        moved = moved["properties"]["a"]
    assert moved == {"type": "object"}


@pytest.mark.parametrize("parallel", [True, False])
def test_llguidance_compiles_the_schemas(parallel):
    grammar_of(StructuredOutputSpec.json_schema(required_schema([WEATHER, NOW], parallel)))
    grammar_of(StructuredOutputSpec.json_schema(named_function_schema(WEATHER)))


def test_a_tool_renders_for_templates_in_the_request_shape():
    assert NOW.as_template_dict() == {"type": "function", "function": {"name": "now"}}
    assert WEATHER.as_template_dict()["function"]["parameters"] is WEATHER.parameters
