"""Tool calling end to end: the official openai SDK against the embedded model
(in-process engine, float32, greedy), over a real socket.

SmolLM2-135M's template knows no tools, so the server shows them in the
system prompt with the default hermes format and reads that format back;
"required" and a named function hold because constrained decoding never lets
the model write anything but the calls, with a response format too; "auto"
with a response format lets it write calls or the format's JSON, nothing else.
"""

from __future__ import annotations

import dataclasses
import json

import openai
import pytest

from sluice.audit.scenarios.tools import TOOLS
from sluice.testing.live_server import in_process_server

pytestmark = pytest.mark.slow

# The audit's `tools` scenario's two tools: one definition for both.
QUESTION = [{"role": "user", "content": "What is the weather in Paris right now?"}]
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 40}},
    "required": ["answer"],
    "additionalProperties": False,
}
ANSWER_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}


@pytest.fixture(scope="module")
def live(embedded_model_config):
    float32 = dataclasses.replace(embedded_model_config, dtype="float32")
    with in_process_server(float32) as server:
        yield server


@pytest.fixture(scope="module")
def sdk(live):
    with openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def model_of(sdk: openai.OpenAI) -> str:
    return sdk.models.list().data[0].id


def assert_valid_calls(tool_calls) -> None:
    names = {tool["function"]["name"] for tool in TOOLS}
    assert tool_calls, "a forced call was made"
    for call in tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        assert isinstance(json.loads(call.function.arguments), dict)


def test_required_with_two_tools_makes_valid_calls(sdk):
    completion = sdk.chat.completions.create(
        model=model_of(sdk), messages=QUESTION, tools=TOOLS, tool_choice="required",
        temperature=0, max_tokens=200,
    )  # fmt: skip
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert_valid_calls(choice.message.tool_calls)


def test_a_streamed_call_accumulated_by_the_sdk_equals_the_non_streamed_one(sdk):
    kwargs = {
        "model": model_of(sdk), "messages": QUESTION, "tools": TOOLS, "temperature": 0,
        "max_tokens": 200, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }  # fmt: skip
    whole = sdk.chat.completions.create(**kwargs).choices[0]
    with sdk.chat.completions.stream(**kwargs) as stream:
        streamed = stream.get_final_completion().choices[0]
    assert streamed.finish_reason == whole.finish_reason == "tool_calls"
    assert_valid_calls(streamed.message.tool_calls)
    (call,) = streamed.message.tool_calls
    (whole_call,) = whole.message.tool_calls
    assert call.function.name == whole_call.function.name == "get_weather"
    assert call.function.arguments == whole_call.function.arguments


def test_a_follow_up_turn_sends_the_tool_result_back(sdk):
    first = sdk.chat.completions.create(
        model=model_of(sdk), messages=QUESTION, tools=TOOLS, tool_choice="required",
        temperature=0, max_tokens=200,
    ).choices[0].message  # fmt: skip
    call = first.tool_calls[0]
    history = [
        *QUESTION,
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'},
    ]
    answer = sdk.chat.completions.create(
        model=model_of(sdk), messages=history, tools=TOOLS, tool_choice="none",
        temperature=0, max_tokens=20,
    ).choices[0]  # fmt: skip
    assert answer.message.tool_calls is None
    assert answer.message.content


def test_auto_on_the_default_server_is_served(sdk):
    """Before: a 400, "needs a tool-call parser" (LangChain, LiteLLM,
    pydantic-ai and the agents SDK all send tools with "auto")."""
    completion = sdk.chat.completions.create(
        model=model_of(sdk), messages=QUESTION, tools=TOOLS, tool_choice="auto",
        temperature=0, max_tokens=60,
    )  # fmt: skip
    choice = completion.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if choice.message.tool_calls:
        assert_valid_calls(choice.message.tool_calls)


def test_a_forced_call_with_a_response_format_is_the_call(sdk):
    completion = sdk.chat.completions.create(
        model=model_of(sdk), messages=QUESTION, tools=TOOLS, tool_choice="required",
        response_format=ANSWER_FORMAT, temperature=0, max_tokens=200,
    )  # fmt: skip
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert_valid_calls(choice.message.tool_calls)


def test_auto_with_a_response_format_is_a_valid_call_or_the_formats_json(sdk):
    completion = sdk.chat.completions.create(
        model=model_of(sdk), messages=QUESTION, tools=TOOLS, tool_choice="auto",
        response_format=ANSWER_FORMAT, temperature=0, max_tokens=200,
    )  # fmt: skip
    message = completion.choices[0].message
    if message.tool_calls:
        assert_valid_calls(message.tool_calls)
    else:
        assert set(json.loads(message.content)) == {"answer"}
