"""/v1/responses over a real socket, a fake engine scripting the model's text:
streamed events that add up to the non-streamed response, the store behind
previous_response_id, the tool loop, Codex's own request, and bad inputs
answered with a 400 naming the Responses field."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest

from sluice.testing import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer
from sluice.testing.responses_contract import check_responses_stream, parse_events
from sluice.testing.slow_socket import read_slowly

TOKENIZER = ChatFakeTokenizer()
CODEX_REQUEST = Path(__file__).parent / "data" / "codex_request.json"
CALL_OUTPUT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = [{"type": "function", "name": "get_weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]  # fmt: skip


# Codex's prompt is ~19k of the fake tokenizer's tokens.
MAX_MODEL_LEN = 65536


def serve(output: str = "Hello there, friend.", **config) -> LiveServer:
    token_ids = TOKENIZER.encode(output)
    engine = FakeEngine(lambda *_: iter(token_ids), tokens_per_step=1, step_interval_s=0.0005,
                        max_model_len=MAX_MODEL_LEN)  # fmt: skip
    return LiveServer(engine, TOKENIZER, max_model_len=MAX_MODEL_LEN, **config)


@pytest.fixture(scope="module")
def live():
    with serve() as server:
        yield server


@pytest.fixture(scope="module")
def tool_live():
    with serve(CALL_OUTPUT, tool_call_parser="hermes") as server:
        yield server


def post(live: LiveServer, body: dict, path: str = "/v1/responses") -> httpx2.Response:
    return httpx2.post(live.url + path, json={"model": "fake-model"} | body, timeout=60)


def streamed(live: LiveServer, body: dict) -> tuple[list[dict], dict]:
    response = post(live, body | {"stream": True})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_events(response.content)
    return events, check_responses_stream(events)


def items(response: dict) -> list[dict]:
    return [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in response["output"]]


def test_a_string_input_gets_a_message_and_the_stream_adds_up_to_the_same(live):
    whole = post(live, {"input": "hi"})
    assert whole.status_code == 200, whole.text
    body = whole.json()
    assert body["object"] == "response" and body["status"] == "completed"
    assert body["output"][0]["content"][0]["text"] == "Hello there, friend."
    _, final = streamed(live, {"input": "hi"})
    assert items(final) == items(body)
    assert final["usage"] == body["usage"]


def test_a_stored_response_is_read_back_continued_and_deleted(live):
    first = post(live, {"input": "hi", "instructions": "Be brief."}).json()
    assert httpx2.get(f"{live.url}/v1/responses/{first['id']}").json() == first
    alone = post(live, {"input": "and then?"}, "/v1/responses/input_tokens").json()
    follow = {"input": "and then?", "previous_response_id": first["id"]}
    continued = post(live, follow, "/v1/responses/input_tokens").json()
    assert continued["input_tokens"] > alone["input_tokens"]  # the stored turns come first
    assert post(live, follow).status_code == 200
    deleted = httpx2.delete(f"{live.url}/v1/responses/{first['id']}")
    assert deleted.json() == {"id": first["id"], "object": "response.deleted", "deleted": True}
    assert httpx2.get(f"{live.url}/v1/responses/{first['id']}").status_code == 404
    gone = post(live, follow)
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "previous_response_id"


def test_store_false_keeps_nothing(live):
    body = post(live, {"input": "hi", "store": False}).json()
    assert body["store"] is False
    assert httpx2.get(f"{live.url}/v1/responses/{body['id']}").status_code == 404


def test_a_function_call_is_an_item_and_its_output_continues_the_loop(tool_live):
    body = post(tool_live, {"input": "weather?", "tools": TOOLS}).json()
    (call,) = body["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    events, final = streamed(tool_live, {"input": "weather?", "tools": TOOLS})
    assert items(final) == items(body)
    assert any(e["type"] == "response.function_call_arguments.delta" for e in events)
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    loop = post(tool_live, {"input": [result], "tools": TOOLS, "previous_response_id": body["id"]})
    assert loop.status_code == 200, loop.text


def test_max_output_tokens_ends_incomplete_and_a_huge_one_is_cut_to_fit(live):
    events, final = streamed(live, {"input": "hi", "max_output_tokens": 2})
    assert events[-1]["type"] == "response.incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["usage"]["output_tokens"] == 2
    assert post(live, {"input": "hi", "max_output_tokens": 10**9}).status_code == 200


def test_codex_clis_own_request_is_served(live):
    request = json.loads(CODEX_REQUEST.read_text())
    _, final = streamed(live, request | {"model": "fake-model"})
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "Hello there, friend."


def test_unknown_items_and_hosted_tools_are_skipped_not_refused(live):
    items_ = [{"type": "reasoning", "summary": []}, {"type": "web_search_call", "id": "ws"},
              {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]  # fmt: skip
    tools = [{"type": "web_search"}, {"type": "local_shell"}, {"type": "mcp", "server_label": "x"}]
    response = post(live, {"input": items_, "tools": tools, "tool_choice": "auto"})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
         "input[0].content[0].type"),
        ({"input": [{"type": "function_call", "call_id": "c"}]}, "input[0].name"),
        ({"input": [7]}, "input"),
        ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
         "tool_choice.name"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "temperature": 9}, "temperature"),
        ({"input": "x", "top_logprobs": 3}, "top_logprobs"),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
    ],
)  # fmt: skip
def test_bad_inputs_are_400s_naming_the_responses_field(live, body, param):
    response = post(live, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


REASONING_CALLS = (
    "<think>The user wants <tool_call> weather.</think>\nLet me check.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich 😀"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)
TWO_TOOLS = [*TOOLS, {"type": "function", "name": "get_time"}]


def test_a_slow_reader_gets_merged_deltas_that_add_up_to_the_same_items():
    config = {"tool_call_parser": "hermes", "reasoning_parser": "deepseek_r1"}
    token_ids = TOKENIZER.encode(REASONING_CALLS)
    engine = FakeEngine(lambda *_: iter(token_ids), tokens_per_step=(1, 6),
                        step_interval_s=0.001, seed=3)  # fmt: skip
    body = {"model": "fake-model", "input": "weather?", "tools": TWO_TOOLS,
            "include": ["message.output_text.logprobs"], "top_logprobs": 1}  # fmt: skip
    with LiveServer(engine, TOKENIZER, send_buffer_bytes=4096, **config) as live:
        url = live.url + "/v1/responses"
        whole = httpx2.post(url, json=body, timeout=60).json()
        status, raw = read_slowly(url, body | {"stream": True}, burst_bytes=64, pause_s=0.002)
    assert status == 200
    events = parse_events(raw)
    final = check_responses_stream(events)
    assert [item["type"] for item in whole["output"]] == [
        "reasoning", "message", "function_call", "function_call",
    ]  # fmt: skip
    assert items(final) == items(whole)
    assert json.loads(whole["output"][2]["arguments"]) == {"city": "Zürich 😀"}
    assert whole["output"][3]["arguments"] == "{}"
    deltas = [e for e in events if e["type"].endswith(".delta")]
    assert len(deltas) < len(token_ids)  # the reader lagged: deltas merged


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": "hi", "tools": TOOLS + [{"type": "function", "name": "f", "x": _nested(300)}]},
         "tools"),
        ({"input": "hi", "tool_choice": {"type": "function", "name": "get_weather",
                                         "x": _nested(300)}}, "tool_choice"),
        ({"input": [{"type": "local_shell_call", "call_id": "c1", "action": _nested(300)}]},
         "input[0].action"),
    ],
)  # fmt: skip
def test_json_nested_past_the_limit_in_an_echoed_field_is_a_400_naming_it(live, body, param):
    """Fields echoed into the response object (or turned into a call's
    arguments) were serialized as they came: 300 levels is past what the
    encoder takes, and the request failed with a 500 (the fuzz test found it)."""
    response = post(live, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
