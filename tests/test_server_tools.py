"""Tool calls and reasoning through the real app on a socket: a fake engine
emits tool-call text in multi-token deltas, a slow reader makes them merge,
and the streamed calls equal the non-streamed ones byte for byte. Refusals
are 400s naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest

from sluice.server.body.limits import MAX_JSON_DEPTH
from sluice.testing import FakeEngine
from sluice.testing.contract import parse_sse
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.grammar_script import GrammarChoice
from sluice.testing.live_server import LiveServer
from sluice.testing.slow_socket import read_slowly
from tests.tool_apis import ANSWER_SCHEMA, APIS

ANSWER_JSON = '{"answer": "sunny"}'

TOKENIZER = ChatFakeTokenizer()
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time"}}
ARGUMENTS = json.dumps(
    {"city": "Zürich 😀", "nested": {"list": [1, 2.5, None]}}, ensure_ascii=False
)
HERMES_OUTPUT = (
    "Let me check, a < b.\n<tool_call>\n"
    f'{{"name": "get_weather", "arguments": {ARGUMENTS}}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)
REASONING_OUTPUT = "<think>The user wants <tool_call> weather.</think>\n" + HERMES_OUTPUT


def scripted(text: str):
    token_ids = TOKENIZER.encode(text)
    return lambda request_id, prompt, params: iter(token_ids)


def chat_body(**fields) -> dict:
    body = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [WEATHER_TOOL, TIME_TOOL],
    }
    body.update(fields)
    return body


def streamed_message(raw: bytes) -> tuple[dict, str | None]:
    """A stream's chunks accumulated as the SDK does: the message and the finish."""
    message: dict = {"content": "", "reasoning_content": "", "tool_calls": []}
    finish_reason = None
    for chunk in parse_sse(raw)[1:]:
        (choice,) = chunk["choices"]
        delta = choice["delta"]
        assert delta or choice["finish_reason"], "no empty chunks"
        assert delta.get("reasoning") == delta.get("reasoning_content")
        message["content"] += delta.get("content") or ""
        message["reasoning_content"] += delta.get("reasoning_content") or ""
        for call in delta.get("tool_calls", []):
            calls = message["tool_calls"]
            if "id" in call:
                assert call["index"] == len(calls) and call["type"] == "function"
                calls.append({"id": call["id"], "name": call["function"]["name"], "arguments": ""})
            else:
                assert set(call["function"]) == {"arguments"}, "the name goes out once"
            calls[call["index"]]["arguments"] += call["function"]["arguments"]
        finish_reason = choice["finish_reason"] or finish_reason
    return message, finish_reason


def calls_of(message: dict) -> list[tuple[str, str]]:
    return [
        (c["function"]["name"], c["function"]["arguments"]) if "function" in c else
        (c["name"], c["arguments"])
        for c in message.get("tool_calls") or []
    ]  # fmt: skip


def serve(output: str, **config) -> LiveServer:
    engine = FakeEngine(scripted(output), tokens_per_step=(1, 6), step_interval_s=0.001, seed=3)
    return LiveServer(engine, TOKENIZER, **config)


def test_streamed_calls_under_a_slow_reader_equal_the_non_streamed_ones():
    with serve(HERMES_OUTPUT, tool_call_parser="hermes", send_buffer_bytes=4096) as live:
        url = live.url + "/v1/chat/completions"
        body = httpx2.post(url, json=chat_body(), timeout=60).json()
        status, raw = read_slowly(url, chat_body(stream=True), burst_bytes=64, pause_s=0.002)
    assert status == 200
    (choice,) = body["choices"]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert message["content"] == "Let me check, a < b."
    assert calls_of(message) == [("get_weather", ARGUMENTS), ("get_time", "{}")]
    assert all(call["id"].startswith("call_") for call in message["tool_calls"])
    streamed, finish_reason = streamed_message(raw)
    assert finish_reason == "tool_calls"
    assert streamed["content"] == message["content"]
    assert calls_of(streamed) == calls_of(message)
    assert b'"tool_calls":[{"index":0,"id":"call_' in raw


