"""Fuzz Ollama's API: random bodies against the live server never cause a 5xx
or a 422, every refusal is Ollama's error object (`{"error": message}`), and
every stream ends with its final `done: true` line.

Bodies mix plausible values of every field (messages with tool calls, tool
names and images, tools with schemas good and bad, every `think`, `format` as
"json" or a schema, options in and out of range, `context` token arrays,
`raw`, `template`, `keep_alive`, num_predict past the context) with arbitrary
JSON of any type and nesting in up to two fields, and bodies padded past the
worker threshold, as the chat fuzz does (tests/test_server_fuzz.py).
"""

from __future__ import annotations

import httpx2
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.json_strategies import deep, json_text, json_values, scalars
from sluice.testing.live_server import LiveServer

MAX_MODEL_LEN = 64
NUM_EXAMPLES = 200
NAMES = st.sampled_from(["f", "g"])
schema_leaves = st.sampled_from([
    {"type": "integer"}, {"type": "string", "maxLength": 3}, {"enum": ["a", "b"]},
    {"$ref": "#/$defs/A"}, {"type": 5},
]) | deep  # fmt: skip
schemas = st.fixed_dictionaries(
    {"type": st.just("object"),
     "properties": st.dictionaries(st.sampled_from("abc"), schema_leaves, max_size=3)},
    optional={"$defs": st.just({"A": {"type": "integer"}}) | scalars, "required": st.just(["a"])},
)  # fmt: skip
tool_calls = st.lists(
    st.fixed_dictionaries({"function": st.fixed_dictionaries(
        {"name": NAMES}, optional={"arguments": st.dictionaries(st.text(max_size=3), json_values,
                                                                 max_size=2)})}),
    max_size=2,
)  # fmt: skip
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool"])},
        optional={"content": st.text(max_size=20), "images": st.lists(st.just("AAAA"), max_size=1),
                  "tool_calls": tool_calls, "tool_name": NAMES, "thinking": st.text(max_size=5)}),
    max_size=3,
)  # fmt: skip
tools = st.lists(
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": NAMES}, optional={"parameters": schemas, "description": st.text(max_size=5)})}),
    max_size=2,
)  # fmt: skip
options = st.fixed_dictionaries({}, optional={
    "num_predict": st.integers(-3, 20) | st.just(10_000), "num_ctx": st.integers(-1, 9000),
    "temperature": st.floats(0, 3), "top_k": st.integers(-5, 50), "top_p": st.floats(0, 1.5),
    "min_p": st.floats(0, 1), "seed": st.integers(-(2**64), 2**64),
    "stop": st.lists(st.text(max_size=3), max_size=3) | st.text(max_size=3),
    "repeat_penalty": st.floats(0, 3), "presence_penalty": st.floats(-3, 3),
    "frequency_penalty": st.floats(-3, 3), "mirostat": st.integers(0, 2),
})  # fmt: skip
COMMON = {
    "model": st.sampled_from(["fake-model", "fake-model:latest", "llama3"]),
    "stream": st.booleans(),
    "format": st.sampled_from(["", "json", "yaml"]) | schemas,
    "options": options,
    "think": st.booleans() | st.sampled_from(["low", "medium", "high", "max"]),
    "keep_alive": st.sampled_from(["5m", "0", "-1m", 0, -1, 3600.5]),
    "logprobs": st.booleans(),
}  # fmt: skip
CHAT = COMMON | {"messages": messages, "tools": tools}
GENERATE = COMMON | {
    "prompt": st.text(max_size=20), "system": st.text(max_size=10),
    "template": st.sampled_from(["", "{{ .Prompt }}"]), "raw": st.booleans(),
    "context": st.lists(st.integers(-1, 300), max_size=8), "suffix": st.sampled_from(["", "x"]),
    "images": st.lists(st.just("AAAA"), max_size=1),
}  # fmt: skip
PATHS = {"/api/chat": CHAT, "/api/generate": GENERATE, "/api/show": {"model": COMMON["model"]}}


@st.composite
def requests(draw) -> tuple[str, object]:
    path = draw(st.sampled_from(sorted(PATHS)))
    valid = PATHS[path]
    body = draw(st.fixed_dictionaries({}, optional=valid))
    body.setdefault("model", "fake-model")
    for field in draw(st.lists(st.sampled_from(sorted(valid)), max_size=2)):
        body[field] = draw(json_values | deep)
    if draw(st.sampled_from([False, False, False, True])):
        body["padding"] = "x" * 9000
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
        assert set(error) == {"error"} and isinstance(error["error"], str)
    elif response.headers["content-type"] == "application/x-ndjson":
        lines = [orjson.loads(line) for line in response.content.split(b"\n")[:-1]]
        assert lines[-1]["done"] is True and "error" not in lines[-1]
        assert all(line["done"] is False for line in lines[:-1])


def test_random_ollama_bodies_never_cause_a_5xx(client):
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
    print(f"ollama fuzz: {counts['requests']} requests, {counts['ok']} answered 200")
    assert counts["requests"] >= NUM_EXAMPLES and counts["ok"] > 0
