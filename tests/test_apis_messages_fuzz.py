"""Fuzz the Messages API: random bodies against the live server never cause a
5xx or a 422, and every refusal is Anthropic's error object.

Bodies mix plausible values of every field (content blocks of each type,
tool_use/tool_result pairs, tools with schemas good and bad, every
tool_choice, thinking types, output_config formats, max_tokens past the
context) with arbitrary JSON of any type and nesting in up to two fields, and
bodies padded past the worker threshold, as the chat fuzz does
(tests/test_server_fuzz.py).
"""

from __future__ import annotations

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.json_strategies import deep, json_text, json_values, scalars
from sluice.testing.live_server import LiveServer

MAX_MODEL_LEN = 64
schema_leaves = st.sampled_from([
    {"type": "integer"}, {"type": "string", "maxLength": 3}, {"enum": ["a", "b"]},
    {"$ref": "#/$defs/A"}, {"$ref": "#"}, {"type": 5},
]) | deep  # fmt: skip
schemas = st.fixed_dictionaries(
    {"type": st.just("object"),
     "properties": st.dictionaries(st.sampled_from("abc"), schema_leaves, max_size=3)},
    optional={"$defs": st.just({"A": {"type": "integer"}}) | scalars, "required": st.just(["a"])},
)  # fmt: skip
NUM_EXAMPLES = 200
NAMES = st.sampled_from(["f", "g"])

text_block = st.fixed_dictionaries(
    {"type": st.just("text"), "text": st.text(max_size=12)},
    optional={"cache_control": st.just({"type": "ephemeral"})},
)
blocks = st.one_of(
    text_block,
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.just("toolu_1"), "name": NAMES,
                           "input": st.dictionaries(st.text(max_size=3), json_values, max_size=2)}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": st.just("toolu_1"),
                           "content": st.text(max_size=8) | st.lists(text_block, max_size=2)},
                          optional={"is_error": st.booleans()}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": st.text(max_size=8),
                           "signature": st.just("s")}),
    st.just({"type": "image", "source": {"type": "base64", "data": "AA"}}),
)  # fmt: skip
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                           "content": st.text(min_size=1, max_size=20) | st.lists(blocks, max_size=3)}),
    min_size=1, max_size=3,
)  # fmt: skip
tools = st.lists(
    st.fixed_dictionaries({"name": NAMES}, optional={
        "input_schema": schemas, "description": st.text(max_size=5),
        "type": st.sampled_from(["custom", "bash_20250124"])}),
    min_size=1, max_size=2,
)  # fmt: skip
# The chat template's variables (as chat's fuzz): names it reads and not, any JSON.
TEMPLATE_KWARGS = st.dictionaries(
    st.sampled_from(["enable_thinking", "reasoning_effort", "messages", "x"]) | st.text(max_size=8),
    json_values | deep, max_size=3,
)  # fmt: skip
VALID = {
    "model": st.sampled_from(["claude-sonnet-4-5", "fake-model"]),
    "max_tokens": st.integers(1, 20) | st.just(32000),
    "stop_sequences": st.lists(st.text(min_size=1, max_size=4), max_size=3),
    "stream": st.booleans(), "temperature": st.floats(0, 1), "top_p": st.floats(0.01, 1),
    "top_k": st.integers(0, 10),
    "system": st.text(max_size=10) | st.lists(text_block, max_size=2),
    "tools": tools,
    "tool_choice": st.fixed_dictionaries(
        {"type": st.sampled_from(["auto", "any", "tool", "none"])},
        optional={"name": NAMES, "disable_parallel_tool_use": st.booleans()}),
    "thinking": st.fixed_dictionaries(
        {"type": st.sampled_from(["enabled", "disabled", "adaptive", "between_tools"])},
        optional={"budget_tokens": st.integers(0, 2000)}),
    "output_config": st.fixed_dictionaries({}, optional={
        "effort": st.just("low"),
        "format": schemas.map(lambda schema: {"type": "json_schema", "schema": schema})}),
    "metadata": st.just({"user_id": "u"}),
    "chat_template_kwargs": TEMPLATE_KWARGS,
}  # fmt: skip
FIELDS = sorted([*VALID, "messages"])
PATHS = ["/v1/messages", "/v1/messages/count_tokens"]


@st.composite
def requests(draw) -> tuple[str, object]:
    path = draw(st.sampled_from(PATHS))
    body = draw(st.fixed_dictionaries({}, optional=VALID))
    body["messages"] = draw(messages)
    body.setdefault("max_tokens", 16)
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=2)):
        body[field] = draw(json_values | deep)
    if draw(st.sampled_from([False, False, False, True])):
        body["metadata"] = {"user_id": "x" * 9000}
    if draw(st.integers(0, 19)) == 0:
        return path, draw(json_values)
    return path, body


@pytest.fixture(scope="module")
def client():
    engine = LoopFakeEngine(tokens_per_step=(1, 4), finish_probability=0.05, max_model_len=64)
    server = LiveServer(engine, ChatFakeTokenizer(), max_model_len=MAX_MODEL_LEN,
                        tool_call_parser="hermes", reasoning_parser="deepseek_r1")  # fmt: skip
    with server as live, httpx2.Client(base_url=live.url, timeout=30) as http:
        yield http


def check_answer(response: httpx2.Response) -> None:
    assert response.status_code < 500 and response.status_code != 422, response.text
    if response.status_code >= 400:
        error = response.json()
        assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
    elif response.headers["content-type"].startswith("text/event-stream"):
        assert response.content.endswith(b'data: {"type":"message_stop"}\n\n')
        assert b"api_error" not in response.content


def test_random_messages_bodies_never_cause_a_5xx(client):
    counts = {"requests": 0, "ok": 0}

    @settings(max_examples=NUM_EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(request=requests())
    def send(request: tuple[str, object]) -> None:
        path, body = request
        raw = json_text(body).encode()
        response = client.post(path, content=raw, headers={"Content-Type": "application/json"})
        counts["requests"] += 1
        counts["ok"] += response.status_code == 200
        check_answer(response)

    send()
    print(f"messages fuzz: {counts['requests']} requests, {counts['ok']} answered 200")
    assert counts["requests"] >= NUM_EXAMPLES and counts["ok"] > 0
