"""The official anthropic SDK against the live server (fake engine): what
Anthropic's own clients see, streamed and not, and its typed errors."""

from __future__ import annotations

import anthropic
import pytest

from sluice.testing.fake_engine import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer

API_KEY = "sesame"
TOKENIZER = ChatFakeTokenizer()
CALL_TEXT = 'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
TIME_TOOL = {
    "name": "get_time",
    "description": "The time in a zone",
    "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}},
}
MESSAGES = [{"role": "user", "content": "what time is it?"}]


def scripted(request_id, prompt, params):
    return iter(TOKENIZER.encode(CALL_TEXT))


@pytest.fixture(scope="module")
def live():
    engine = FakeEngine(scripted, tokens_per_step=(1, 5), step_interval_s=0.001, seed=2)
    with LiveServer(engine, TOKENIZER, api_key=API_KEY, tool_call_parser="hermes") as server:
        yield server


@pytest.fixture(scope="module")
def client(live):
    with anthropic.Anthropic(base_url=live.url, api_key=API_KEY, max_retries=0) as sdk:
        yield sdk


def without_ids(message: anthropic.types.Message) -> dict:
    dumped = message.model_dump(exclude={"id"})
    dumped["content"] = [{k: v for k, v in b.items() if k != "id"} for b in dumped["content"]]
    return dumped


def test_a_message_parses_into_the_sdk_types(client):
    message = client.messages.create(model="any", max_tokens=500, messages=MESSAGES)
    assert isinstance(message, anthropic.types.Message)
    assert message.content[0].type == "text" and message.content[0].text == CALL_TEXT
    assert message.stop_reason == "end_turn"


def test_the_sdks_accumulated_stream_equals_the_message(client):
    kwargs = {"model": "any", "max_tokens": 500, "messages": MESSAGES, "tools": [TIME_TOOL]}
    message = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[1].input == {"zone": "CET"} and message.stop_reason == "tool_use"
    assert without_ids(final) == without_ids(message)
    assert final.content[1].id.startswith("toolu_")


def test_the_sdks_raw_events_name_every_block_and_the_finish(client):
    kwargs = {"model": "any", "max_tokens": 500, "messages": MESSAGES, "tools": [TIME_TOOL]}
    events = list(client.messages.create(stream=True, **kwargs))
    types = [event.type for event in events]
    # The SDK drops the ping (its Stream skips them).
    assert types[0] == "message_start" and types[-1] == "message_stop"
    (finish,) = [event for event in events if event.type == "message_delta"]
    assert finish.delta.stop_reason == "tool_use" and finish.usage.output_tokens > 0


def test_count_tokens_answers_with_the_sdk_type(client):
    counted = client.messages.count_tokens(model="any", messages=MESSAGES)
    assert counted.input_tokens > 0


def test_errors_raise_the_sdks_typed_exceptions(live, client):
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="any", max_tokens=0, messages=MESSAGES)
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    wrong = anthropic.Anthropic(base_url=live.url, api_key="wrong", max_retries=0)
    with wrong, pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model="any", max_tokens=8, messages=MESSAGES)