def test_reasoning_then_calls_stream_as_they_come_out_whole():
    config = {"tool_call_parser": "hermes", "reasoning_parser": "deepseek_r1"}
    with serve(REASONING_OUTPUT, send_buffer_bytes=4096, **config) as live:
        url = live.url + "/v1/chat/completions"
        body = httpx2.post(url, json=chat_body(), timeout=60).json()
        status, raw = read_slowly(url, chat_body(stream=True), burst_bytes=64, pause_s=0.002)
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == message["reasoning"]
    assert message["reasoning_content"] == "The user wants <tool_call> weather."
    assert message["content"] == "Let me check, a < b."
    streamed, _ = streamed_message(raw)
    assert streamed["reasoning_content"] == message["reasoning_content"]
    assert streamed["content"] == message["content"]
    assert (
        calls_of(streamed) == calls_of(message) == [("get_weather", ARGUMENTS), ("get_time", "{}")]
    )


def test_tool_choice_none_reads_nothing_and_the_text_is_the_content():
    with serve(HERMES_OUTPUT, tool_call_parser="hermes") as live:
        response = httpx2.post(
            live.url + "/v1/chat/completions", json=chat_body(tool_choice="none"), timeout=60
        )
    (choice,) = response.json()["choices"]
    assert choice["message"] == {"role": "assistant", "content": HERMES_OUTPUT}
    assert choice["finish_reason"] == "stop"


def test_the_parser_is_guessed_from_the_chat_template():
    class HermesTemplateTokenizer(ChatFakeTokenizer):
        chat_template_source = "{% for tool in tools %}<tool_call>{{ tool }}</tool_call>"

    engine = FakeEngine(scripted(HERMES_OUTPUT), tokens_per_step=3)
    with LiveServer(engine, HermesTemplateTokenizer()) as live:
        response = httpx2.post(live.url + "/v1/chat/completions", json=chat_body(), timeout=60)
    assert calls_of(response.json()["choices"][0]["message"])[1] == ("get_time", "{}")


def test_qwen3s_template_guesses_hermes_calls_and_its_reasoning_parser():
    class Qwen3TemplateTokenizer(ChatFakeTokenizer):
        chat_template_source = (
            Path(__file__).parent / "data" / "qwen3_chat_template.jinja"
        ).read_text()

    engine = FakeEngine(scripted(REASONING_OUTPUT), tokens_per_step=3)
    with LiveServer(engine, Qwen3TemplateTokenizer()) as live:
        response = httpx2.post(live.url + "/v1/chat/completions", json=chat_body(), timeout=60)
    message = response.json()["choices"][0]["message"]
    assert message["reasoning_content"] == "The user wants <tool_call> weather."
    assert message["content"] == "Let me check, a < b."
    assert calls_of(message) == [("get_weather", ARGUMENTS), ("get_time", "{}")]


REFUSALS = [
    ({"tools": None, "tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools[1].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters"),
    ({"tools": []}, "tools"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "4"}]},
     "messages[1].tool_call_id"),
    ({"functions": [{"name": "f"}]}, "functions"),
]  # fmt: skip


def tool(parameters) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def deep_lists(depth: int) -> list:
    """Lists nested `depth` deep (json.dumps takes a few hundred levels)."""
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def earlier_call(arguments: str) -> list[dict]:
    return [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1",
         "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees"},
    ]  # fmt: skip


