"""tool_choice "auto" with a response format: the grammar allows either the
calls, in the server's format with each tool's parameters held, or the
format's answer, and nothing else. Over a real socket on every API, a fake
engine answers with the first output the request's grammar allows, as a
constrained model can only do."""

from __future__ import annotations

import json

import pytest

from sluice.structured.spec import StructuredOutputSpec
from sluice.testing import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.grammar_script import GrammarChoice, accepts
from sluice.testing.live_server import LiveServer
from sluice.tools.call_grammar import calls_or_answer
from sluice.tools.schema import FunctionTool
from tests.tool_apis import ANSWER_SCHEMA, APIS, WEATHER_PARAMETERS

TOOLS = [FunctionTool("get_weather", parameters=WEATHER_PARAMETERS), FunctionTool("get_time")]
ANSWER = StructuredOutputSpec.json_schema(ANSWER_SCHEMA)
WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
TIME_CALL = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
ANSWER_JSON = '{"answer": "sunny"}'


def test_the_union_takes_the_calls_or_the_answer_and_nothing_else():
    spec = calls_or_answer(TOOLS, "hermes", True, ANSWER)
    assert accepts(spec, WEATHER_CALL)
    assert accepts(spec, f"{WEATHER_CALL}\n{TIME_CALL}\n")
    assert accepts(spec, ANSWER_JSON)
    for refused in [
        "It is sunny.",
        '{"answer": 3}',
        '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>',  # city is required
        '<tool_call>{"name": "get_news", "arguments": {}}</tool_call>',
        f"{WEATHER_CALL}{ANSWER_JSON}",
        f"Let me check. {WEATHER_CALL}",
    ]:
        assert not accepts(spec, refused), refused


def test_parallel_tool_calls_false_allows_one_call():
    spec = calls_or_answer(TOOLS, "hermes", False, ANSWER)
    assert accepts(spec, WEATHER_CALL) and accepts(spec, ANSWER_JSON)
    assert not accepts(spec, f"{WEATHER_CALL}\n{TIME_CALL}")


def test_llama3_json_calls_are_objects_joined_by_semicolons():
    spec = calls_or_answer(TOOLS, "llama3_json", True, ANSWER)
    calls = '{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", "parameters": {}}'
    assert accepts(spec, calls) and accepts(spec, ANSWER_JSON)
    assert not accepts(spec, WEATHER_CALL)


@pytest.mark.parametrize(
    ("answer", "allowed", "refused"),
    [
        (StructuredOutputSpec.json_object(), '{"any": [1]}', "[1]"),
        (StructuredOutputSpec.regex("[0-9]{1,3}"), "42", "4x"),
        (StructuredOutputSpec.choice(["yes", "no"]), "no", "maybe"),
        (StructuredOutputSpec.grammar('start: "a"+'), "aaa", "ab"),
    ],
)
def test_every_kind_of_format_is_embedded_whole(answer, allowed, refused):
    spec = calls_or_answer(TOOLS, "hermes", True, answer)
    assert accepts(spec, allowed) and accepts(spec, WEATHER_CALL)
    assert not accepts(spec, refused)


def test_mistral_has_no_union_and_the_format_governs_alone():
    assert calls_or_answer(TOOLS, "mistral", True, ANSWER) is None


def serve(script: GrammarChoice) -> LiveServer:
    """A server with default flags: the fake template shows no tool format,
    so the server shows hermes calls (the default) and reads them."""
    engine = FakeEngine(script, tokens_per_step=(1, 6), step_interval_s=0.001, seed=3)
    return LiveServer(engine, script.tokenizer)


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_auto_with_a_format_returns_the_call_the_grammar_leads_to(api):
    """Before: the format's grammar held from the first token, so the call was
    refused and the model could only answer with the JSON."""
    script = GrammarChoice(ChatFakeTokenizer(), [WEATHER_CALL, ANSWER_JSON])
    with serve(script) as live:
        response = api.post(live.url, api.body("auto", ANSWER_SCHEMA))
    assert response.status_code == 200, response.text
    assert api.calls(response.json()) == [("get_weather", {"city": "Oslo"})]
    assert api.text(response.json()) == ""


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_auto_with_a_format_returns_the_json_answer_and_never_prose(api):
    script = GrammarChoice(ChatFakeTokenizer(), ["It is sunny.", ANSWER_JSON])
    with serve(script) as live:
        response = api.post(live.url, api.body(None, ANSWER_SCHEMA))
    assert response.status_code == 200, response.text
    assert api.calls(response.json()) == []
    assert json.loads(api.text(response.json())) == {"answer": "sunny"}
