"""Structured-output fields of a request -> one checked StructuredOutputSpec:
every form read, one constraint per request, and a bad schema, regex or
grammar is a 400 in OpenAI format naming the field, before the engine sees it."""

from __future__ import annotations

import asyncio
import json

import httpx2
import pytest

from sluice.apis.chat.protocol import ChatCompletionRequest
from sluice.apis.chat.to_internal import chat_request
from sluice.apis.completions.protocol import CompletionRequest
from sluice.apis.completions.to_internal import completion_request
from sluice.apis.openai_request import RequestOptions
from sluice.errors import InvalidRequestError
from sluice.frontend.preprocess import Preprocessor
from sluice.server.body.limits import MAX_JSON_DEPTH
from sluice.structured import StructuredOutputSpec as Spec
from sluice.testing.contract import parse_sse
from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer

OPTIONS = RequestOptions(MODEL, Preprocessor(ChatFakeTokenizer(), 4096))
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
MESSAGES = [{"role": "user", "content": "hi"}]


def chat_spec(**fields) -> Spec | None:
    body = ChatCompletionRequest.model_validate({"messages": MESSAGES, **fields})
    return asyncio.run(chat_request(body, OPTIONS)).params.structured_output


def completion_spec(**fields) -> Spec | None:
    body = CompletionRequest.model_validate({"prompt": "hi", **fields})
    return asyncio.run(completion_request(body, OPTIONS)).params.structured_output


def chat_refusal(**fields) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as error:
        chat_spec(**fields)
    return error.value


JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "A", "schema": SCHEMA}}


@pytest.mark.parametrize(
    ("fields", "spec"),
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, Spec.json_object()),
        ({"response_format": JSON_SCHEMA_FORMAT}, Spec.json_schema(SCHEMA)),
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "A", "schema": SCHEMA, "strict": True}}}, Spec.json_schema(SCHEMA)),
        ({"structured_outputs": {"json": SCHEMA}}, Spec.json_schema(SCHEMA)),
        ({"structured_outputs": {"regex": "[0-9]+"}}, Spec.regex("[0-9]+")),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, Spec.choice(["yes", "no"])),
        ({"structured_outputs": {"grammar": 'start: "a"+'}}, Spec.grammar('start: "a"+')),
        ({"structured_outputs": {"json_object": True}}, Spec.json_object()),
        ({"guided_json": SCHEMA}, Spec.json_schema(SCHEMA)),
        ({"guided_json": '{"type": "object", "properties": {"a": {"type": "integer"}}, '
                         '"required": ["a"]}'}, Spec.json_schema(SCHEMA)),
        ({"guided_regex": "[0-9]+"}, Spec.regex("[0-9]+")),
        ({"guided_choice": ["yes", "no"]}, Spec.choice(["yes", "no"])),
        ({"guided_grammar": 'root ::= "yes" | "no"'}, Spec.grammar('root ::= "yes" | "no"')),
    ],
)  # fmt: skip
def test_each_form_becomes_its_spec_in_both_endpoints(fields, spec):
    assert chat_spec(**fields) == spec
    assert completion_spec(**fields) == spec


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "A", "schema": {"type": "frobnicate"}}}},
         "response_format.json_schema.schema", "frobnicate"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "A", "schema": {
            "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}},
         "response_format.json_schema.schema", "missing"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "A"}}},
         "response_format.json_schema.schema", "required"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "required"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "xml"),
        ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex", "unclosed group"),
        ({"structured_outputs": {"grammar": "start: nowhere"}}, "structured_outputs.grammar",
         "nowhere"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "empty"),
        ({"guided_json": "{not json"}, "guided_json", "JSON"),
        ({"guided_json": "[1, 2]"}, "guided_json", "object"),
        ({"guided_regex": "[z-a]"}, "guided_regex", "regex"),
        ({"guided_grammar": "root ::= ((("}, "guided_grammar", "GBNF"),
    ],
)  # fmt: skip
def test_a_bad_constraint_is_refused_naming_its_field(fields, param, words):
    error = chat_refusal(**fields)
    assert error.param == param
    assert words in error.message


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
        ({"guided_json": SCHEMA, "guided_choice": ["a"]}, "guided_choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice"),
        ({"response_format": JSON_SCHEMA_FORMAT, "structured_outputs": {"json_object": True}},
         "structured_outputs.json_object"),
    ],
)  # fmt: skip
def test_a_second_constraint_is_refused_naming_it(fields, param):
    error = chat_refusal(**fields)
    assert error.param == param
    assert "one structured output constraint" in error.message


def test_text_response_format_goes_with_another_form():
    fields = {"response_format": {"type": "text"}, "guided_regex": "a+"}
    assert chat_spec(**fields) == Spec.regex("a+")


def test_a_schema_keeps_its_key_order_which_is_the_order_of_the_output_keys():
    schema = {"type": "object", "properties": {"zeta": {}, "alpha": {}}}
    assert chat_spec(guided_json=schema).value.index("zeta") < chat_spec(
        guided_json=schema
    ).value.index("alpha")