DEEP_PARAMETERS = {"type": "object", "properties": {"a": {"enum": deep_lists(600)}}}
NAMED_F = {"type": "function", "function": {"name": "f"}}
REFUSALS += [
    # Nested too deep for what reads them (json, the template, llguidance): a
    # RecursionError, and a 500, before.
    ({"messages": earlier_call("[" * 1500 + "]" * 1500)},
     "messages[1].tool_calls[0].function.arguments"),
    ({"messages": earlier_call("[" * 1500)}, "messages[1].tool_calls[0].function.arguments"),
    ({"tools": [tool(DEEP_PARAMETERS)], "tool_choice": "required"}, "tools[0].function.parameters"),
    ({"tools": [tool(DEEP_PARAMETERS)], "tool_choice": NAMED_F}, "tools[0].function.parameters"),
    ({"tools": [tool(DEEP_PARAMETERS)]}, "tools[0].function.parameters"),
    # $defs that is not an object: an AttributeError, and a 500, before.
    *[({"tools": [tool({"type": "object", "$defs": defs})], "tool_choice": "required"},
       "tools[0].function.parameters.$defs") for defs in ("x", None, [1])],
    ({"tools": [tool({"type": "object", "definitions": "x"})], "tool_choice": NAMED_F},
     "tools[0].function.parameters.definitions"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "param"), REFUSALS)
def test_bad_tool_fields_are_400s_naming_the_field(fields, param):
    with serve("", tool_call_parser="hermes") as live:
        response = httpx2.post(live.url + "/v1/chat/completions", json=chat_body(**fields))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
@pytest.mark.parametrize("tool_choice", ["required", "get_weather"])
def test_a_forced_call_with_a_response_format_is_the_call(api, tool_choice):
    """As OpenAI and vLLM: the forced call's grammar governs (a 400 before)."""
    arguments = '{"city": "Oslo"}'
    calls = f'[{{"name": "get_weather", "parameters": {arguments}}}]'
    output = calls if tool_choice == "required" else arguments
    script = GrammarChoice(TOKENIZER, [output, ANSWER_JSON])
    engine = FakeEngine(script, tokens_per_step=3)
    with LiveServer(engine, TOKENIZER) as live:
        response = api.post(live.url, api.body(tool_choice, ANSWER_SCHEMA))
    assert response.status_code == 200, response.text
    assert api.calls(response.json()) == [("get_weather", {"city": "Oslo"})]
    (spec,) = script.specs
    assert spec.kind == "json_schema" and "answer" not in spec.value


def test_json_within_the_depth_limit_is_served():
    brackets_in_strings = json.dumps({"city": "[{" * 1000, "quote": '"[\\'})
    fields = {
        "messages": earlier_call(brackets_in_strings),
        "tools": [tool({"type": "object", "properties": {"a": {"enum": [deep_lists(60)]}}})],
        "tool_choice": "required",
    }
    with serve('[{"name": "f", "parameters": {}}]') as live:
        response = httpx2.post(live.url + "/v1/chat/completions", json=chat_body(**fields))
    assert response.status_code == 200, response.text
    assert calls_of(response.json()["choices"][0]["message"]) == [("f", "{}")]
    parameters = fields["tools"][0]["function"]["parameters"]
    assert max_depth(parameters) == MAX_JSON_DEPTH


def max_depth(value) -> int:
    if isinstance(value, dict):
        value = list(value.values())
    if not isinstance(value, list):
        return 0
    return 1 + max(map(max_depth, value), default=0)


PYDANTIC_V1_PARAMETERS = {
    "type": "object",
    "properties": {"unit": {"$ref": "#/definitions/Unit"}, "also": {"$ref": "#/properties/unit"}},
    "definitions": {"Unit": {"enum": ["celsius", "fahrenheit"]}},
}


@pytest.mark.parametrize("tool_choice", ["required", NAMED_F])
def test_references_outside_defs_work_for_required_as_for_a_named_function(tool_choice):
    """#/definitions/... (pydantic v1) and #/properties/...: "required" said the
    pointer did not exist, as its tools' parameters moved and their references
    did not."""
    fields = {"tools": [tool(PYDANTIC_V1_PARAMETERS)], "tool_choice": tool_choice}
    with serve('[{"name": "f", "parameters": {"unit": "celsius"}}]') as live:
        response = httpx2.post(live.url + "/v1/chat/completions", json=chat_body(**fields))
    assert response.status_code == 200, response.text
