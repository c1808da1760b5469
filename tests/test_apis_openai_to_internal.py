"""Pydantic bodies -> GenerationRequest: every field mapped, every refusal named."""

from __future__ import annotations

import asyncio

import pytest

from sluice.apis.chat.protocol import ChatCompletionRequest
from sluice.apis.chat.to_internal import chat_request
from sluice.apis.completions.protocol import CompletionRequest
from sluice.apis.completions.to_internal import completion_request
from sluice.apis.openai_request import RequestOptions, check_model
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import (
    ContextLengthError,
    InvalidRequestError,
    ModelNotFoundError,
    RequestError,
)
from sluice.frontend.preprocess import Preprocessor

MODEL = "tiny"
MAX_MODEL_LEN = 64


class CharTokenizer:
    """One token per character, ids = code point mod 500."""

    vocab_size = 500
    has_chat_template = True

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(ch) % 500 for ch in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        return "".join(f"[{m['role']}]{m['content']}" for m in messages) + (
            "[assistant]" if add_generation_prompt else ""
        )


OPTIONS = RequestOptions(MODEL, Preprocessor(CharTokenizer(), MAX_MODEL_LEN))


def completion(**fields):
    body = CompletionRequest.model_validate({"prompt": "hello", **fields})
    return asyncio.run(completion_request(body, OPTIONS))


def chat(**fields):
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    return asyncio.run(chat_request(ChatCompletionRequest.model_validate(fields), OPTIONS))


def refusal(build, **fields) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as error:
        build(**fields)
    return error.value


def test_a_bare_completion_gets_openai_defaults():
    request = completion()
    assert request.kind == "completion"
    assert request.response_id.startswith("cmpl-")
    assert request.model_name == MODEL
    assert request.n == 1 and not request.stream and not request.echo
    assert request.prompts[0].text == "hello"
    # BOS added by default for completions (vLLM's add_special_tokens=True).
    assert request.prompts[0].token_ids == (1, *map(ord, "hello"))
    assert request.params == SamplingParams(max_tokens=16)


def test_every_sampling_field_reaches_sampling_params():
    request = completion(
        temperature=0.5, top_p=0.9, top_k=5, min_p=0.1, presence_penalty=0.5,
        frequency_penalty=-0.5, repetition_penalty=1.2, logit_bias={"7": 5.0, "8": -100},
        seed=42, max_tokens=8, min_tokens=2, stop_token_ids=[3, 4], ignore_eos=True,
        logprobs=3,
    )  # fmt: skip
    assert request.params == SamplingParams(
        temperature=0.5, top_p=0.9, top_k=5, min_p=0.1, presence_penalty=0.5,
        frequency_penalty=-0.5, repetition_penalty=1.2, logit_bias={7: 5.0, 8: -100.0},
        seed=42, max_tokens=8, min_tokens=2, stop_token_ids=(3, 4), ignore_eos=True,
        logprobs=3,
    )  # fmt: skip
    assert request.params.logprobs == 3


def test_frontend_fields_reach_the_generation_request():
    request = completion(
        n=2, stop="\n", include_stop_str_in_output=True, skip_special_tokens=False,
        spaces_between_special_tokens=False, stream=True, echo=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )  # fmt: skip
    assert request.n == 2 and request.stop == ("\n",) and request.echo
    assert request.include_stop_str_in_output and not request.skip_special_tokens
    assert not request.spaces_between_special_tokens
    assert request.stream and request.include_usage and request.continuous_usage_stats


def test_continuous_usage_needs_include_usage_as_in_vllm():
    alone = completion(stream=True, stream_options={"continuous_usage_stats": True})
    assert not alone.include_usage and not alone.continuous_usage_stats


def test_list_prompts_become_one_prompt_input_each():
    request = completion(prompt=["ab", "c"], n=2)
    assert [p.text for p in request.prompts] == ["ab", "c"]
    assert request.num_choices == 4


