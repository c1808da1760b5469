"""Anthropic's Messages API through the real app on a socket: a fake engine
emits text and tool-call text in multi-token deltas, a slow reader makes them
merge, and the streamed message equals the non-streamed one; errors come in
Anthropic's shape with its statuses; max_tokens past the context is lowered."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx2
import pytest

from sluice.testing import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer
from sluice.testing.messages_stream import read_message_stream
from sluice.testing.slow_socket import read_slowly

TOKENIZER = ChatFakeTokenizer()
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    "cache_control": {"type": "ephemeral"},
}
ARGUMENTS = {"city": "Zürich 😀", "nested": {"list": [1, 2.5, None]}}
HERMES_OUTPUT = (
    "Let me check, a < b.\n<tool_call>\n"
    f'{{"name": "get_weather", "arguments": {json.dumps(ARGUMENTS, ensure_ascii=False)}}}'
    "\n</tool_call>"
)
ANSWER = "The weather is fine, thanks for asking."


class Recorded:
    """A scripted engine's script that keeps what each request asked for."""

    def __init__(self, text: str):
        self.token_ids = TOKENIZER.encode(text)
        self.prompts: list[str] = []
        self.max_tokens: list[int] = []
        self.structured: list = []

    def __call__(self, request_id, prompt, params):
        self.prompts.append(TOKENIZER.decode(list(prompt), skip_special_tokens=False))
        self.max_tokens.append(params.max_tokens)
        self.structured.append(params.structured_output)
        return iter(self.token_ids)


def serve(script, **config) -> LiveServer:
    engine = FakeEngine(script, tokens_per_step=(1, 6), step_interval_s=0.001, seed=3)
    return LiveServer(engine, TOKENIZER, **config)


def body_of(**fields) -> dict:
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 200,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "weather?"}]}],
        "metadata": {"user_id": "u"},
    }
    return body | fields


def without_ids(message: dict) -> dict:
    blocks = [{k: v for k, v in block.items() if k != "id"} for block in message["content"]]
    return {k: v for k, v in message.items() if k != "id"} | {"content": blocks}


def test_a_text_message_comes_back_in_anthropics_shape():
    with serve(Recorded(ANSWER)) as live:
        response = httpx2.post(live.url + "/v1/messages", json=body_of(), timeout=60)
    assert response.status_code == 200
    message = response.json()
    assert message["id"].startswith("msg_") and message["type"] == "message"
    assert message["role"] == "assistant" and message["model"] == MODEL
    assert message["content"] == [{"type": "text", "text": ANSWER}]
    assert message["stop_reason"] == "end_turn" and message["stop_sequence"] is None
    usage = message["usage"]
    assert usage["output_tokens"] == len(TOKENIZER.encode(ANSWER))
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] > 0


def test_streamed_tool_use_under_a_slow_reader_equals_the_non_streamed_message():
    script = Recorded(HERMES_OUTPUT)
    with serve(script, tool_call_parser="hermes", send_buffer_bytes=4096) as live:
        url = live.url + "/v1/messages"
        whole = httpx2.post(url, json=body_of(tools=[WEATHER_TOOL]), timeout=60).json()
        status, raw = read_slowly(
            url, body_of(tools=[WEATHER_TOOL], stream=True), burst_bytes=64, pause_s=0.002
        )
    assert status == 200
    assert [block["type"] for block in whole["content"]] == ["text", "tool_use"]
    text, call = whole["content"]
    assert text["text"] == "Let me check, a < b."
    assert call["name"] == "get_weather" and call["input"] == ARGUMENTS
    assert call["id"].startswith("toolu_")
    assert whole["stop_reason"] == "tool_use"
    streamed = read_message_stream(raw)
    assert without_ids(streamed.message) == without_ids(whole)
    # The lagging reader got the call's argument text in fewer pieces than tokens.
    assert sum(streamed.num_deltas) < len(script.token_ids)
    assert "get_weather" in script.prompts[0] and "Be brief." in script.prompts[0]


