"""Request bodies: the size limit (413), the message-count limit, and the worker
path for large bodies giving exactly what the event-loop path gives."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import sys

import httpx2
import orjson
import pytest
from pydantic import BaseModel
from starlette.requests import Request

from sluice.apis import openai_request
from sluice.apis.chat import protocol as chat_protocol
from sluice.apis.chat import to_internal as chat_to_internal
from sluice.apis.completions import protocol as completions_protocol
from sluice.apis.completions import to_internal as completions_to_internal
from sluice.config import RequestLimits
from sluice.errors import InvalidRequestError, RequestError, RequestTooLargeError
from sluice.frontend.preprocess import Preprocessor
from sluice.server.body import body as body_module
from sluice.server.body.body import HUGE_BODY_BYTES, BodyReader, release_in_pieces
from sluice.testing import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer

MODEL = "fake-model"
MAX_MODEL_LEN = 4096
LIMITS = RequestLimits(max_request_body_bytes=1000, max_chat_messages=5)


class ThreadNotingTokenizer(ChatFakeTokenizer):
    """The fake chat tokenizer, noting where it works: on an event loop or in a worker."""

    def __init__(self):
        super().__init__()
        self.threads: set[str] = set()

    def _note_thread(self) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.threads.add("worker")
        else:
            self.threads.add("event loop")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self._note_thread()
        return super().encode(text, add_special_tokens)

    def decode(self, ids, skip_special_tokens: bool = True, **options) -> str:
        self._note_thread()
        return super().decode(ids, skip_special_tokens, **options)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, **extra) -> str:
        self._note_thread()
        if any(message["role"] == "tool" for message in messages):
            raise InvalidRequestError("this template takes no tool turns", param="messages")
        return super().apply_chat_template(messages, add_generation_prompt, **extra)


def reader(tokenizer, offload_threshold_bytes: int, limits: RequestLimits = LIMITS) -> BodyReader:
    options = openai_request.RequestOptions(MODEL, Preprocessor(tokenizer, MAX_MODEL_LEN), limits)
    return BodyReader(limits, options, offload_threshold_bytes)


def request_of(
    body: bytes, *, chunked: bool = False, declared_length: int | None = None
) -> Request:
    """A POST carrying `body` in 100-byte messages, with Content-Length unless `chunked`."""
    headers = [(b"content-type", b"application/json")]
    if not chunked:
        length = len(body) if declared_length is None else declared_length
        headers.append((b"content-length", str(length).encode()))
    pieces = [body[start : start + 100] for start in range(0, len(body), 100)] or [b""]
    messages = iter(
        {"type": "http.request", "body": piece, "more_body": index < len(pieces) - 1}
        for index, piece in enumerate(pieces)
    )

    async def receive():
        return next(messages)

    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers}, receive)


def never_read() -> Request:
    async def receive():
        raise AssertionError("the body was read")

    headers = [(b"content-type", b"application/json"), (b"content-length", b"1001")]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers}, receive)


# -- the size limit ---------------------------------------------------------------------


def test_a_declared_length_over_the_limit_is_a_413_before_a_byte_is_read():
    with pytest.raises(RequestTooLargeError) as info:
        asyncio.run(
            reader(ChatFakeTokenizer(), 0).parse(
                never_read(), completions_protocol.CompletionRequest
            )
        )
    error = info.value
    assert error.status_code == 413 and error.code == "request_too_large"
    assert "limit of 1000 bytes" in error.message


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "lying Content-Length"])
def test_a_body_longer_than_the_limit_is_cut_at_the_limit(chunked):
    body = orjson.dumps({"prompt": "x" * 1000})
    request = request_of(body, chunked=chunked, declared_length=None if chunked else 10)
    with pytest.raises(RequestTooLargeError):
        asyncio.run(
            reader(ChatFakeTokenizer(), 0).parse(request, completions_protocol.CompletionRequest)
        )


@pytest.mark.parametrize("chunked", [True, False])
def test_a_body_of_exactly_the_limit_is_read(chunked):
    body = orjson.dumps({"prompt": "hi"}).ljust(LIMITS.max_request_body_bytes)
    for threshold in (0, 10_000):
        parsed = asyncio.run(
            reader(ChatFakeTokenizer(), threshold).parse(
                request_of(body, chunked=chunked), completions_protocol.CompletionRequest
            )
        )
        assert parsed.value.prompt == "hi" and parsed.num_bytes == len(body)


def test_the_413_reaches_the_client_in_the_openai_format():
    async def post_declaring(url: str, length: int) -> tuple[bytes, dict]:
        host, port = url.removeprefix("http://").split(":")
        reader_, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % length
        )
        await writer.drain()
        # The answer comes without a byte of the body sent.
        status_line = await reader_.readline()
        head = await reader_.readuntil(b"\r\n\r\n")
        length_line = next(
            h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
        )
        body = await reader_.readexactly(int(length_line.split(b":")[1]))
        writer.close()
        return status_line, orjson.loads(body)

    with LiveServer(FakeEngine(), ChatFakeTokenizer(), limits=LIMITS) as live:
        status_line, body = asyncio.run(asyncio.wait_for(post_declaring(live.url, 10**12), 30))
    assert status_line.split()[1] == b"413"
    assert body == {
        "error": {
            "message": "the request body is longer than this server's limit of 1000 bytes",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
    }


# -- the message-count limit ------------------------------------------------------------


@pytest.mark.parametrize("threshold", [0, 10_000], ids=["worker", "loop"])
def test_more_chat_messages_than_the_limit_is_a_400_naming_it(threshold):
    def parse(num_messages: int, model=chat_protocol.ChatCompletionRequest):
        body = orjson.dumps({"messages": [{"role": "user", "content": "hi"}] * num_messages})
        return asyncio.run(reader(ChatFakeTokenizer(), threshold).parse(request_of(body), model))

    assert len(parse(5).value.messages) == 5
    for model in (chat_protocol.ChatCompletionRequest, chat_protocol.TokenizeRequest):
        with pytest.raises(InvalidRequestError) as info:
            parse(6, model)
        assert info.value.param == "messages"
        assert info.value.message == "messages: 6, more than this server's limit of 5"
    # A body whose model has no messages ignores the field, as pydantic does.
    assert parse(6, completions_protocol.CompletionRequest).value.prompt is None


# -- the worker path gives what the loop path gives ---------------------------------------

SAME_BODIES = [
    {"prompt": "hello world", "max_tokens": 5, "stop": ["x"], "logit_bias": {"7": 1.5}},
    {"prompt": [[5, 6, 7]] * 3 + [[8] * 40], "n": 2, "echo": True, "seed": 3},
    {"prompt": ["a", "b c"], "stream": True, "stream_options": {"include_usage": True}},
    {"prompt": list(range(10, 300)), "max_tokens": 3, "temperature": 0.5},
    {"messages": [{"role": "system", "content": "be brief"}]
     + [{"role": "user", "content": [{"type": "text", "text": "part"}] * 30}] * 4,
     "max_completion_tokens": 7, "logprobs": True, "top_logprobs": 2},
    {"messages": [{"role": "user", "content": "hi", "name": "ann"}] * 5, "n": 3},
    # Refused, the same way on both paths.
    {"prompt": [5, -1]},
    {"prompt": list(range(10, 300)), "max_tokens": 4000},
    {"prompt": [[1, 2]] * 3, "best_of": 2},
    {"messages": [{"role": "user", "content": "hi"}] * 6},
    {"messages": [{"role": "user", "content": "hi"}], "temperature": 9},
    {"messages": [{"role": "tool", "content": "42"}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
    {"model": "other", "prompt": "hi"},
    # Grammars are compiled inline in the worker.
    {"prompt": "hi", "guided_json": {"type": "object"}},
    {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}},
    {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required",
     "tools": [{"type": "function", "function": {"name": "f"}}]},
    {"prompt": "hi", "structured_outputs": {"regex": "a(b"}},
]  # fmt: skip


def outcome(reader_: BodyReader, body: dict):
    """What a route makes of `body`: its request (id and time aside) or its error."""
    model = (
        chat_protocol.ChatCompletionRequest
        if "messages" in body
        else completions_protocol.CompletionRequest
    )
    convert = (
        chat_to_internal.chat_request
        if "messages" in body
        else completions_to_internal.completion_request
    )

    async def go():
        parsed = await reader_.parse(request_of(orjson.dumps(body)), model)
        return await reader_.convert(parsed, convert)

    try:
        generation = asyncio.run(go())
    except RequestError as exc:
        return type(exc), exc.message, exc.param, exc.code
    return dataclasses.replace(generation, response_id="", created=0)


@pytest.mark.parametrize("body", SAME_BODIES)
def test_a_request_through_the_worker_is_what_it_is_on_the_loop(body):
    on_loop, in_worker = ThreadNotingTokenizer(), ThreadNotingTokenizer()
    expected = outcome(reader(on_loop, offload_threshold_bytes=10**6), body)
    got = outcome(reader(in_worker, offload_threshold_bytes=0), body)
    assert got == expected
    assert on_loop.threads <= {"event loop"} and in_worker.threads <= {"worker"}


# -- grammars on the worker path -----------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}
# 9,000 characters (1,500 tokens): a body over OFFLOAD_THRESHOLD_BYTES.
BIG_TEXT = " hello" * 1500
GRAMMAR_FIELDS = [
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "A", "schema": SCHEMA}}},
    {"structured_outputs": {"json": SCHEMA}},
    {"structured_outputs": {"choice": ["yes", "no"]}},
    {"guided_json": SCHEMA},
    {"guided_regex": "[0-9]+"},
    {"guided_grammar": 'start: "a"+'},
]
TOOL_CHOICES = [
    {"tools": [TOOL], "tool_choice": "required"},
    {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
]
BIG_GRAMMAR_BODIES = [
    *[("/v1/chat/completions", {"messages": [{"role": "user", "content": BIG_TEXT}], **fields})
      for fields in GRAMMAR_FIELDS + TOOL_CHOICES],
    *[("/v1/completions", {"prompt": BIG_TEXT, **fields}) for fields in GRAMMAR_FIELDS],
]  # fmt: skip


@pytest.fixture(scope="module")
def grammar_server():
    """A live server on the fake engine; the params of every request it got."""
    seen = []

    def script(request_id, prompt, params):
        seen.append(params)
        return [ord(c) for c in '{"a": 1}']

    with (
        LiveServer(FakeEngine(script), ChatFakeTokenizer()) as live,
        httpx2.Client(base_url=live.url, timeout=30) as http,
    ):
        yield http, seen


@pytest.mark.parametrize(("path", "body"), BIG_GRAMMAR_BODIES)
def test_a_large_body_with_a_grammar_is_compiled_in_its_worker(grammar_server, path, body):
    http, seen = grammar_server
    raw = orjson.dumps({"model": MODEL, "max_tokens": 8, **body})
    assert len(raw) > body_module.OFFLOAD_THRESHOLD_BYTES
    response = http.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    assert seen[-1].structured_output is not None


def test_a_large_body_with_a_bad_grammar_is_a_400_naming_its_field(grammar_server):
    http, _ = grammar_server
    body = {"model": MODEL, "prompt": BIG_TEXT, "guided_regex": "a(b"}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "guided_regex"


def test_tokenize_and_detokenize_take_the_worker_path_too():
    tokenizer = ThreadNotingTokenizer()
    with LiveServer(FakeEngine(), tokenizer) as live:
        live.app.state.routes.bodies.offload_threshold_bytes = 0
        with httpx2.Client(base_url=live.url) as http:
            tokens = http.post("/tokenize", json={"prompt": "hello", "return_token_strs": True})
            text = http.post("/detokenize", json={"tokens": tokens.json()["tokens"]})
            chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
    assert tokens.status_code == 200 and tokens.json()["count"] == len(tokens.json()["tokens"])
    assert tokens.json()["token_strs"] == ["<s>", "hello"]
    assert text.json() == {"prompt": "<s> hello"}
    assert chat.status_code == 200 and chat.json()["count"] > 0
    assert tokenizer.threads == {"worker"}


# -- worker mechanics ---------------------------------------------------------------------


class Part(BaseModel):
    items: list[int]


def test_release_in_pieces_empties_every_list_dict_and_model(monkeypatch):
    monkeypatch.setattr(body_module, "RELEASE_PIECE_ITEMS", 3)
    inner = [1, 2, 3, 4, 5, 6, 7]
    nested = {"a": [inner, {"b": [8, 9]}], "c": "text"}
    model = Part(items=list(range(10)))
    value = [nested, model, 4, "x", [[]] * 5]
    release_in_pieces(value)
    assert value == [] and nested == {} and inner == [] and model.items == []


def test_a_conversion_that_suspends_is_a_bug_not_a_hang():
    async def suspends():
        await asyncio.sleep(0)

    with pytest.raises(AssertionError, match="must run inline"):
        body_module._run_inline(suspends())


def test_workers_set_the_switch_interval_and_huge_ones_pause_the_collector():
    switch_interval_s = sys.getswitchinterval()
    fast_switch_s = pytest.approx(min(body_module.WORKER_SWITCH_INTERVAL_S, switch_interval_s))
    settings = body_module._WORKER_SETTINGS
    gc_was_enabled = gc.isenabled()

    def state():
        return gc.isenabled(), sys.getswitchinterval()

    gc.enable()
    try:
        with settings.applied(pause_collector=False):
            assert state() == (True, fast_switch_s)
            with settings.applied(pause_collector=True):
                assert state() == (False, fast_switch_s)
            assert state() == (True, fast_switch_s)
        assert state() == (True, switch_interval_s)
        gc.disable()
        assert body_module._in_worker(True, state) == (False, fast_switch_s)
        assert not gc.isenabled(), "a collector that was off stays off"
    finally:
        if gc_was_enabled:
            gc.enable()


def test_bodies_take_the_loop_or_one_of_two_worker_lanes():
    bodies = reader(ChatFakeTokenizer(), offload_threshold_bytes=100)
    lanes = [
        bodies._lane(num_bytes) for num_bytes in (100, 101, HUGE_BODY_BYTES, HUGE_BODY_BYTES + 1)
    ]
    assert lanes[0] is None and lanes[1] is lanes[2] is not None
    assert lanes[3] is not None and lanes[3] is not lanes[2]


def test_a_large_body_keeps_the_json_its_any_typed_fields_hold():
    # A tool's parameters are typed Any: the model holds the parsed JSON's own
    # dicts, which releasing the parsed body emptied ("properties": {}).
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    body = {"messages": [{"role": "user", "content": "x" * 9000}], "tools": [tool]}
    model = body_module._parse([orjson.dumps(body)], chat_protocol.ChatCompletionRequest,
                               RequestLimits())  # fmt: skip
    assert model.tools[0].function.parameters == parameters
