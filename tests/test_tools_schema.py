"""The schemas that force tool calls: their shape (vLLM's), $defs hoisted, inputs
untouched, and llguidance compiles them."""

from __future__ import annotations

import copy

import pytest

from sluice.errors import InvalidRequestError
from sluice.structured.grammar import grammar_of
from sluice.structured.spec import StructuredOutputSpec
from sluice.tools.schema import (
    EMPTY_PARAMETERS,
    FunctionTool,
    named_function_schema,
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
    assert "$defs" not in weather["properties"]["parameters"]
    assert schema["$defs"] == {"unit": {"enum": ["celsius", "fahrenheit"]}}
    assert now["properties"]["parameters"] == EMPTY_PARAMETERS


def test_without_parallel_calls_at_most_one_item():
    assert required_schema([NOW], parallel_tool_calls=False)["maxItems"] == 1


def test_two_tools_defining_one_name_differently_is_a_400():
    other = FunctionTool("other", None, {"type": "object", "$defs": {"unit": {"type": "integer"}}})
    with pytest.raises(InvalidRequestError) as error:
        required_schema([WEATHER, other], parallel_tool_calls=True)
    assert error.value.param == "tools[1].function.parameters"


@pytest.mark.parametrize("parallel", [True, False])
def test_llguidance_compiles_the_schemas(parallel):
    grammar_of(StructuredOutputSpec.json_schema(required_schema([WEATHER, NOW], parallel)))
    grammar_of(StructuredOutputSpec.json_schema(named_function_schema(WEATHER)))


def test_a_tool_renders_for_templates_in_the_request_shape():
    assert NOW.as_template_dict() == {"type": "function", "function": {"name": "now"}}
    assert WEATHER.as_template_dict()["function"]["parameters"] is WEATHER.parameters
