"""Ollama's API through the real app on a socket: a fake engine emits text and
tool-call text in multi-token deltas; NDJSON lines, a slow reader's coalesced
lines equal to the non-streamed answer, counts equal to the tokens, options
reaching the engine, and every refusal in Ollama's `{"error": ...}` shape."""

from __future__ import annotations

import json
import logging

import httpx2
import orjson
import pytest

from sluice.testing import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer
from sluice.testing.slow_socket import read_slowly

TOKENIZER = ChatFakeTokenizer()
ARGUMENTS = {"city": "Zürich 😀", "nested": {"list": [1, 2.5, None]}}
HERMES_OUTPUT = (
    "Let me check.\n<tool_call>\n"
    f'{{"name": "get_weather", "arguments": {json.dumps(ARGUMENTS, ensure_ascii=False)}}}'
    "\n</tool_call>"
)
ANSWER = "The weather is fine, thanks for asking. " * 8
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


class Recorded:
    """A scripted engine's script that keeps what each request asked for."""

    def __init__(self, text: str):
        self.token_ids = TOKENIZER.encode(text)
        self.prompts: list[list[int]] = []
        self.params: list = []

    def __call__(self, request_id, prompt, params):
        self.prompts.append(list(prompt))
        self.params.append(params)
        return iter(self.token_ids)

    def prompt_text(self, index: int = -1) -> str:
        return TOKENIZER.decode(self.prompts[index], skip_special_tokens=False)


def serve(script, tokens_per_step=(1, 6), **config) -> LiveServer:
    engine = FakeEngine(script, tokens_per_step=tokens_per_step, step_interval_s=0.001, seed=3)
    return LiveServer(engine, TOKENIZER, **config)


def chat_body(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "weather?"}]} | fields


def ndjson(raw: bytes) -> list[dict]:
    assert raw.endswith(b"\n")
    return [orjson.loads(line) for line in raw.split(b"\n")[:-1]]


def test_chat_streams_ndjson_lines_by_default_and_ends_with_the_counts():
    script = Recorded(ANSWER)
    with serve(script) as live:
        response = httpx2.post(live.url + "/api/chat", json=chat_body(), timeout=60)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    lines = ndjson(response.content)
    assert all(line["done"] is False for line in lines[:-1]) and lines[-1]["done"] is True
    assert "".join(line["message"]["content"] for line in lines) == ANSWER
    assert lines[-1]["eval_count"] == len(script.token_ids)
    assert lines[-1]["prompt_eval_count"] == len(script.prompts[0])
    assert lines[-1]["done_reason"] == "stop"


def test_a_slow_reader_gets_fewer_larger_lines_equal_to_the_non_streamed_answer():
    script = Recorded(ANSWER)
    # One token an engine step: a line with more is a merged one.
    with serve(script, tokens_per_step=(1, 1), send_buffer_bytes=4096) as live:
        whole = httpx2.post(live.url + "/api/chat", json=chat_body(stream=False), timeout=60)
        status, raw = read_slowly(
            live.url + "/api/chat", chat_body(), burst_bytes=64, pause_s=0.002
        )
    assert status == 200
    lines = ndjson(raw)
    message = whole.json()["message"]
    assert "".join(line["message"]["content"] for line in lines) == message["content"] == ANSWER
    assert all(line["message"]["content"] for line in lines[:-1])  # no empty line
    # The lagging reader's lines merged several engine steps.
    assert len(lines) - 1 < len(script.token_ids)
    assert max(len(TOKENIZER.encode(line["message"]["content"])) for line in lines) > 1
    assert lines[-1]["eval_count"] == whole.json()["eval_count"] == len(script.token_ids)


def test_tool_calls_come_back_whole_streamed_and_not():
    script = Recorded(HERMES_OUTPUT)
    with serve(script, tool_call_parser="hermes") as live:
        body = chat_body(tools=[WEATHER_TOOL])
        whole = httpx2.post(live.url + "/api/chat", json=body | {"stream": False}, timeout=60)
        _, raw = read_slowly(live.url + "/api/chat", body, burst_bytes=64, pause_s=0.002)
    message = whole.json()["message"]
    expected = [{"function": {"index": 0, "name": "get_weather", "arguments": ARGUMENTS}}]
    assert message["tool_calls"] == expected and message["content"] == "Let me check."
    lines = ndjson(raw)
    assert [c for line in lines for c in line["message"].get("tool_calls", [])] == expected
    assert "get_weather" in script.prompt_text(0)


