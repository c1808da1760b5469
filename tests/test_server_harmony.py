"""gpt-oss's harmony format over HTTP (fake engine, real sockets): a server
whose chat template writes harmony guesses the harmony reader, and each API
projects its analysis channel as reasoning (chat's `reasoning_content`,
a Responses reasoning item, a Messages thinking block), its commentary
calls as tool calls, and its final channel as the answer; streamed under a
slow reader, the same as the non-streamed response. `reasoning_effort`
reaches the template's `reasoning_effort`."""

from __future__ import annotations

import json

import httpx2
import pytest

from sluice.testing import FakeEngine
from sluice.testing.contract import parse_sse
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer
from sluice.testing.messages_stream import read_message_stream
from sluice.testing.slow_socket import read_slowly
from tests.tool_apis import APIS

MARKERS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>",
           "<|return|>"]  # fmt: skip
# A harmony template's telltale text, as gpt-oss's writes it.
TEMPLATE = (
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort }}{{ tools }}<|end|><|channel|>"
)
ARGUMENTS = '{"city":"Oslo"}'
CALL_OUTPUT = (
    "<|channel|>analysis<|message|>The user asks about Oslo; a < b |> c.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    f"<|message|>{ARGUMENTS}<|call|>"
)
ANSWER_OUTPUT = (
    "<|channel|>analysis<|message|>Oslo is cold.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is cold in Oslo.<|return|>"
)


class HarmonyTokenizer(ChatFakeTokenizer):
    chat_template_source = TEMPLATE

    def __init__(self) -> None:
        super().__init__(extra_pieces=MARKERS)


TOKENIZER = HarmonyTokenizer()


def serve(output: str, prompts: list[str] | None = None) -> LiveServer:
    token_ids = TOKENIZER.encode(output)

    def script(request_id, prompt, params):
        if prompts is not None:
            prompts.append(TOKENIZER.decode(list(prompt), skip_special_tokens=False))
        return iter(token_ids)

    engine = FakeEngine(script, tokens_per_step=(1, 5), step_interval_s=0.001, seed=5)
    return LiveServer(engine, TOKENIZER, send_buffer_bytes=4096)


def streamed_message(raw: bytes) -> tuple[dict, str | None]:
    """A chat stream's deltas put together: the message and the finish."""
    message: dict = {"content": "", "reasoning_content": "", "tool_calls": []}
    finish_reason = None
    for chunk in parse_sse(raw)[1:]:
        (choice,) = chunk["choices"]
        delta = choice["delta"]
        message["content"] += delta.get("content") or ""
        message["reasoning_content"] += delta.get("reasoning_content") or ""
        for call in delta.get("tool_calls", []):
            if "id" in call:
                message["tool_calls"].append({"name": call["function"]["name"], "arguments": ""})
            message["tool_calls"][call["index"]]["arguments"] += call["function"]["arguments"]
        finish_reason = choice["finish_reason"] or finish_reason
    return message, finish_reason


def reasoning_of(api: str, response: dict) -> str:
    if api == "chat":
        return response["choices"][0]["message"]["reasoning_content"] or ""
    if api == "responses":
        items = [item for item in response["output"] if item["type"] == "reasoning"]
        return "".join(part["text"] for item in items for part in item["content"])
    return "".join(b["thinking"] for b in response["content"] if b["type"] == "thinking")


@pytest.mark.parametrize("api", APIS, ids=lambda api: api.name)
def test_each_api_projects_analysis_calls_and_the_answer(api):
    with serve(CALL_OUTPUT) as live:
        called = api.post(live.url, api.body()).json()
    with serve(ANSWER_OUTPUT) as live:
        answered = api.post(live.url, api.body()).json()
    assert reasoning_of(api.name, called) == "The user asks about Oslo; a < b |> c."
    assert api.calls(called) == [("get_weather", {"city": "Oslo"})]
    assert api.text(called) == ""
    assert reasoning_of(api.name, answered) == "Oslo is cold."
    assert api.text(answered) == "It is cold in Oslo."
    assert api.calls(answered) == []


def test_a_streamed_chat_under_a_slow_reader_equals_the_non_streamed_one():
    (chat,) = [api for api in APIS if api.name == "chat"]
    with serve(CALL_OUTPUT) as live:
        url = live.url + chat.path
        whole = httpx2.post(url, json=chat.body(), timeout=60).json()["choices"][0]
        status, raw = read_slowly(
            url, {**chat.body(), "stream": True}, burst_bytes=64, pause_s=0.002
        )
    assert status == 200 and whole["finish_reason"] == "tool_calls"
    streamed, finish_reason = streamed_message(raw)
    assert finish_reason == "tool_calls"
    message = whole["message"]
    assert streamed["reasoning_content"] == message["reasoning_content"]
    assert streamed["content"] == (message["content"] or "")
    (call,) = message["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in streamed["tool_calls"]] == [
        (call["function"]["name"], ARGUMENTS)
    ]


def test_a_streamed_message_has_its_thinking_and_tool_use_blocks():
    (messages,) = [api for api in APIS if api.name == "messages"]
    with serve(CALL_OUTPUT) as live:
        body = {**messages.body(), "stream": True}
        status, raw = read_slowly(live.url + messages.path, body, burst_bytes=64, pause_s=0.002)
    assert status == 200
    content = read_message_stream(raw).message["content"]
    assert [block["type"] for block in content] == ["thinking", "tool_use"]
    assert content[1]["input"] == json.loads(ARGUMENTS)


@pytest.mark.parametrize(("effort", "written"), [("high", "high"), ("minimal", "low")])
def test_the_effort_reaches_the_templates_reasoning_line(effort, written):
    prompts: list[str] = []
    with serve(ANSWER_OUTPUT, prompts) as live:
        body = {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": effort}
        httpx2.post(live.url + "/v1/chat/completions", json=body, timeout=60).raise_for_status()
    assert f'"reasoning_effort": "{written}"' in prompts[0]
