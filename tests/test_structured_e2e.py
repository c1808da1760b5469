"""Structured outputs end to end: the official openai SDK against the embedded
model (in-process engine, float32, greedy), over a real socket.

The 135M model follows the constraint because it cannot do otherwise: the
prompts are ordinary, and the outputs hold only because masked tokens were
never sampled (each test checks what it needs of the output).
"""

from __future__ import annotations

import json
import re

import openai
import pydantic
import pytest

from sluice.testing.live_server import in_process_server

pytestmark = pytest.mark.slow


class City(pydantic.BaseModel):
    name: str
    country: str
    population: int


@pytest.fixture(scope="module")
def live(embedded_model_config):
    with in_process_server(embedded_model_config) as server:
        yield server


@pytest.fixture(scope="module")
def sdk(live):
    with openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def ask(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def test_parse_with_a_pydantic_model_returns_a_valid_object(sdk):
    completion = sdk.chat.completions.parse(
        model=sdk.models.list().data[0].id,
        messages=ask("Give the capital of France as JSON with name, country and population."),
        response_format=City,
        temperature=0,
        max_tokens=100,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)
    # Keys come in the schema's order.
    assert list(json.loads(choice.message.content)) == ["name", "country", "population"]


def test_json_object_returns_parseable_json(sdk):
    completion = sdk.chat.completions.create(
        model=sdk.models.list().data[0].id,
        messages=ask("Return a JSON object with the keys name and age for Ann, who is 30."),
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=120,
    )
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(completion.choices[0].message.content), dict)


def test_regex_and_choice_are_honoured(sdk):
    model_id = sdk.models.list().data[0].id
    number = sdk.chat.completions.create(
        model=model_id,
        messages=ask("What is 12 times 12?"),
        extra_body={"structured_outputs": {"regex": "[0-9]{1,4}"}},
        temperature=0,
        max_tokens=20,
    )
    assert re.fullmatch("[0-9]{1,4}", number.choices[0].message.content)
    answer = sdk.chat.completions.create(
        model=model_id,
        messages=ask("Is the sky green? Answer maybe, never or always."),
        extra_body={"guided_choice": ["maybe", "never", "always"]},
        temperature=0,
        max_tokens=20,
    )
    assert answer.choices[0].message.content in ("maybe", "never", "always")
    colours = sdk.completions.create(
        model=model_id,
        prompt="Name three colors:",
        extra_body={"guided_regex": "(red|green|blue)(, (red|green|blue)){2}"},
        temperature=0,
        max_tokens=20,
    )
    assert re.fullmatch("(red|green|blue)(, (red|green|blue)){2}", colours.choices[0].text)
    assert {number.choices[0].finish_reason, colours.choices[0].finish_reason} == {"stop"}


def test_streamed_text_equals_the_non_streamed_text(sdk):
    fields = {
        "model": sdk.models.list().data[0].id,
        "messages": ask("Describe a book as JSON: title and author."),
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "Book", "strict": True, "schema": {
                "type": "object",
                "properties": {"title": {"type": "string"}, "author": {"type": "string"}},
                "required": ["title", "author"], "additionalProperties": False}}},
        "temperature": 0,
        "max_tokens": 80,
    }  # fmt: skip
    whole = sdk.chat.completions.create(**fields)
    stream = sdk.chat.completions.create(**fields, stream=True)
    chunks = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(chunks) == whole.choices[0].message.content
    assert set(json.loads(whole.choices[0].message.content)) == {"title", "author"}
    assert len([c for c in chunks if c]) > 1  # it really streamed


def test_a_bad_schema_is_a_400_before_the_engine(sdk):
    with pytest.raises(openai.BadRequestError) as error:
        sdk.chat.completions.create(
            model=sdk.models.list().data[0].id,
            messages=ask("hi"),
            extra_body={"guided_regex": "(unclosed"},
        )
    assert error.value.body["param"] == "guided_regex"
