"""The Messages API end to end: the official anthropic SDK against the embedded
model (in-process engine, float32, greedy), over a real socket.

The SDK's accumulated stream (`messages.stream(...).get_final_message()`)
equals the non-streamed message to the same greedy request, text and tool
input; a tool loop runs: a forced call (tool_choice "any" or a named tool,
held by constrained decoding), its result sent back, a text answer.
"""

from __future__ import annotations

import dataclasses

import anthropic
import pytest

from sluice.audit.scenarios.tools import TOOLS
from sluice.testing.live_server import in_process_server

pytestmark = pytest.mark.slow

ANTHROPIC_TOOLS = [
    {
        "name": tool["function"]["name"],
        "description": tool["function"]["description"],
        "input_schema": tool["function"]["parameters"],
    }
    for tool in TOOLS
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris right now?"}]
MAX_MODEL_LEN = 2048
# Anthropic's newest API has no temperature; older clients send it, and sluice serves it.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def live(embedded_model_config):
    float32 = dataclasses.replace(embedded_model_config, dtype="float32")
    with in_process_server(float32, max_model_len=MAX_MODEL_LEN) as server:
        yield server


@pytest.fixture(scope="module")
def sdk(live):
    with anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0) as client:
        yield client


def without_ids(message: anthropic.types.Message) -> dict:
    """The message but its ids, with the prompt's tokens as one count: how many
    of them the prefix cache held differs between a request and its repeat."""
    dumped = message.model_dump(exclude={"id"})
    dumped["content"] = [{k: v for k, v in b.items() if k != "id"} for b in dumped["content"]]
    usage = dumped["usage"]
    usage["input_tokens"] += usage.pop("cache_read_input_tokens")
    return dumped


def test_the_accumulated_stream_equals_the_non_streamed_message(sdk):
    kwargs = {"model": "claude-any", "max_tokens": 40, "extra_body": GREEDY, "messages": QUESTION,
              "system": "You are a helpful assistant."}  # fmt: skip
    message = sdk.messages.create(**kwargs)
    with sdk.messages.stream(**kwargs) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert message.content[0].type == "text" and message.content[0].text
    assert without_ids(final) == without_ids(message)
    assert "".join(texts) == message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")


def test_a_forced_call_streams_the_same_input_as_its_message(sdk):
    kwargs = {"model": "claude-any", "max_tokens": 200, "extra_body": GREEDY, "messages": QUESTION,
              "tools": ANTHROPIC_TOOLS,
              "tool_choice": {"type": "tool", "name": "get_weather"}}  # fmt: skip
    message = sdk.messages.create(**kwargs)
    with sdk.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    (call,) = message.content
    assert call.type == "tool_use" and call.name == "get_weather"
    assert set(call.input) == {"city", "unit"} and message.stop_reason == "tool_use"
    assert without_ids(final) == without_ids(message)
    assert final.content[0].id.startswith("toolu_")


def test_a_tool_loop_sends_the_result_back_and_gets_an_answer(sdk):
    first = sdk.messages.create(
        model="claude-any", max_tokens=200, extra_body=GREEDY, messages=QUESTION,
        tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"},
    )  # fmt: skip
    calls = [block for block in first.content if block.type == "tool_use"]
    assert calls and first.stop_reason == "tool_use"
    assert all(call.name in {tool["name"] for tool in ANTHROPIC_TOOLS} for call in calls)
    results = [
        {"type": "tool_result", "tool_use_id": call.id, "content": '{"temperature": 18}'}
        for call in calls
    ]
    history = [*QUESTION, {"role": "assistant", "content": first.content},
               {"role": "user", "content": results}]  # fmt: skip
    answer = sdk.messages.create(
        model="claude-any", max_tokens=30, extra_body=GREEDY, messages=history,
        tools=ANTHROPIC_TOOLS, tool_choice={"type": "none"},
    )  # fmt: skip
    assert [block.type for block in answer.content] == ["text"]
    assert answer.usage.input_tokens > first.usage.input_tokens


def test_max_tokens_past_the_context_is_lowered_not_refused(sdk):
    # Streamed, as Claude Code asks: the SDK refuses 32,000 tokens unstreamed.
    with sdk.messages.stream(
        model="claude-any", max_tokens=32000, extra_body=GREEDY, messages=QUESTION,
        stop_sequences=["\n"],
    ) as stream:  # fmt: skip
        message = stream.get_final_message()
    assert message.stop_reason in ("end_turn", "stop_sequence", "max_tokens")
    counted = sdk.messages.count_tokens(model="claude-any", messages=QUESTION)
    assert (
        message.usage.input_tokens + message.usage.cache_read_input_tokens == counted.input_tokens
    )