def test_a_stop_sequence_ends_the_message_and_is_named():
    with serve(Recorded(ANSWER)) as live:
        url = live.url + "/v1/messages"
        whole = httpx2.post(url, json=body_of(stop_sequences=["fine"]), timeout=60).json()
        _, raw = read_slowly(url, body_of(stop_sequences=["fine"], stream=True))
    assert whole["content"] == [{"type": "text", "text": "The weather is "}]
    assert whole["stop_reason"] == "stop_sequence" and whole["stop_sequence"] == "fine"
    assert without_ids(read_message_stream(raw).message) == without_ids(whole)


def test_max_tokens_past_the_context_is_lowered_to_what_fits():
    script = Recorded(ANSWER)
    with serve(script) as live:
        response = httpx2.post(live.url + "/v1/messages", json=body_of(max_tokens=32000))
        counted = httpx2.post(live.url + "/v1/messages/count_tokens", json=body_of())
    assert response.status_code == 200
    num_prompt_tokens = counted.json()["input_tokens"]
    assert script.max_tokens == [4096 - num_prompt_tokens]
    usage = response.json()["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == num_prompt_tokens


def test_max_tokens_that_fits_is_kept_and_ends_the_message_as_max_tokens():
    script = Recorded(ANSWER)
    with serve(script) as live:
        message = httpx2.post(live.url + "/v1/messages", json=body_of(max_tokens=3)).json()
    assert script.max_tokens == [3]
    assert message["stop_reason"] == "max_tokens" and message["usage"]["output_tokens"] == 3


def test_a_tool_loop_turn_renders_the_call_and_its_result():
    script = Recorded(ANSWER)
    messages = [
        {"role": "user", "content": "weather in Bern?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "call it", "signature": "s"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Bern"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "18 degrees"}]},
        ]},
        {"role": "system", "content": "A reminder."},
    ]  # fmt: skip
    with serve(script, tool_call_parser="hermes") as live:
        response = httpx2.post(
            live.url + "/v1/messages", json=body_of(messages=messages, tools=[WEATHER_TOOL])
        )
    assert response.status_code == 200, response.text
    prompt = script.prompts[0]
    assert 'assistant: Checking. calls: [{"id": "toolu_1"' in prompt
    assert "tool: 18 degrees" in prompt and "system: A reminder." in prompt
    assert "call it" not in prompt


def test_tool_choice_auto_on_a_default_server_shows_the_tools_and_answers_in_text():
    script = Recorded(ANSWER)
    with serve(script) as live:
        response = httpx2.post(live.url + "/v1/messages", json=body_of(tools=[WEATHER_TOOL]))
    assert response.status_code == 200, response.text
    assert response.json()["content"] == [{"type": "text", "text": ANSWER}]
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in script.prompts[0]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
         "messages[0].content[0].type"),
        ({"temperature": 1.5}, "temperature"),
        ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER_TOOL]},
         "tool_choice.name"),
    ],
)  # fmt: skip
def test_bad_requests_are_400s_in_anthropics_shape(fields, param):
    body = {k: v for k, v in (body_of() | fields).items() if v is not None}
    with serve(Recorded(ANSWER), tool_call_parser="hermes") as live:
        response = httpx2.post(live.url + "/v1/messages", json=body)
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert param in error["error"]["message"]


def test_an_image_is_refused_saying_why():
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    body = body_of(messages=[{"role": "user", "content": [image]}])
    with serve(Recorded(ANSWER)) as live:
        response = httpx2.post(live.url + "/v1/messages", json=body)
    assert "text-only model" in response.json()["error"]["message"]


