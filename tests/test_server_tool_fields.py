"""A chat request's tool fields: what reaches the chat template, the sampling
(the constraint that forces calls) and the reading of the output."""

from __future__ import annotations

import asyncio
import json

from sluice.apis.chat import protocol as chat_protocol
from sluice.apis.chat.to_internal import chat_request
from sluice.apis.openai_request import RequestOptions
from sluice.apis.rules.tool_fields import tool_plan
from sluice.frontend.preprocess import Preprocessor
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.tools.output_parsing import OutputParsing
from sluice.tools.tool_format import ToolCallFormat

TOKENIZER = ChatFakeTokenizer()
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time"}},
]  # fmt: skip
HISTORY = [
    {"role": "user", "content": "weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees"},
]  # fmt: skip


def body(**fields) -> chat_protocol.ChatCompletionRequest:
    return chat_protocol.ChatCompletionRequest.model_validate(
        {"messages": HISTORY, "tools": TOOLS, **fields}
    )


def converted(parser: str = "hermes", **fields):
    options = RequestOptions(
        "fake-model", Preprocessor(TOKENIZER, 4096), tool_format=ToolCallFormat(parser)
    )
    return asyncio.run(chat_request(body(**fields), options))


def test_tools_and_earlier_calls_reach_the_template_and_auto_reads_with_the_parser():
    request = converted()
    prompt = TOKENIZER.decode(request.prompts[0].token_ids)
    assert f"tools: {json.dumps(TOOLS)}" in prompt
    calls = [{"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]  # fmt: skip
    assert f"assistant:  calls: {json.dumps(calls)}" in prompt
    assert "tool: 12 degrees" in prompt
    assert request.output_parsing == OutputParsing("hermes")
    assert request.params.structured_output is None


def test_none_shows_the_tools_and_reads_nothing():
    # As vLLM and OpenAI: one prompt prefix whatever each turn's tool_choice.
    request = converted(tool_choice="none")
    assert f"tools: {json.dumps(TOOLS)}" in TOKENIZER.decode(request.prompts[0].token_ids)
    assert request.output_parsing is None


def test_required_and_named_are_forced_by_a_schema_whatever_the_parser():
    required = converted("mistral", tool_choice="required", parallel_tool_calls=False)
    assert required.output_parsing == OutputParsing("required", max_calls=1)
    schema = json.loads(required.params.structured_output.value)
    assert schema["maxItems"] == 1 and len(schema["items"]["anyOf"]) == 2
    named = converted("mistral", tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert named.output_parsing == OutputParsing("named", function_name="get_time")
    assert json.loads(named.params.structured_output.value) == {"properties": {}, "type": "object"}


def test_mistral_keeps_special_tokens_for_its_tag():
    assert converted("mistral").skip_special_tokens is False
    assert converted("hermes").skip_special_tokens is True


def test_the_reasoning_parser_reads_every_request_but_forced_calls():
    async def plan(**fields):
        return await tool_plan(body(**fields), ToolCallFormat("hermes"), "deepseek_r1")

    assert asyncio.run(plan()).output_parsing == OutputParsing("hermes", None, "deepseek_r1")
    assert asyncio.run(plan(tool_choice="none")).output_parsing == OutputParsing(
        reasoning_parser="deepseek_r1"
    )
    assert asyncio.run(plan(tool_choice="required")).output_parsing.reasoning_parser is None
