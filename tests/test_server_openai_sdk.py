"""The official openai SDK against the live server: what real clients see."""

from __future__ import annotations

import openai
import pytest

from sluice.testing.fake_engine import LoopFakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import DEFAULT_MODEL_NAME as MODEL
from sluice.testing.live_server import LiveServer

API_KEY = "sesame"
MESSAGES = [{"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def live():
    with LiveServer(LoopFakeEngine(tokens_per_step=(1, 3), seed=5), ChatFakeTokenizer(),
                    api_key=API_KEY) as server:  # fmt: skip
        yield server


@pytest.fixture(scope="module")
def client(live):
    with openai.OpenAI(base_url=live.url + "/v1", api_key=API_KEY, max_retries=0) as sdk:
        yield sdk


def test_a_completion_parses_into_the_sdk_types(client):
    completion = client.completions.create(model=MODEL, prompt="hello world", max_tokens=5)
    assert completion.object == "text_completion"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 5


def test_a_streamed_completion_matches_the_non_streamed_text(client):
    kwargs = {"model": MODEL, "prompt": "hello world", "max_tokens": 9, "temperature": 0}
    full = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(stream=True, **kwargs))
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == full
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_chat_completion_and_its_stream_agree(client):
    kwargs = {"model": MODEL, "messages": MESSAGES, "max_tokens": 6, "seed": 11}
    message = client.chat.completions.create(**kwargs).choices[0].message
    assert message.role == "assistant"
    stream = client.chat.completions.create(stream=True, **kwargs)
    deltas = [chunk.choices[0].delta for chunk in stream]
    assert deltas[0].role == "assistant"
    assert "".join(delta.content or "" for delta in deltas) == message.content


def test_n_choices_come_back_indexed(client):
    completion = client.completions.create(model=MODEL, prompt="hello", max_tokens=3, n=3)
    assert sorted(choice.index for choice in completion.choices) == [0, 1, 2]
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, n=2)
    assert len(chat.choices) == 2


def test_a_stop_string_ends_the_text_before_it(client):
    completion = client.completions.create(
        model=MODEL, prompt="hello STOP world", max_tokens=20, stop=["STOP"]
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and "STOP" not in choice.text


def test_logprobs_come_back_for_completions_and_chat(client):
    completion = client.completions.create(model=MODEL, prompt="hello", max_tokens=3, logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 3
    chat = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, logprobs=True, top_logprobs=2
    )
    entries = chat.choices[0].logprobs.content
    assert len(entries) == 3 and all(len(entry.top_logprobs) == 2 for entry in entries)


def test_include_usage_adds_one_usage_chunk_at_the_end(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=4, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert [chunk.usage is not None for chunk in chunks].count(True) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4


def test_an_unknown_model_raises_not_found(client):
    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model="gpt-4o", prompt="hi")
    assert error.value.status_code == 404


def test_a_bad_parameter_raises_bad_request_never_unprocessable(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=5)
    assert error.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hi", stream=False,
                                  stream_options={"include_usage": True})  # fmt: skip


def test_a_wrong_api_key_raises_authentication_error(live):
    sdk = openai.OpenAI(base_url=live.url + "/v1", api_key="wrong", max_retries=0)
    with sdk, pytest.raises(openai.AuthenticationError):
        sdk.models.list()


def test_models_list_through_the_sdk(client):
    (model,) = client.models.list().data
    assert model.id == MODEL and model.owned_by == "sluice"