def test_x_api_key_is_accepted_and_a_wrong_key_is_an_anthropic_401():
    with serve(Recorded(ANSWER), api_key="sesame") as live:
        url = live.url + "/v1/messages"
        headers = {"anthropic-version": "2023-06-01"}
        wrong = httpx2.post(url, json=body_of(), headers=headers | {"x-api-key": "nope"})
        right = httpx2.post(url, json=body_of(), headers=headers | {"x-api-key": "sesame"})
        bearer = httpx2.post(url, json=body_of(), headers={"Authorization": "Bearer sesame"})
        chat = httpx2.post(live.url + "/v1/chat/completions", json={}, headers={"x-api-key": "no"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["type"] == "authentication_error"
    assert right.status_code == bearer.status_code == 200
    # Other routes keep OpenAI's shape.
    assert chat.status_code == 401 and chat.json()["error"]["code"] == "invalid_api_key"


def test_unknown_messages_routes_are_anthropic_404s():
    with serve(Recorded(ANSWER)) as live:
        response = httpx2.post(live.url + "/v1/messages/batches", json={})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


def test_count_tokens_counts_the_prompt_the_message_is_generated_from():
    script = Recorded(ANSWER)
    with serve(script, tool_call_parser="hermes") as live:
        body = body_of(tools=[WEATHER_TOOL])
        counted = httpx2.post(live.url + "/v1/messages/count_tokens", json=body).json()
        httpx2.post(live.url + "/v1/messages", json=body)
    assert counted == {"input_tokens": len(TOKENIZER.encode(script.prompts[0]))}


def test_the_access_log_counts_a_streamed_messages_output_tokens(caplog):
    caplog.set_level(logging.INFO, logger="sluice.access")
    with serve(Recorded(ANSWER)) as live:
        _, raw = read_slowly(live.url + "/v1/messages", body_of(stream=True))

        async def logged() -> None:
            while not any("/v1/messages" in r.getMessage() for r in caplog.records):
                await asyncio.sleep(0.01)

        asyncio.run(asyncio.wait_for(logged(), 10))
    output_tokens = read_message_stream(raw).message["usage"]["output_tokens"]
    (line,) = [r.getMessage() for r in caplog.records if "/v1/messages" in r.getMessage()]
    assert f"completion_tokens={output_tokens} " in line


def test_output_config_format_constrains_the_output_to_its_schema():
    script = Recorded('{"city": "Bern"}')
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    output_config = {"effort": "low", "format": {"type": "json_schema", "schema": schema}}
    with serve(script) as live:
        url = live.url + "/v1/messages"
        response = httpx2.post(url, json=body_of(output_config=output_config))
        broken = {"format": {"type": "json_schema", "schema": {"type": 5}}}
        refused = httpx2.post(url, json=body_of(output_config=broken))
    assert response.status_code == 200, response.text
    assert response.json()["content"] == [{"type": "text", "text": '{"city": "Bern"}'}]
    assert script.structured[0] is not None
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("thinking", ["enabled", "adaptive", "between_tools", "disabled"])
def test_every_thinking_type_is_accepted(thinking):
    config = {"type": thinking, "budget_tokens": 1024, "display": "omitted"}
    with serve(Recorded(ANSWER)) as live:
        body = body_of(thinking=config, max_tokens=2048)  # more than the budget
        response = httpx2.post(live.url + "/v1/messages", json=body)
    assert response.status_code == 200, response.text


def test_a_large_count_tokens_body_with_a_forced_tool_is_counted_in_the_worker():
    """A body past the worker threshold is converted in a worker thread, where
    the forced tool's grammar is checked inline (it was a 500: no event loop)."""
    body = body_of(tools=[WEATHER_TOOL], tool_choice={"type": "any"}, metadata={"pad": "x" * 9000})
    with serve(Recorded(ANSWER), tool_call_parser="hermes") as live:
        response = httpx2.post(live.url + "/v1/messages/count_tokens", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["input_tokens"] > 0


def test_a_reader_that_leaves_mid_stream_aborts_the_engine_request():
    # Endless output: only the abort ends it.
    endless = FakeEngine(
        lambda *_: iter(lambda: TOKENIZER.encode("a")[0], None), step_interval_s=0.002
    )
    with LiveServer(endless, TOKENIZER) as live:
        body = body_of(stream=True, max_tokens=4000)
        with httpx2.stream("POST", live.url + "/v1/messages", json=body, timeout=60) as response:
            first = next(response.iter_bytes())
        assert first.startswith(b"event: message_start\n")

        async def aborted() -> None:
            while not endless.aborted_request_ids:
                await asyncio.sleep(0.01)

        asyncio.run(asyncio.wait_for(aborted(), 10))
    assert endless.aborted_request_ids[0].startswith("msg_")


def test_messages_requests_are_counted_in_the_metrics_as_chat_requests_are():
    with serve(Recorded(ANSWER)) as live:
        httpx2.post(live.url + "/v1/messages", json=body_of())
        read_slowly(live.url + "/v1/messages", body_of(stream=True, max_tokens=3))
        metrics = httpx2.get(live.url + "/metrics").text
    finished = {
        line.split("finished_reason=")[1].split('"')[1]: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("vllm:request_success_total{")
    }
    # The whole message ended by itself, the streamed one at max_tokens.
    assert finished == {"stop": 1.0, "length": 1.0}


def test_thinking_streams_as_a_thinking_block_unless_disabled():
    output = "<think>They ask about weather.</think>\n" + ANSWER
    with serve(Recorded(output), reasoning_parser="deepseek_r1", send_buffer_bytes=4096) as live:
        url = live.url + "/v1/messages"
        whole = httpx2.post(url, json=body_of(thinking={"type": "adaptive"})).json()
        _, raw = read_slowly(url, body_of(thinking={"type": "adaptive"}, stream=True))
        plain = httpx2.post(url, json=body_of(thinking={"type": "disabled"})).json()
    assert whole["content"] == [
        {"type": "thinking", "thinking": "They ask about weather.", "signature": ""},
        {"type": "text", "text": ANSWER},
    ]
    assert without_ids(read_message_stream(raw).message) == without_ids(whole)
    assert b'"type":"thinking_delta"' in raw
    assert plain["content"] == [{"type": "text", "text": output}]


def anthropic_error_of(response: httpx2.Response) -> str:
    """The message of an Anthropic 400 invalid_request_error."""
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    return body["error"]["message"]


def test_a_prompt_over_the_context_is_anthropics_prompt_is_too_long():
    # Claude Code compacts its conversation when it reads these words.
    long_turn = [{"role": "user", "content": "x" * 5000}]  # a token per "x": past 4096
    with serve(Recorded(ANSWER)) as live:
        url = live.url + "/v1/messages"
        num_tokens = httpx2.post(url + "/count_tokens", json=body_of(messages=long_turn)).json()
        whole = httpx2.post(url, json=body_of(messages=long_turn))
        streamed = httpx2.post(url, json=body_of(messages=long_turn, stream=True))
        chat = httpx2.post(live.url + "/v1/chat/completions",
                           json={"model": MODEL, "messages": long_turn})  # fmt: skip
    expected = f"prompt is too long: {num_tokens['input_tokens']} tokens > 4095 maximum"
    assert anthropic_error_of(whole) == expected
    assert anthropic_error_of(streamed) == expected
    # OpenAI's routes keep OpenAI's words.
    assert chat.status_code == 400 and "maximum context length" in chat.json()["error"]["message"]


def test_a_prompt_over_the_servers_prompt_limit_is_too_long_in_anthropics_words():
    from sluice.config import RequestLimits

    with serve(Recorded(ANSWER), limits=RequestLimits(max_prompt_tokens=40)) as live:
        url = live.url + "/v1/messages"
        long_turn = [{"role": "user", "content": "x" * 100}]
        num_tokens = httpx2.post(url + "/count_tokens", json=body_of(messages=long_turn)).json()
        response = httpx2.post(url, json=body_of(messages=long_turn))
    expected = f"prompt is too long: {num_tokens['input_tokens']} tokens > 40 maximum"
    assert anthropic_error_of(response) == expected


@pytest.mark.parametrize("budget_tokens", [200, 201, 10**6])
def test_a_thinking_budget_not_below_max_tokens_is_refused_as_anthropic_does(budget_tokens):
    thinking = {"type": "enabled", "budget_tokens": budget_tokens}
    with serve(Recorded(ANSWER)) as live:
        response = httpx2.post(live.url + "/v1/messages",
                               json=body_of(max_tokens=200, thinking=thinking))  # fmt: skip
    assert anthropic_error_of(response) == (
        "`max_tokens` must be greater than `thinking.budget_tokens`"
    )


def test_a_thinking_budget_below_anthropics_1024_minimum_is_served():
    # Sluice does not enforce a budget (reasoning and answer share max_tokens),
    # so Anthropic's product minimum is not refused (docs/API.md).
    thinking = {"type": "enabled", "budget_tokens": 100}
    with serve(Recorded(ANSWER)) as live:
        response = httpx2.post(live.url + "/v1/messages",
                               json=body_of(max_tokens=200, thinking=thinking))  # fmt: skip
        counted = httpx2.post(live.url + "/v1/messages/count_tokens",
                              json={**body_of(thinking=thinking | {"budget_tokens": 10**6})})  # fmt: skip
    assert response.status_code == 200, response.text
    assert counted.status_code == 200, counted.text
