"""The app over a real socket: uvicorn on 127.0.0.1, the fake engine, raw clients.

`LiveServer` (sluice/testing/live_server.py, also used by the SDK, fuzz and
end-to-end modules) runs `create_app` under `make_server` in a background
thread on a free port.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import aiohttp
import httpx2
import orjson
import pytest

from sluice.errors import QueueFullError
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer


@pytest.fixture(scope="module")
def live():
    engine = LoopFakeEngine(tokens_per_step=2)
    with LiveServer(engine, ChatFakeTokenizer()) as server:
        yield server


@pytest.fixture(scope="module")
def http(live):
    with httpx2.Client(base_url=live.url, timeout=10) as client:
        yield client


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def completion(http, **fields):
    return http.post("/v1/completions", json={"model": MODEL, "prompt": "hello", **fields})


def chat(http, **fields):
    messages = [{"role": "user", "content": "hello"}]
    return http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, **fields})


# -- endpoint shapes ---------------------------------------------------------------


def test_models_lists_the_served_model(http):
    body = http.get("/v1/models").json()
    assert body["object"] == "list"
    (card,) = body["data"]
    assert card["id"] == MODEL and card["root"] == MODEL
    assert card["object"] == "model" and card["owned_by"] == "sluice"
    assert card["max_model_len"] == 4096 and isinstance(card["created"], int)


def test_health_and_version_answer(http):
    assert http.get("/health").status_code == 200
    assert isinstance(http.get("/version").json()["version"], str)


def test_a_completion_has_the_openai_shape_and_usage(http):
    response = completion(http, max_tokens=4)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert body["id"].startswith("cmpl-")
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4


def test_a_chat_completion_has_the_openai_shape(http):
    body = chat(http, max_tokens=3).json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 3


def test_the_response_echoes_a_request_id(http):
    response = http.get("/health", headers={"X-Request-Id": "trace-7"})
    assert response.headers["x-request-id"] == "trace-7"


def test_tokenize_a_prompt_and_detokenize_it_back(http, live):
    body = http.post("/tokenize", json={"prompt": "hello world"}).json()
    assert body["tokens"] == live.tokenizer.encode("hello world", add_special_tokens=True)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 4096
    back = http.post("/detokenize", json={"tokens": body["tokens"]}).json()
    assert back == {"prompt": live.tokenizer.decode(body["tokens"], False)}


def test_tokenize_messages_applies_the_chat_template(http, live):
    messages = [{"role": "user", "content": "hi"}]
    body = http.post("/tokenize", json={"messages": messages, "return_token_strs": True}).json()
    text = live.tokenizer.apply_chat_template(messages, True)
    assert body["tokens"] == live.tokenizer.encode(text)
    assert body["token_strs"] == live.tokenizer.convert_ids_to_tokens(body["tokens"])
    plain = http.post("/tokenize", json={"messages": messages, "add_generation_prompt": False})
    assert plain.json()["count"] < body["count"]


def test_metrics_expose_request_counters_and_histograms(http):
    completion(http, max_tokens=2)
    response = http.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for name in (
        "sluice:prompt_tokens_total", "sluice:generation_tokens_total",
        "sluice:time_to_first_token_seconds_bucket", "sluice:inter_token_latency_seconds",
        "sluice:e2e_request_latency_seconds_bucket", "sluice:chunks_sent_total",
        "sluice:tokens_per_chunk_bucket", "sluice:request_aborted_total",
    ):  # fmt: skip
        assert name in text


# -- request fields ----------------------------------------------------------------

COMPLETION_VALUES = {
    "best_of": 1, "echo": True, "frequency_penalty": 0.5, "logit_bias": {"5": 1.0},
    "logprobs": None, "max_tokens": 3, "n": 1, "presence_penalty": -0.5, "seed": 7,
    "stop": ["STOP"], "stream": False, "temperature": 0.7, "top_p": 0.9, "user": "u",
    "top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": True,
    "min_tokens": 1, "stop_token_ids": [1], "include_stop_str_in_output": True,
    "skip_special_tokens": False, "spaces_between_special_tokens": False,
    "add_special_tokens": False, "suffix": None,
}  # fmt: skip
CHAT_VALUES = {
    "frequency_penalty": 0.5, "logit_bias": {"5": -1}, "logprobs": True, "top_logprobs": 2,
    "max_tokens": 9, "max_completion_tokens": 3, "n": 2, "presence_penalty": 0.1,
    "response_format": {"type": "text"}, "seed": 3, "stop": "STOP", "stream": False,
    "temperature": 0.0, "top_p": 1.0, "user": "u", "top_k": -1, "min_p": 0.0,
    "repetition_penalty": 1.0, "ignore_eos": False, "min_tokens": 0, "stop_token_ids": [],
    "include_stop_str_in_output": False, "skip_special_tokens": True,
    "spaces_between_special_tokens": True, "add_generation_prompt": True,
    "add_special_tokens": False,
}  # fmt: skip


def test_every_completion_field_is_accepted_with_a_value_and_with_null(http):
    assert completion(http, **COMPLETION_VALUES).status_code == 200
    nulls = dict.fromkeys(COMPLETION_VALUES) | {"model": None}
    assert completion(http, **nulls).status_code == 200


def test_every_chat_field_is_accepted_with_a_value_and_with_null(http):
    response = chat(http, **CHAT_VALUES)
    assert response.status_code == 200
    choices = response.json()["choices"]
    assert len(choices) == 2 and choices[0]["logprobs"]["content"]
    nulls = dict.fromkeys(CHAT_VALUES) | {"model": None}
    assert chat(http, **nulls).status_code == 200


def test_unknown_fields_are_ignored(http):
    assert completion(http, frobnicate={"x": [1]}, max_tokens=1).status_code == 200
    assert chat(http, tools=None, metadata={"a": "b"}, max_tokens=1).status_code == 200


def test_prompts_may_be_lists_of_strings_ids_and_id_lists(http, live):
    ids = live.tokenizer.encode("hello")
    for prompt in (["hello", "world"], ids, [ids, ids]):
        body = completion(http, prompt=prompt, max_tokens=2).json()
        assert len(body["choices"]) == (1 if prompt is ids else 2)


def test_text_content_parts_are_accepted(http):
    messages = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert chat(http, messages=messages, max_tokens=1).status_code == 200


# -- errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"n": 0}, "n"),
        ({"logprobs": 30}, "logprobs"),
        ({"suffix": "!"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": 12.5}, "prompt"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"logit_bias": {"99999": 1}}, "logit_bias"),
        ({"logit_bias": {"\u00b2": 1}}, "logit_bias"),  # "²": isdigit() but not int()
        ({"stop": ["x" * 1025]}, "stop"),
        ({"max_tokens": 5000}, "max_tokens"),
        ({"prompt": None}, "prompt"),
    ],
)
def test_completion_errors_are_400_naming_the_param(http, fields, param):
    response = completion(http, **fields)
    assert response.status_code == 400
    assert error_of(response)["param"] == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content[0].type"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": []}, "messages"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ],
)  # fmt: skip
def test_chat_errors_are_400_naming_the_param(http, fields, param):
    response = chat(http, **fields)
    assert response.status_code == 400
    assert error_of(response)["param"] == param


def test_a_context_overflow_names_both_numbers(http):
    error = error_of(completion(http, prompt="hello " * 10, max_tokens=4090))
    assert "4096" in error["message"] and "4090" in error["message"]
    assert error["code"] == "context_length_exceeded"


def test_an_unknown_model_is_a_404(http):
    response = completion(http, model="gpt-4o")
    assert response.status_code == 404
    assert error_of(response)["param"] == "model"


def test_malformed_json_is_400_and_a_wrong_content_type_415_never_422(http):
    bad_json = http.post(
        "/v1/completions", content=b"{", headers={"Content-Type": "application/json"}
    )
    assert bad_json.status_code == 400 and error_of(bad_json)["type"] == "invalid_request_error"
    form = http.post("/v1/completions", data={"prompt": "hi"})
    assert form.status_code == 415 and "Content-Type" in error_of(form)["message"]
    array = http.post("/v1/chat/completions", json=[1, 2])
    assert array.status_code == 400


def test_unknown_routes_and_methods_answer_in_the_openai_shape(http):
    assert error_of(http.get("/v1/nothing"))["type"] == "not_found_error"
    assert http.get("/v1/completions").status_code == 405


def test_api_keys_are_enforced_except_on_probes():
    server = LiveServer(LoopFakeEngine(), ChatFakeTokenizer(), api_key="sesame")
    with server as live, httpx2.Client(base_url=live.url) as client:
        assert client.get("/v1/models").status_code == 401
        wrong = client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert error_of(wrong)["type"] == "authentication_error"
        right = client.get("/v1/models", headers={"Authorization": "Bearer sesame"})
        assert right.status_code == 200
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200
        assert client.post("/reset_prefix_cache").status_code == 401


def test_reset_prefix_cache_reaches_the_engine():
    engine = LoopFakeEngine()
    with (
        LiveServer(engine, ChatFakeTokenizer()) as live,
        httpx2.Client(base_url=live.url) as client,
    ):
        assert client.post("/reset_prefix_cache").status_code == 200
        assert engine.num_prefix_cache_resets == 1
        assert client.get("/reset_prefix_cache").status_code == 405


def test_a_dead_engine_means_503_with_retry_after_until_it_is_back():
    engine = LoopFakeEngine()
    with (
        LiveServer(engine, ChatFakeTokenizer()) as live,
        httpx2.Client(base_url=live.url) as client,
    ):
        engine.die_threadsafe()
        assert client.get("/health").status_code == 503
        for response in (completion(client), completion(client, stream=True), chat(client)):
            assert response.status_code == 503
            assert response.headers["retry-after"] == "1"
            assert error_of(response)["type"] == "service_unavailable"
        engine.revive_threadsafe()
        assert client.get("/health").status_code == 200


class FullFakeEngine(LoopFakeEngine):
    def add_request(self, request, sink) -> None:
        raise QueueFullError("the waiting queue is full")


def test_a_full_queue_means_503_before_any_stream_starts():
    with (
        LiveServer(FullFakeEngine(), ChatFakeTokenizer()) as live,
        httpx2.Client(base_url=live.url) as client,
    ):
        for response in (completion(client, stream=True), chat(client, stream=True), chat(client)):
            assert response.status_code == 503
            assert response.headers["content-type"] == "application/json"
            assert response.headers["retry-after"] == "1"
            assert "queue is full" in error_of(response)["message"]


# -- streaming over a raw socket ----------------------------------------------------


async def raw_stream(url: str, path: str, body: dict) -> tuple[aiohttp.ClientResponse, bytes]:
    async with aiohttp.ClientSession() as session, session.post(url + path, json=body) as response:
        raw = await response.content.read()
        assert response.content.at_eof()
        return response, raw


def split_events(raw: bytes) -> list[bytes]:
    assert raw.endswith(b"\n\n") and b"\r" not in raw
    events = raw[:-2].split(b"\n\n")
    assert all(event.startswith(b"data: ") and b"\n" not in event for event in events)
    return [event[len(b"data: ") :] for event in events]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streams_are_framed_exactly_and_end_with_done(live, path, caplog):
    caplog.set_level(logging.INFO, logger="sluice.access")
    body = {"model": MODEL, "stream": True, "max_tokens": 5, "n": 2,
            "stream_options": {"include_usage": True}}  # fmt: skip
    body |= (
        {"prompt": "hello"}
        if "chat" not in path
        else {"messages": [{"role": "user", "content": "hi"}]}
    )
    response, raw = asyncio.run(raw_stream(live.url, path, body))
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    payloads = split_events(raw)
    assert payloads[-1] == b"[DONE]" and payloads.count(b"[DONE]") == 1
    chunks = [orjson.loads(p) for p in payloads[:-1]]
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10
    # The access log has the usage's count of delivered tokens (the server
    # thread writes it just after the last byte: give it a moment).
    asyncio.run(
        wait_until(lambda: any("completion_tokens=10 " in r.getMessage() for r in caplog.records))
    )


def test_a_stream_carries_the_same_text_as_the_non_streamed_response(http, live):
    request = {"model": MODEL, "prompt": "hello world", "max_tokens": 7, "temperature": 0}
    full = http.post("/v1/completions", json=request).json()["choices"][0]["text"]
    _, raw = asyncio.run(raw_stream(live.url, "/v1/completions", request | {"stream": True}))
    chunks = [orjson.loads(p) for p in split_events(raw)[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == full


# -- disconnects abort the engine request -------------------------------------------


async def wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_closing_a_stream_mid_way_aborts_its_engine_request():
    engine = LoopFakeEngine(step_interval_s=0.01)
    body = {"model": MODEL, "prompt": "hello", "stream": True, "max_tokens": 4000}

    async def go() -> str:
        async with aiohttp.ClientSession() as session:
            response = await session.post(live.url + "/v1/completions", json=body)
            first = await response.content.readuntil(b"\n\n")
            await response.content.readuntil(b"\n\n")
            response.close()  # drops the connection mid-stream
        request_id = orjson.loads(first[len(b"data: ") :])["id"] + "-0"
        await asyncio.to_thread(engine.wait_until, lambda: request_id in engine.aborted_request_ids)
        return request_id

    with LiveServer(engine, ChatFakeTokenizer()) as live:
        request_id = asyncio.run(go())
    assert len(engine.outputs[request_id]) < 4000


def test_a_client_leaving_a_non_streamed_request_aborts_it():
    engine = LoopFakeEngine(step_interval_s=0.01)
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 4000}

    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(asyncio.TimeoutError):
                timeout = aiohttp.ClientTimeout(total=0.3)
                await session.post(live.url + "/v1/completions", json=body, timeout=timeout)
        await asyncio.to_thread(engine.wait_until, lambda: last_added_was_aborted(engine))

    with LiveServer(engine, ChatFakeTokenizer()) as live:
        asyncio.run(go())
    assert len(engine.outputs[engine.added_request_ids[-1]]) < 4000


def test_a_client_leaving_before_the_first_token_aborts_the_stream(caplog):
    caplog.set_level(logging.INFO, logger="sluice.access")
    # A long "prefill": no event exists yet when the client gives up.
    engine = LoopFakeEngine(step_interval_s=0.01, prefill_steps=10_000)
    body = {"model": MODEL, "prompt": "hello", "stream": True, "max_tokens": 5}

    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(asyncio.TimeoutError):
                timeout = aiohttp.ClientTimeout(total=0.3)
                await session.post(live.url + "/v1/completions", json=body, timeout=timeout)
        await asyncio.to_thread(engine.wait_until, lambda: last_added_was_aborted(engine))

    with LiveServer(engine, ChatFakeTokenizer()) as live:
        asyncio.run(go())
    assert engine.outputs[engine.added_request_ids[-1]] == []
    lines = [r.getMessage() for r in caplog.records if r.name == "sluice.access"]
    assert any('"POST /v1/completions" 499' in line for line in lines)


def last_added_was_aborted(engine: LoopFakeEngine) -> bool:
    return (
        bool(engine.added_request_ids)
        and engine.added_request_ids[-1:] == (engine.aborted_request_ids[-1:])
    )


class BlockingTemplateTokenizer(ChatFakeTokenizer):
    """Rendering a large conversation blocks until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.is_rendering = threading.Event()
        self.release = threading.Event()

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        if sum(len(m["content"]) for m in messages) > 8192:
            self.is_rendering.set()
            assert self.release.wait(30), "the test never released the template"
        return super().apply_chat_template(messages[-1:], add_generation_prompt)