# -- over HTTP ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served():
    """A live server on the fake engine; the params of every request it got."""
    seen = []

    def script(request_id, prompt, params):
        seen.append(params)
        return [ord(c) for c in '{"a": 1}']

    engine = LoopFakeEngine(script=script)
    with (
        LiveServer(engine, ChatFakeTokenizer()) as server,
        httpx2.Client(base_url=server.url, timeout=10) as http,
    ):
        yield http, seen


def test_a_bad_schema_is_a_400_in_openai_format_naming_the_field(served):
    http, seen = served
    before = len(seen)
    body = {"model": MODEL, "messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "A", "schema": {"type": 7}}}}  # fmt: skip
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "response_format.json_schema.schema"
    assert error["type"] == "invalid_request_error"
    assert len(seen) == before  # the engine never saw it


def test_a_good_constraint_reaches_the_engine_in_the_sampling_params(served):
    http, seen = served
    body = {"model": MODEL, "prompt": "hi", "structured_outputs": {"regex": "[0-9]+"}}
    assert http.post("/v1/completions", json=body).status_code == 200
    assert seen[-1].structured_output == Spec.regex("[0-9]+")


# A schema nested 1,000 deep, as JSON text (json.dumps takes a few hundred levels).
DEEP_SCHEMA = '{"type": "object", "x": ' + "[" * 999 + "]" * 999 + "}"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "A",
          "schema": "<deep>"}}}, "response_format.json_schema.schema"),
        ({"structured_outputs": {"json": "<deep>"}}, "structured_outputs.json"),
        ({"guided_json": "<deep>"}, "guided_json"),
        ({"guided_json": DEEP_SCHEMA}, "guided_json"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "A",
          "schema": {"type": "object", "$defs": "A"}}}},
         "response_format.json_schema.schema.$defs"),
        ({"guided_json": {"type": "object", "definitions": [{"type": "integer"}]}},
         "guided_json.definitions"),
    ],
)  # fmt: skip
def test_a_schema_too_deep_or_with_odd_definitions_is_a_400_naming_it(served, fields, param):
    """Nested 1,000 deep, a schema was a RecursionError (msgspec encoding it): a 500."""
    http, _ = served
    for path, prompt in [("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions",
                         {"prompt": "hi"})]:  # fmt: skip
        raw = json.dumps({"model": MODEL, **prompt, **fields}).replace('"<deep>"', DEEP_SCHEMA)
        response = http.post(path, content=raw, headers={"Content-Type": "application/json"})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param


def test_a_schema_at_the_depth_limit_is_served(served):
    http, seen = served
    schema = {"type": "object", "properties": {}}
    for _ in range(MAX_JSON_DEPTH // 2 - 1):
        schema = {"type": "object", "properties": {"a": schema}}
    body = {"model": MODEL, "prompt": "hi", "guided_json": schema}
    assert http.post("/v1/completions", json=body).status_code == 200
    assert seen[-1].structured_output == Spec.json_schema(schema)


@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "json_object"}},
        {"response_format": JSON_SCHEMA_FORMAT},
        {"structured_outputs": {"json": SCHEMA}},
        {"guided_regex": "[^<]+"},
    ],
)
def test_with_a_reasoning_parser_constrained_output_is_the_content(fields):
    """The grammar holds from the first token, so no </think> ever comes: the
    reasoning parser took the whole JSON for reasoning, and content was null."""
    token_ids = ChatFakeTokenizer().encode('{"a": 1}')
    engine = LoopFakeEngine(script=lambda *_: iter(token_ids), tokens_per_step=3)
    body = {"model": MODEL, "messages": MESSAGES, **fields}
    with LiveServer(engine, ChatFakeTokenizer(), reasoning_parser="deepseek_r1") as live:
        url = live.url + "/v1/chat/completions"
        message = httpx2.post(url, json=body).json()["choices"][0]["message"]
        streamed = httpx2.post(url, json={**body, "stream": True}).content
    assert message["content"] == '{"a": 1}'
    assert message.get("reasoning_content") is None
    deltas = [chunk["choices"][0]["delta"] for chunk in parse_sse(streamed)[1:] if chunk["choices"]]
    assert "".join(delta.get("content") or "" for delta in deltas) == '{"a": 1}'
    assert not any(delta.get("reasoning_content") for delta in deltas)


def test_with_a_reasoning_parser_unconstrained_output_is_still_split():
    token_ids = ChatFakeTokenizer().encode('<think>hmm</think>{"a": 1}')
    engine = LoopFakeEngine(script=lambda *_: iter(token_ids))
    body = {"model": MODEL, "messages": MESSAGES}
    with LiveServer(engine, ChatFakeTokenizer(), reasoning_parser="deepseek_r1") as live:
        response = httpx2.post(live.url + "/v1/chat/completions", json=body)
    message = response.json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("hmm", '{"a": 1}')