def test_a_tool_turn_answers_the_call_it_names():
    script = Recorded(ANSWER)
    call = {"function": {"name": "get_weather", "arguments": {"city": "Bern"}}}
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny, 21 degrees", "tool_name": "get_weather"},
    ]
    with serve(script, tool_call_parser="hermes") as live:
        response = httpx2.post(
            live.url + "/api/chat",
            json=chat_body(messages=messages, tools=[WEATHER_TOOL], stream=False),
            timeout=60,
        )
    assert response.status_code == 200, response.text
    prompt = script.prompt_text()
    assert "sunny, 21 degrees" in prompt and '"Bern"' in prompt


def test_options_reach_the_engine_as_sampling_params():
    script = Recorded(ANSWER)
    options = {"num_predict": 7, "temperature": 0.3, "top_k": 5, "top_p": 0.9, "min_p": 0.1,
               "seed": 42, "stop": ["xyz"], "repeat_penalty": 1.2, "presence_penalty": 0.5,
               "frequency_penalty": 0.25, "num_ctx": 8192, "num_gpu": 99, "mirostat": 2}  # fmt: skip
    with serve(script) as live:
        body = chat_body(options=options, stream=False, keep_alive="5m")
        response = httpx2.post(live.url + "/api/chat", json=body, timeout=60)
    assert response.status_code == 200, response.text
    params = script.params[0]
    assert (params.max_tokens, params.temperature, params.top_k) == (7, 0.3, 5)
    assert (params.top_p, params.min_p, params.seed) == (0.9, 0.1, 42)
    assert params.repetition_penalty == 1.2
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, 0.25)
    assert response.json()["done_reason"] == "length" and response.json()["eval_count"] == 7


def test_generate_templates_system_and_prompt_and_returns_a_context_to_continue_from():
    script = Recorded("fine")
    with serve(script) as live:
        url = live.url + "/api/generate"
        first = httpx2.post(url, json={"model": MODEL, "prompt": "hello", "system": "Be brief.",
                                       "stream": False}, timeout=60).json()  # fmt: skip
        second = httpx2.post(url, json={"model": MODEL, "prompt": "again", "stream": False,
                                        "context": first["context"]}, timeout=60).json()  # fmt: skip
    assert first["response"] == "fine" and "Be brief." in script.prompt_text(0)
    assert first["context"] == [*script.prompts[0], *script.token_ids]
    assert script.prompts[1][: len(first["context"])] == first["context"]
    assert second["prompt_eval_count"] == len(script.prompts[1])


