"""Validation in windows: the same model, or the same first error, as one pydantic call."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.apis import openai_protocol
from sluice.apis.chat import protocol as chat_protocol
from sluice.apis.completions import protocol as completions_protocol
from sluice.errors import InvalidRequestError
from sluice.server.body import validation_windows
from sluice.server.body.validation_windows import validate

WINDOW_ITEMS = 3


@pytest.fixture(autouse=True)
def tiny_windows(monkeypatch):
    """Windows of 3 items, so small bodies are cut at every place a large one is."""
    tiny = {
        model: dataclasses.replace(windowed, window_items=WINDOW_ITEMS)
        for model, windowed in validation_windows.WINDOWED_LISTS.items()
    }
    monkeypatch.setattr(validation_windows, "WINDOWED_LISTS", tiny)


def outcome(validation):
    try:
        body = validation()
    except InvalidRequestError as exc:
        return "refused", exc.message, exc.param
    return "valid", body.model_dump(), body.model_fields_set, body


def same_as_one_call(model, data: dict) -> None:
    windowed = outcome(lambda: validate(model, data))
    whole = outcome(lambda: openai_protocol.validate_body(data, model))
    assert windowed[:3] == whole[:3]
    if whole[0] == "valid":
        assert windowed[3] == whole[3]


TEXT = st.text(max_size=5)
PARTS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image_url"])},
        optional={"text": TEXT | st.none() | st.just(3)},
    ),
    max_size=9,
)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool"]) | st.just("bogus")},
        optional={"content": TEXT | st.none() | PARTS | st.just(5), "name": TEXT | st.just(7),
                  "unknown": st.just([1, 2])},
    ),
    max_size=12,
)  # fmt: skip
# Fields before `messages` (temperature) and after it (top_logprobs), valid or not.
OTHER_FIELDS = st.fixed_dictionaries(
    {},
    optional={"temperature": st.sampled_from([0.5, 5.0]), "top_logprobs": st.sampled_from([2, 99])},
)
IDS = st.lists(st.integers(0, 50) | st.just(-1), max_size=15)
PROMPTS = (
    IDS
    | st.lists(TEXT, max_size=10)
    | st.lists(IDS, max_size=8)
    | st.lists(st.integers(0, 9) | TEXT, max_size=10)
    | TEXT
)


@settings(max_examples=400, deadline=None)
@given(MESSAGES, OTHER_FIELDS)
def test_chat_messages_validate_as_in_one_call(messages, fields):
    for model in (chat_protocol.ChatCompletionRequest, chat_protocol.TokenizeRequest):
        same_as_one_call(model, {**fields, "messages": messages})


@settings(max_examples=400, deadline=None)
@given(PROMPTS, OTHER_FIELDS, st.sampled_from([None, 2, -3]))
def test_prompts_validate_as_in_one_call(prompt, fields, echo_or_logprobs):
    # `logprobs` comes after `prompt` in the model, `temperature` before it.
    data = {**fields, "prompt": prompt}
    if echo_or_logprobs is not None:
        data["logprobs"] = echo_or_logprobs
    same_as_one_call(completions_protocol.CompletionRequest, data)


@settings(max_examples=200, deadline=None)
@given(IDS)
def test_detokenize_ids_validate_as_in_one_call(tokens):
    same_as_one_call(chat_protocol.DetokenizeRequest, {"tokens": tokens})


def test_an_error_far_into_a_list_names_its_place_in_the_whole_list():
    messages = [{"role": "user", "content": "hi"}] * 10 + [{"role": "bogus", "content": "x"}]
    with pytest.raises(InvalidRequestError) as info:
        validate(chat_protocol.ChatCompletionRequest, {"messages": messages})
    assert info.value.param == "messages[10].role"
    with pytest.raises(InvalidRequestError) as info:
        validate(chat_protocol.DetokenizeRequest, {"tokens": [0] * 10 + [-1]})
    assert info.value.param == "tokens[10]"


@pytest.mark.parametrize(
    ("model", "data"),
    [
        (chat_protocol.ChatCompletionRequest,
         {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 20}] * 5
          + [{"role": "user", "content": "b"}] * 20}),
        (completions_protocol.CompletionRequest, {"prompt": [[1] * 20, [2], [3] * 7] + [[4]] * 10}),
        (completions_protocol.CompletionRequest, {"prompt": list(range(50))}),
        (chat_protocol.DetokenizeRequest, {"tokens": list(range(50))}),
    ],
)  # fmt: skip
def test_no_pydantic_call_validates_more_than_a_window(monkeypatch, model, data):
    windowed = validation_windows.WINDOWED_LISTS[model]
    weights = []
    real_validate = model.model_validate

    def recording_validate(window_data):
        items = window_data[windowed.name]
        weights.append(sum(validation_windows._weight(item, windowed.inner) for item in items))
        return real_validate(window_data)

    monkeypatch.setattr(model, "model_validate", recording_validate)
    assert validate(model, data) == real_validate(data)
    # A window holds at most WINDOW_ITEMS items, plus the one element carrying an inner window.
    assert len(weights) > 5 and max(weights) <= WINDOW_ITEMS + 1