def test_a_huge_conversation_does_not_stall_other_requests():
    """/health answers while a conversation's template is still rendering: the
    render runs off the loop (if it ran on it, /health would wait for it)."""
    big = [{"role": "user", "content": "x" * 10_000}, {"role": "user", "content": "hi"}]
    tokenizer = BlockingTemplateTokenizer()

    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            url = live.url + "/v1/chat/completions"
            slow = asyncio.create_task(
                session.post(url, json={"model": MODEL, "messages": big, "max_tokens": 1})
            )
            assert await asyncio.to_thread(tokenizer.is_rendering.wait, 30)
            # Answered while the render is blocked (only this test releases it).
            async with session.get(live.url + "/health") as health:
                assert health.status == 200
            tokenizer.release.set()
            assert (await slow).status == 200

    with LiveServer(LoopFakeEngine(), tokenizer) as live:
        try:
            asyncio.run(asyncio.wait_for(go(), 60))
        finally:
            tokenizer.release.set()


# -- the real chat template -----------------------------------------------------------


def test_the_embedded_tokenizers_chat_template_shapes_the_prompt(embedded_tokenizer):
    engine = LoopFakeEngine()
    server = LiveServer(engine, embedded_tokenizer, max_model_len=2048)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    with server as live, httpx2.Client(base_url=live.url) as client:
        response = chat(client, messages=messages, max_tokens=3)
        counted = client.post("/tokenize", json={"messages": messages}).json()
    assert response.status_code == 200
    assert response.json()["usage"]["prompt_tokens"] == counted["count"]
    text = embedded_tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert counted["tokens"] == embedded_tokenizer.encode(text)
