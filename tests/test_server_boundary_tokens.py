"""One token that ends a tool call and starts text (`"}}.`, `"}},`, `"}}].` are
single tokens in real vocabularies), through the real app on a socket: every
API answers 200 with the call, then the text, and its stream (read by a slow
client, so deltas merge) adds up to the non-streamed answer. Before the
projections applied a parsed piece in text order, /v1/responses and
/v1/messages put the text first and failed (a 500; `response.failed`)."""

from __future__ import annotations

import json

import httpx2
import pytest

from sluice.testing import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer
from sluice.testing.messages_stream import read_message_stream
from sluice.testing.responses_contract import check_responses_stream, parse_events
from sluice.testing.slow_socket import read_slowly

# Each format's output: a call whose last characters and the text after it
# are one token of the tokenizer.
OUTPUTS = {
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Paris"}}. Done',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]. Done',
    "hermes": '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>. Done',
}
BOUNDARY_TOKENS = ('"}}.', '"}}].', '"}}</tool_call>.')
TOKENIZER = ChatFakeTokenizer(extra_pieces=BOUNDARY_TOKENS)
TOOL_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}}


def serve(parser: str) -> LiveServer:
    token_ids = TOKENIZER.encode(OUTPUTS[parser])
    engine = FakeEngine(lambda *_: iter(token_ids), tokens_per_step=(1, 4), step_interval_s=0.001,
                        seed=5)  # fmt: skip
    return LiveServer(engine, TOKENIZER, tool_call_parser=parser, send_buffer_bytes=4096)


def test_each_output_has_a_token_that_spans_the_call_and_the_text():
    for parser, output in OUTPUTS.items():
        pieces = TOKENIZER.convert_ids_to_tokens(TOKENIZER.encode(output))
        assert any(piece in BOUNDARY_TOKENS for piece in pieces), parser


def both(url: str, body: dict) -> tuple[httpx2.Response, bytes]:
    """The non-streamed answer and the stream read slowly (its deltas merge)."""
    whole = httpx2.post(url, json=body, timeout=60)
    status, raw = read_slowly(url, body | {"stream": True}, burst_bytes=64, pause_s=0.002)
    assert status == 200, raw[:300]
    return whole, raw


@pytest.mark.parametrize("parser", OUTPUTS)
def test_responses_read_the_call_then_the_text(parser):
    tools = [{"type": "function", "name": "get_weather", "parameters": TOOL_PARAMETERS}]
    body = {"model": "fake-model", "input": "weather?", "tools": tools}
    with serve(parser) as live:
        whole, raw = both(live.url + "/v1/responses", body)
    assert whole.status_code == 200, whole.text
    output = whole.json()["output"]
    assert [item["type"] for item in output] == ["function_call", "message"]
    assert json.loads(output[0]["arguments"]) == {"city": "Paris"}
    assert output[1]["content"][0]["text"].endswith("Done")
    events = parse_events(raw)
    assert events[-1]["type"] == "response.completed", events[-1]
    final = check_responses_stream(events)
    assert without_ids(final["output"]) == without_ids(output)


@pytest.mark.parametrize("parser", OUTPUTS)
def test_messages_read_the_call_then_the_text(parser):
    tool = {"name": "get_weather", "input_schema": TOOL_PARAMETERS}
    body = {"model": "claude", "max_tokens": 200, "tools": [tool],
            "messages": [{"role": "user", "content": "weather?"}]}  # fmt: skip
    with serve(parser) as live:
        whole, raw = both(live.url + "/v1/messages", body)
    assert whole.status_code == 200, whole.text
    message = whole.json()
    assert [block["type"] for block in message["content"]] == ["tool_use", "text"]
    assert message["content"][0]["input"] == {"city": "Paris"}
    assert message["content"][1]["text"].endswith("Done")
    assert without_ids(read_message_stream(raw).message["content"]) == without_ids(
        message["content"]
    )


@pytest.mark.parametrize("parser", OUTPUTS)
def test_chat_completions_read_the_call_and_the_text(parser):
    tools = [{"type": "function", "function": {"name": "get_weather",
                                               "parameters": TOOL_PARAMETERS}}]  # fmt: skip
    body = {"model": "fake-model", "tools": tools,
            "messages": [{"role": "user", "content": "weather?"}]}  # fmt: skip
    with serve(parser) as live:
        whole, raw = both(live.url + "/v1/chat/completions", body)
    assert whole.status_code == 200, whole.text
    message = whole.json()["choices"][0]["message"]
    (call,) = message["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert message["content"].endswith("Done")
    content, arguments = "", ""
    for line in raw.decode().splitlines():
        if not line.startswith("data: {"):
            continue
        delta = json.loads(line[len("data: ") :])["choices"][0]["delta"]
        content += delta.get("content") or ""
        arguments += "".join(c["function"]["arguments"] for c in delta.get("tool_calls", []))
    assert (content, arguments) == (message["content"], call["function"]["arguments"])


def without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]
