"""Fuzz: random Responses API bodies against the live server never cause a
5xx or a 422.

Bodies mix plausible values (items of every type the API has, function,
custom, namespace and hosted tools, tool choices, text formats, stored
responses to continue) with arbitrary JSON of any type, nesting (up to
1,000 deep) and size in any field, and bodies padded past the worker
threshold (8 KiB) so the worker path converts them. Any answer is a success
(a stream that ends with exactly one terminal event) or an OpenAI error
object with a 4xx.
"""

from __future__ import annotations

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.json_strategies import deep, json_text, json_values
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer
from sluice.testing.responses_contract import TERMINAL, parse_events

NUM_EXAMPLES = 200

texts = st.text(max_size=20)
parts = st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "refusal",
                                                    "input_image", "x"]),
                           "text": texts, "refusal": texts}),
    max_size=3,
)  # fmt: skip
items = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer", "assistant",
                                                    "tool"]),
                           "content": texts | parts},
                          optional={"type": st.just("message")}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": st.just("c1"),
                           "name": st.sampled_from(["f", "g"]),
                           "arguments": st.sampled_from(['{"a": 1}', "{", "[" * 1500])}),
    st.fixed_dictionaries({"type": st.sampled_from(["function_call_output",
                                                    "custom_tool_call_output"]),
                           "call_id": st.just("c1"), "output": texts | parts}),
    st.fixed_dictionaries({"type": st.just("custom_tool_call"), "call_id": st.just("c2"),
                           "name": st.just("apply_patch"), "input": texts}),
    st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "item_reference",
                                                    "web_search_call", "local_shell_call",
                                                    "brand_new_type"])}),
)  # fmt: skip
schemas = st.fixed_dictionaries({"type": st.just("object"),
                                 "properties": st.just({"a": {"type": "integer"}})},
                                optional={"$defs": json_values})  # fmt: skip
tools = st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "name": st.sampled_from(["f", "g"])},
                          optional={"parameters": schemas | json_values}),
    st.fixed_dictionaries({"type": st.just("custom"), "name": st.just("apply_patch")},
                          optional={"format": json_values}),
    st.fixed_dictionaries({"type": st.just("namespace"), "name": st.just("ns"),
                           "tools": st.lists(st.fixed_dictionaries(
                               {"type": st.just("function"), "name": st.just("h")}),
                               max_size=2)}),
    st.fixed_dictionaries({"type": st.sampled_from(["web_search", "local_shell", "mcp",
                                                    "file_search"])}),
), max_size=3)  # fmt: skip
# The chat template's variables (as chat's fuzz): names it reads and not, any JSON.
TEMPLATE_KWARGS = st.dictionaries(
    st.sampled_from(["enable_thinking", "reasoning_effort", "messages", "x"]) | st.text(max_size=8),
    json_values | deep, max_size=3,
)  # fmt: skip
EFFORTS = st.sampled_from(["none", "minimal", "low", "medium", "high", "xhigh", "max"])
VALID = {
    "model": st.just(MODEL),
    "input": texts | st.lists(items, min_size=1, max_size=4),
    "instructions": texts, "store": st.booleans(), "stream": st.booleans(),
    "max_output_tokens": st.integers(1, 20), "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1), "seed": st.integers(0, 2**32),
    "top_logprobs": st.integers(0, 5),
    "include": st.lists(st.sampled_from(["message.output_text.logprobs",
                                         "reasoning.encrypted_content"]), max_size=2),
    "tools": tools,
    "tool_choice": st.sampled_from(["auto", "none", "required", "bogus"])
    | st.fixed_dictionaries({"type": st.sampled_from(["function", "custom", "allowed_tools",
                                                      "web_search"]),
                             "name": st.sampled_from(["f", "apply_patch", "zz"])}),
    "parallel_tool_calls": st.booleans(),
    "text": st.fixed_dictionaries({"format": st.one_of(
        st.just({"type": "text"}), st.just({"type": "json_object"}),
        schemas.map(lambda schema: {"type": "json_schema", "name": "A", "schema": schema}))}),
    "reasoning": st.fixed_dictionaries({}, optional={"effort": EFFORTS | texts, "summary": texts}),
    "chat_template_kwargs": TEMPLATE_KWARGS,
    "metadata": st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
    "previous_response_id": st.sampled_from(["resp_missing", "STORED"]),
    "background": st.booleans(), "truncation": texts, "user": texts,
}  # fmt: skip
FIELDS = sorted(VALID)


@st.composite
def bodies(draw) -> dict:
    required = {"model": VALID["model"], "input": VALID["input"]}
    optional = {field: value for field, value in VALID.items() if field not in required}
    body = draw(st.fixed_dictionaries(required, optional=optional))
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=2)):
        body[field] = draw(json_values | deep)
    if draw(st.booleans()):
        body["instructions"] = "x" * 9000  # the worker path
    return body


@pytest.fixture(scope="module")
def client():
    engine = LoopFakeEngine(tokens_per_step=(1, 4), finish_probability=0.05, max_model_len=65536)
    server = LiveServer(engine, ChatFakeTokenizer(), max_model_len=65536,
                        tool_call_parser="hermes", reasoning_parser="deepseek_r1")  # fmt: skip
    with server as live, httpx2.Client(base_url=live.url, timeout=60) as http:
        yield http


def check_answer(response: httpx2.Response) -> None:
    assert response.status_code < 500 and response.status_code != 422, response.text
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    elif response.headers["content-type"].startswith("text/event-stream"):
        events = parse_events(response.content)
        assert [e["type"] for e in events].count(events[-1]["type"]) == 1
        assert events[-1]["type"] in TERMINAL
        assert b"internal_server_error" not in response.content
    else:
        assert response.json()["object"] == "response"


def test_random_responses_bodies_never_cause_a_5xx(client):
    stored = client.post("/v1/responses", json={"model": MODEL, "input": "hi"}).json()["id"]
    counts = {"requests": 0, "ok": 0}

    @settings(max_examples=NUM_EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(body=bodies())
    def send(body: dict) -> None:
        if body.get("previous_response_id") == "STORED":
            body["previous_response_id"] = stored
        raw = json_text(body).encode()
        response = client.post("/v1/responses", content=raw,
                               headers={"Content-Type": "application/json"})  # fmt: skip
        counts["requests"] += 1
        counts["ok"] += response.status_code == 200
        check_answer(response)

    send()
    print(f"fuzz: {counts['requests']} requests, {counts['ok']} answered 200")
    assert counts["requests"] >= NUM_EXAMPLES and counts["ok"] > 0
