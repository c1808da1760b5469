"""The Responses API end to end: the official openai SDK against the embedded
model (in-process engine, float32, greedy), over a real socket. A stream,
accumulated by the SDK, equals the non-streamed response; a function-tool
loop runs through previous_response_id.
"""

from __future__ import annotations

import dataclasses
import json

import openai
import pytest

from sluice.testing.live_server import in_process_server

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"
TOOLS = [{
    "type": "function", "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]},
}]  # fmt: skip


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


def without_ids(response) -> list[dict]:
    items = [item.model_dump(exclude_none=True) for item in response.output]
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]


def test_a_stream_accumulated_by_the_sdk_equals_the_non_streamed_response(sdk):
    kwargs = {"model": model_of(sdk), "input": QUESTION, "temperature": 0,
              "max_output_tokens": 40}  # fmt: skip
    whole = sdk.responses.create(**kwargs)
    assert whole.status in ("completed", "incomplete") and whole.output_text
    deltas, final = [], None
    for event in sdk.responses.create(stream=True, **kwargs):
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert "".join(deltas) == whole.output_text
    assert final is not None and without_ids(final) == without_ids(whole)
    with sdk.responses.stream(**kwargs) as stream:
        accumulated = stream.get_final_response()
    assert accumulated.output_text == whole.output_text
    assert accumulated.usage.output_tokens == whole.usage.output_tokens


def test_a_function_tool_loop_through_previous_response_id(sdk):
    model = model_of(sdk)
    first = sdk.responses.create(model=model, input="What is the weather in Paris?",
                                 tools=TOOLS, tool_choice="required", temperature=0,
                                 max_output_tokens=60)  # fmt: skip
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments), dict)
    result = {"type": "function_call_output", "call_id": calls[0].call_id,
              "output": json.dumps({"temperature_c": 21, "sky": "clear"})}  # fmt: skip
    second = sdk.responses.create(model=model, previous_response_id=first.id, input=[result],
                                  tools=TOOLS, tool_choice="none", temperature=0,
                                  max_output_tokens=30)  # fmt: skip
    assert second.previous_response_id == first.id
    assert second.output_text
    assert second.usage.input_tokens > first.usage.input_tokens