def test_raw_generate_sends_the_prompt_untemplated():
    script = Recorded("fine")
    with serve(script) as live:
        body = {"model": MODEL, "prompt": "[INST] hi [/INST]", "raw": True, "stream": False}
        response = httpx2.post(live.url + "/api/generate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert script.prompt_text().endswith("[INST] hi [/INST]")
    assert "<|user|>" not in script.prompt_text()


@pytest.mark.parametrize(
    "format_", ["json", {"type": "object", "properties": {"a": {"type": "integer"}}}]
)
def test_format_asks_for_a_structured_output(format_):
    script = Recorded('{"a": 1}')
    with serve(script) as live:
        body = chat_body(format=format_, stream=False)
        response = httpx2.post(live.url + "/api/chat", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert script.params[0].structured_output is not None


def test_a_request_with_nothing_to_generate_is_ollamas_load_call():
    with serve(Recorded(ANSWER)) as live:
        chat = httpx2.post(live.url + "/api/chat", json={"model": MODEL, "messages": []})
        generate = httpx2.post(live.url + "/api/generate", json={"model": MODEL + ":latest"})
        unknown = httpx2.post(live.url + "/api/generate", json={"model": "llama3"})
    assert chat.json()["done_reason"] == "load" and chat.json()["done"] is True
    assert (
        generate.json()["done_reason"] == "load" and generate.json()["model"] == MODEL + ":latest"
    )
    assert unknown.status_code == 404


BAD_BODIES = [
    ({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}, 404, "fake-model"),
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "model"),
    (chat_body(messages="hi"), 400, "messages"),
    (chat_body(messages=[{"role": "robot", "content": "hi"}]), 400, "messages[0].role"),
    (chat_body(messages=[{"role": "user", "content": "hi", "images": ["AAAA"]}]), 400,
     "messages[0].images"),
    (chat_body(options={"temperature": "hot"}), 400, "options.temperature"),
    (chat_body(options={"num_predict": 0}), 400, "options.num_predict"),
    (chat_body(options={"stop": [""]}), 400, "options.stop"),
    (chat_body(format="yaml"), 400, "format"),
    (chat_body(format={"type": "object", "$defs": 5}), 400, "format"),
    (chat_body(think=True), 400, "think"),
    (chat_body(think="extreme"), 400, "think"),
    (chat_body(tools=[{"type": "function", "function": {"name": "bad name"}}]), 400, "tools"),
    (chat_body(logprobs=True), 400, "logprobs"),
    (chat_body(keep_alive=[1]), 400, "keep_alive"),
    ({"model": MODEL, "prompt": "hi", "template": "{{ .Prompt }}"}, 400, "template"),
    ({"model": MODEL, "prompt": "hi", "images": ["AAAA"]}, 400, "images"),
    ({"model": MODEL, "prompt": "hi", "suffix": "end"}, 400, "suffix"),
    ({"model": MODEL, "prompt": "hi", "context": [10**9]}, 400, "context"),
    ({"model": MODEL, "prompt": "hi", "context": ["a"]}, 400, "context"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "named"), BAD_BODIES)
def test_bad_requests_are_ollama_errors_naming_the_field(body, status, named):
    path = "/api/generate" if "prompt" in body else "/api/chat"
    with serve(Recorded(ANSWER)) as live:
        response = httpx2.post(live.url + path, json=body, timeout=60)
    assert response.status_code == status, response.text
    error = response.json()
    assert set(error) == {"error"} and named in error["error"]


def test_model_info_routes_describe_the_served_model():
    with serve(Recorded(ANSWER), reasoning_parser="deepseek_r1") as live:
        tags = httpx2.get(live.url + "/api/tags").json()
        ps = httpx2.get(live.url + "/api/ps").json()
        show = httpx2.post(live.url + "/api/show", json={"model": MODEL}).json()
        show_old = httpx2.post(live.url + "/api/show", json={"name": MODEL + ":latest"})
        show_unknown = httpx2.post(live.url + "/api/show", json={"model": "llama3"})
        version = httpx2.get(live.url + "/api/version").json()
    assert [model["name"] for model in tags["models"]] == [MODEL]
    assert ps["models"][0]["context_length"] == 4096
    assert show["capabilities"] == ["completion", "tools", "thinking"]
    assert show["model_info"]["sluice.context_length"] == 4096
    assert show_old.status_code == 200 and show_unknown.status_code == 404
    assert version["version"].count(".") == 2


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/api/pull"), ("POST", "/api/push"), ("POST", "/api/create"),
     ("POST", "/api/copy"), ("DELETE", "/api/delete")],
)  # fmt: skip
def test_model_management_is_refused_saying_what_sluice_does_instead(method, path):
    with serve(Recorded(ANSWER)) as live:
        response = httpx2.request(method, live.url + path, json={"model": "llama3"})
    assert response.status_code == 400
    assert "sluice serve --model" in response.json()["error"]


def test_unknown_ollama_routes_are_ollama_404s_and_embed_needs_an_embedding_model():
    with serve(Recorded(ANSWER)) as live:
        response = httpx2.post(live.url + "/api/nothing", json={"model": MODEL})
        assert response.status_code == 404 and set(response.json()) == {"error"}
        # /api/embed is served by an embedding model (tests/test_apis_embeddings_routes.py).
        response = httpx2.post(live.url + "/api/embed", json={"model": MODEL, "input": "hi"})
        assert response.status_code == 400 and set(response.json()) == {"error"}
        assert "is a generation model" in response.json()["error"]
        wrong_method = httpx2.get(live.url + "/api/chat")
    assert wrong_method.status_code == 405 and set(wrong_method.json()) == {"error"}


def test_the_access_log_counts_a_streamed_answers_tokens(caplog):
    script = Recorded(ANSWER)
    with serve(script) as live, caplog.at_level(logging.INFO, logger="sluice.access"):
        httpx2.post(live.url + "/api/chat", json=chat_body(), timeout=60)
    logged = [
        record.getMessage() for record in caplog.records if "/api/chat" in record.getMessage()
    ]
    assert logged and f"completion_tokens={len(script.token_ids)}" in logged[-1]
