"""Request bodies: JSON and Content-Type checks, nulls, unknown fields, ranges."""

from __future__ import annotations

import json
import re

import orjson
import pytest

from sluice.apis.chat.protocol import ChatCompletionRequest, DetokenizeRequest, TokenizeRequest
from sluice.apis.completions.protocol import CompletionRequest
from sluice.apis.openai_protocol import parse_body
from sluice.errors import InvalidRequestError, UnsupportedMediaTypeError

JSON = "application/json"


def parse(body: dict, model=CompletionRequest, content_type: str | None = JSON):
    # The stdlib encoder: it writes integers beyond 64 bits, as clients may.
    return parse_body(json.dumps(body).encode(), content_type, model)


def refused(body: dict, model=CompletionRequest) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as error:
        parse(body, model)
    return error.value


STRUCTURED_FIELDS = [
    "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar",
]  # fmt: skip
COMPLETION_FIELDS = [
    "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs",
    "max_tokens", "n", "presence_penalty", "seed", "stop", "stream", "stream_options",
    "suffix", "temperature", "top_p", "user", "top_k", "min_p", "repetition_penalty",
    "ignore_eos", "min_tokens", "stop_token_ids", "include_stop_str_in_output",
    "skip_special_tokens", "spaces_between_special_tokens", "add_special_tokens",
    *STRUCTURED_FIELDS,
]  # fmt: skip
CHAT_FIELDS = [
    "model", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "max_tokens",
    "max_completion_tokens", "n", "presence_penalty", "response_format", "seed", "stop",
    "stream", "stream_options", "temperature", "top_p", "user", "top_k", "min_p",
    "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids",
    "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens",
    "add_generation_prompt", "add_special_tokens", *STRUCTURED_FIELDS[1:],
]  # fmt: skip


@pytest.mark.parametrize("field", COMPLETION_FIELDS)
def test_every_completion_field_accepts_null(field):
    body = parse({"prompt": "hi", field: None} if field != "prompt" else {field: None})
    assert getattr(body, field) is None


@pytest.mark.parametrize("field", CHAT_FIELDS)
def test_every_chat_field_accepts_null(field):
    body = parse(
        {"messages": [{"role": "user", "content": "x"}], field: None}, ChatCompletionRequest
    )
    assert getattr(body, field) is None


def test_unknown_fields_are_ignored():
    body = parse({"prompt": "hi", "frobnicate": [1, {"a": 2}], "tools": []})
    assert body.prompt == "hi"


@pytest.mark.parametrize(
    "prompt", ["text", ["a", "b"], [1, 2, 3], [[1, 2], [3]], [], [[]]], ids=repr
)
def test_prompt_takes_each_openai_shape(prompt):
    assert parse({"prompt": prompt}).prompt == prompt


@pytest.mark.parametrize(
    "prompt", [5, [1, "a"], [[1], "a"], [1.5], [True], {"a": 1}, [[1, [2]]]], ids=repr
)
def test_other_prompt_shapes_are_refused_naming_prompt(prompt):
    error = refused({"prompt": prompt})
    assert error.param == "prompt"
    assert "prompt must be" in error.message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 2.5), ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5),
        ("n", 0), ("n", 10_000), ("logprobs", 21), ("logprobs", -1), ("max_tokens", -1),
        ("presence_penalty", 2.1), ("frequency_penalty", -3), ("seed", 2**64),
        ("min_p", 1.5), ("repetition_penalty", 0), ("top_k", -2), ("min_tokens", -1),
        ("stop_token_ids", [-1]), ("logit_bias", {"5": 101}), ("stream", "maybe"),
        ("stop", ["a"] * 17), ("stop", [1]), ("stream_options", {"include_usage": "x"}),
    ],
)  # fmt: skip
def test_out_of_range_or_mistyped_fields_are_refused_naming_the_field(field, value):
    error = refused({"prompt": "hi", field: value})
    assert error.param is not None and re.split(r"[.\[]", error.param)[0] == field


def test_chat_ranges_and_roles_are_checked_with_the_path_named():
    error = refused(
        {"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]},
        ChatCompletionRequest,
    )
    assert error.param == "messages[1].role"
    error = refused(
        {"messages": [{"role": "user", "content": "a"}], "top_logprobs": 21},
        ChatCompletionRequest,
    )
    assert error.param == "top_logprobs"
    assert refused({"messages": []}, ChatCompletionRequest).param == "messages"


@pytest.mark.parametrize("role", ["system", "user", "assistant", "tool", "developer"])
def test_every_openai_role_is_accepted(role):
    body = parse({"messages": [{"role": role, "content": "x"}]}, ChatCompletionRequest)
    assert body.messages[0].role == role


def test_content_parts_are_parsed_for_to_internal_to_judge():
    body = parse(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                   {"type": "image_url", "image_url": {}}]}]},
        ChatCompletionRequest,
    )  # fmt: skip
    assert [part.type for part in body.messages[0].content] == ["text", "image_url"]


def test_a_missing_required_field_inside_a_message_is_named():
    error = refused({"messages": [{"content": "x"}]}, ChatCompletionRequest)
    assert error.param == "messages[0].role"
    assert "required" in error.message


@pytest.mark.parametrize("raw", [b"", b"{", b"[1]", b'"x"', b"{'a': 1}", b'{"a": NaN}'])
def test_malformed_json_or_a_non_object_body_is_a_400(raw):
    with pytest.raises(InvalidRequestError):
        parse_body(raw, JSON, CompletionRequest)


def test_a_non_json_or_missing_content_type_is_a_415():
    raw = orjson.dumps({"prompt": "hi"})
    for content_type in ("application/x-www-form-urlencoded", None):
        with pytest.raises(UnsupportedMediaTypeError) as error:
            parse_body(raw, content_type, CompletionRequest)
        assert error.value.status_code == 415 and "Content-Type" in error.value.message
    assert parse_body(raw, "application/json; charset=utf-8", CompletionRequest).prompt == "hi"


def test_huge_integers_are_refused_not_overflowed():
    raw = b'{"prompt": "hi", "max_tokens": 123456789012345678901234567890}'
    with pytest.raises(InvalidRequestError) as error:
        parse_body(raw, JSON, CompletionRequest)
    assert error.value.param == "max_tokens"


def test_tokenize_and_detokenize_bodies_parse():
    assert parse({"prompt": "hi"}, TokenizeRequest).prompt == "hi"
    assert parse({"tokens": [1, 2]}, DetokenizeRequest).tokens == [1, 2]
    assert refused({"tokens": [-1]}, DetokenizeRequest).param == "tokens[0]"