def test_token_prompts_are_taken_as_given_and_decoded_only_for_echo():
    assert completion(prompt=[104, 105]).prompts[0].token_ids == (104, 105)
    assert completion(prompt=[104, 105]).prompts[0].text == ""
    assert completion(prompt=[[104], [105]], echo=True).prompts[1].text == "i"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [[]]}, "prompt"),
        ({"prompt": ["ok", ""]}, "prompt[1]"),
        ({"prompt": None}, "prompt"),
        ({"prompt": [500]}, "prompt"),
        ({"suffix": "x"}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"max_tokens": 0}, "max_tokens"),  # 0 only with echo
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": False, "stream_options": {}}, "stream_options"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"500": 1}}, "logit_bias"),
        ({"stop": ["x" * 1025]}, "stop"),
        ({"stop": "x" * 1025}, "stop"),
        ({"stop_token_ids": [999]}, "stop_token_ids"),
        ({"min_tokens": 17}, "min_tokens"),
        ({"stop": ["a", ""]}, "stop"),
        ({"prompt": ["a"] * 20, "n": 100}, "n"),
        ({"seed": 2**63 - 1, "n": 2}, "seed"),
    ],
)
def test_completion_refusals_name_the_field(fields, param):
    assert refusal(completion, **fields).param == param


def test_best_of_equal_to_n_is_accepted():
    assert completion(best_of=3, n=3).n == 3


def test_a_prompt_plus_max_tokens_beyond_the_context_is_a_400_with_numbers():
    with pytest.raises(ContextLengthError) as error:
        completion(prompt="x" * 60, max_tokens=10)
    assert error.value.status_code == 400
    assert "64" in error.value.message and "61" in error.value.message


def test_an_unknown_model_is_a_404_and_the_served_name_or_none_is_accepted():
    with pytest.raises(ModelNotFoundError) as error:
        completion(model="gpt-4")
    assert error.value.param == "model" and error.value.status_code == 404
    assert check_model(None, MODEL) == MODEL
    assert completion(model=MODEL).model_name == MODEL


def test_a_chat_request_renders_the_template_without_extra_special_tokens():
    request = chat()
    assert request.kind == "chat" and request.response_id.startswith("chatcmpl-")
    assert request.prompts[0].text == "[user]hi[assistant]"
    assert request.prompts[0].token_ids[0] != 1


def test_chat_max_tokens_defaults_to_the_rest_of_the_context():
    request = chat()
    assert request.params.max_tokens == MAX_MODEL_LEN - len("[user]hi[assistant]")


def test_max_completion_tokens_wins_over_max_tokens():
    assert chat(max_tokens=5, max_completion_tokens=7).params.max_tokens == 7
    assert chat(max_tokens=5).params.max_tokens == 5


def test_chat_text_parts_are_joined_with_newlines():
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    request = chat(messages=[{"role": "user", "content": content}])
    assert request.prompts[0].text == "[user]a\nb[assistant]"


def test_chat_logprobs_map_to_top_logprobs():
    assert chat(logprobs=True, top_logprobs=4).params.logprobs == 4
    assert chat(logprobs=True).params.logprobs == 0
    assert chat(logprobs=False, top_logprobs=0).params.logprobs is None


def test_add_generation_prompt_can_be_turned_off():
    assert chat(add_generation_prompt=False).prompts[0].text == "[user]hi"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": None}, "messages"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content[0].type"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]},
         "messages[0].content[0].text"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"model": "other"}, "model"),
        ({"messages": [{"role": "user", "content": "x" * 80}]}, "messages"),
        ({"max_tokens": 60}, "max_tokens"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)  # fmt: skip
def test_chat_refusals_name_the_field(fields, param):
    with pytest.raises(RequestError) as error:
        chat(**fields)
    assert error.value.param == param


def test_an_assistant_turn_may_have_no_content():
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "b"},
    ]
    assert chat(messages=messages).prompts[0].text == "[user]a[assistant][user]b[assistant]"


def test_response_format_text_is_accepted():
    assert chat(response_format={"type": "text"}).kind == "chat"


@pytest.mark.parametrize(
    "key",
    [
        "\u00b2",  # "²": isdigit() is true, int() fails
        "\u0661\u0662",  # Arabic-Indic "١٢": int() reads 12
        "\uff11",  # fullwidth "１"
        "+1", "-1", " 1", "1 ", "1_000", "1.0", "0x1", "", "1" * 21,
    ],
)  # fmt: skip
def test_logit_bias_keys_other_than_ascii_digit_token_ids_are_400s(key):
    error = refusal(completion, logit_bias={key: 1.0})
    assert (error.status_code, error.param) == (400, "logit_bias")


def test_logit_bias_keys_are_ascii_decimal_token_ids():
    assert completion(logit_bias={"7": 1.0, "0012": -1.0}).params.logit_bias == {7: 1.0, 12: -1.0}
