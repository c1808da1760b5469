"""Reasoning controls: chat's `reasoning_effort`, `chat_template_kwargs` and
`thinking_token_budget`, Responses' `reasoning.effort` and Messages'
`thinking`, as the chat template's variables and the engine's thinking
budget; a bad value is a 400 naming the field of its own API."""

from __future__ import annotations

import asyncio

import pytest

from sluice.apis import openai_protocol
from sluice.apis.chat import protocol as chat_protocol
from sluice.apis.chat.to_internal import chat_request
from sluice.apis.messages.protocol import MessagesRequest
from sluice.apis.messages.to_internal import count_tokens, messages_request
from sluice.apis.openai_request import RequestOptions
from sluice.apis.responses.protocol import ResponsesRequest
from sluice.apis.responses.to_internal import responses_request
from sluice.apis.rules.reasoning_fields import (
    ReasoningPlan,
    TemplateReasoning,
    reasoning_plan,
    template_reasoning,
    thinking_budget,
)
from sluice.apis.rules.tool_fields import ToolPlan
from sluice.config import ReasoningEffortBudgets
from sluice.engine.sampling_params import ThinkingBudget
from sluice.errors import InvalidRequestError, RequestError
from sluice.frontend.preprocess import Preprocessor
from sluice.frontend.request import GenerationRequest
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.tools.output_parsing import OutputParsing

QWEN3_LIKE = "{% if enable_thinking %}<think>{% endif %}"
GPT_OSS_LIKE = "Reasoning: {{ reasoning_effort }}"
R1_LIKE = "{{ '<think>\\n' }}"


class ThinkingTokenizer(ChatFakeTokenizer):
    """The chat fake with `<think>` and `</think>` as one token each; its
    generation prompt opens the reasoning when `opens_reasoning`."""

    def __init__(self, template_source: str, opens_reasoning: bool = False) -> None:
        super().__init__(extra_pieces=["<think>", "</think>"])
        self.chat_template_source = template_source
        self.opens_reasoning = opens_reasoning

    def apply_chat_template(self, messages, add_generation_prompt=True, **keywords) -> str:
        text = super().apply_chat_template(messages, add_generation_prompt, **keywords)
        return text + "<think>\n" if self.opens_reasoning else text


def options(template_source=QWEN3_LIKE, parser="qwen3", opens=False, **fields) -> RequestOptions:
    tokenizer = ThinkingTokenizer(template_source, opens)
    return RequestOptions("m", Preprocessor(tokenizer, 4096), reasoning_parser=parser, **fields)


USER = [{"role": "user", "content": "hi"}]


def chat(opts: RequestOptions | None = None, **fields) -> GenerationRequest:
    body = chat_protocol.ChatCompletionRequest.model_validate({"messages": USER, **fields})
    return asyncio.run(chat_request(body, opts or options()))


def ids(opts: RequestOptions, text: str) -> tuple[int, ...]:
    return tuple(opts.preprocessor.tokenizer.encode(text))


# --- the plan -------------------------------------------------------------------


def plan(template: TemplateReasoning, **fields):
    body = chat_protocol.ChatCompletionRequest.model_validate({"messages": USER, **fields})
    return reasoning_plan(body, template, ReasoningEffortBudgets())


SWITCH = TemplateReasoning(has_thinking_switch=True)
NO_SWITCH = TemplateReasoning()


def test_an_effort_turns_the_switch_and_caps_the_reasoning():
    assert plan(SWITCH, reasoning_effort="low") == ReasoningPlan({"enable_thinking": True}, 1024)
    assert plan(SWITCH, reasoning_effort="none").template_kwargs == {"enable_thinking": False}
    assert plan(SWITCH, reasoning_effort="none").budget_tokens is None
    assert plan(SWITCH, reasoning_effort="xhigh").budget_tokens is None


def test_no_effort_leaves_the_template_and_the_reasoning_as_they_are():
    assert plan(SWITCH).template_kwargs == {} and plan(SWITCH).budget_tokens is None


def test_thinking_off_without_a_switch_is_a_budget_of_zero():
    off = plan(NO_SWITCH, reasoning_effort="none")
    assert (off.template_kwargs, off.budget_tokens) == ({}, 0)


def test_a_template_that_reads_the_effort_gets_it():
    reads = TemplateReasoning(reads_effort=True)
    assert plan(reads, reasoning_effort="high").template_kwargs == {"reasoning_effort": "high"}


def test_the_clients_own_variables_and_budget_win_over_the_efforts():
    mixed = plan(
        SWITCH, reasoning_effort="high", thinking_token_budget=7,
        chat_template_kwargs={"enable_thinking": False, "custom": [1]},
    )  # fmt: skip
    assert mixed.template_kwargs == {"enable_thinking": False, "custom": [1]}
    assert mixed.budget_tokens == 7


def test_the_effort_budgets_come_from_the_server_flag():
    budgets = ReasoningEffortBudgets.from_flag("low=5,high=none")
    assert (budgets.low, budgets.medium, budgets.high) == (5, 4096, None)
    for bad in ("low", "huge=5", "low=-1", "low=5x"):
        with pytest.raises(ValueError, match="low|huge"):
            ReasoningEffortBudgets.from_flag(bad)


# --- the budget the engine gets -------------------------------------------------------


def test_a_chat_budget_counts_after_the_think_the_output_opens():
    opts = options()
    request = chat(opts, reasoning_effort="low")
    assert request.params.thinking_budget == ThinkingBudget(
        1024, ids(opts, "<think>"), ids(opts, "</think>")
    )
    assert '<|sep|>variables: {"enable_thinking": true}' in request.prompts[0].text


def test_a_prompt_that_opens_the_reasoning_counts_from_the_first_token():
    opts = options(R1_LIKE, "deepseek_r1", opens=True)
    budget = chat(opts, thinking_token_budget=3).params.thinking_budget
    assert budget == ThinkingBudget(3, (), ids(opts, "</think>"))


def test_no_budget_where_nothing_reads_the_reasoning():
    assert chat(options(parser=None), reasoning_effort="low").params.thinking_budget is None
    format_ = {"type": "json_object"}
    assert chat(reasoning_effort="low", response_format=format_).params.thinking_budget is None
    assert chat().params.thinking_budget is None


def test_no_budget_where_the_end_marker_is_not_one_token():
    tokenizer = ChatFakeTokenizer()
    tokenizer.chat_template_source = QWEN3_LIKE
    opts = RequestOptions("m", Preprocessor(tokenizer, 4096), reasoning_parser="qwen3")
    assert template_reasoning(tokenizer).end_token_ids == ()
    assert chat(opts, reasoning_effort="low").params.thinking_budget is None


def test_the_budgets_follow_the_options():
    opts = options(reasoning_effort_budgets=ReasoningEffortBudgets(medium=12))
    assert chat(opts, reasoning_effort="medium").params.thinking_budget.max_tokens == 12


def test_thinking_budget_needs_a_start_or_an_open_prompt():
    template = TemplateReasoning(end_token_ids=(9,))
    prompt = chat().prompts[0]
    plan_ = plan(SWITCH, thinking_token_budget=4)
    qwen3, r1 = (ToolPlan(output_parsing=OutputParsing(reasoning_parser=name))
                 for name in ("qwen3", "deepseek_r1"))  # fmt: skip
    assert thinking_budget(plan_, template, qwen3, prompt) is None
    assert thinking_budget(plan_, template, r1, prompt) == ThinkingBudget(4, (), (9,))


# --- Responses and Messages --------------------------------------------------------------


def responses(opts: RequestOptions, **fields) -> GenerationRequest:
    body = ResponsesRequest.model_validate({"input": "hi", **fields})
    return asyncio.run(responses_request(body, opts, [])).request


def messages(opts: RequestOptions, **fields) -> GenerationRequest:
    body = MessagesRequest.model_validate({"messages": USER, "max_tokens": 100, **fields})
    return asyncio.run(messages_request(body, opts))


def test_responses_reasoning_effort_is_chats():
    opts = options()
    request = responses(opts, reasoning={"effort": "minimal"}, chat_template_kwargs={"x": 1})
    assert request.params.thinking_budget.max_tokens == 256
    assert '"enable_thinking": true, "x": 1' in request.prompts[0].text


def test_a_bad_responses_effort_names_reasoning_effort():
    with pytest.raises(RequestError) as error:
        responses(options(), reasoning={"effort": "maximal"})
    assert error.value.param == "reasoning.effort"


def test_messages_thinking_budget_tokens_is_the_budget():
    opts = options()
    request = messages(opts, thinking={"type": "enabled", "budget_tokens": 40})
    assert request.params.thinking_budget == ThinkingBudget(
        40, ids(opts, "<think>"), ids(opts, "</think>")
    )


def test_messages_thinking_disabled_turns_the_switch_off_and_reads_no_reasoning():
    opts = options()
    request = messages(opts, thinking={"type": "disabled"}, chat_template_kwargs={"y": "z"})
    assert '{"enable_thinking": false, "y": "z"}' in request.prompts[0].text
    assert request.params.thinking_budget is None
    assert request.output_parsing is None or request.output_parsing.reasoning_parser is None


def test_messages_count_tokens_renders_the_same_variables():
    opts = options()
    fields = {"thinking": {"type": "disabled"}, "chat_template_kwargs": {"y": "z"}}
    body = MessagesRequest.model_validate({"messages": USER, "max_tokens": 100, **fields})
    counted = asyncio.run(count_tokens(body, opts))
    assert counted == len(messages(opts, **fields).prompts[0].token_ids)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"reasoning_effort": "maximal"}, "reasoning_effort"),
        ({"reasoning_effort": 3}, "reasoning_effort"),
        ({"thinking_token_budget": -1}, "thinking_token_budget"),
        ({"chat_template_kwargs": []}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {f"k{i}": i for i in range(65)}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"k" * 65: 1}}, "chat_template_kwargs"),
    ],
)
def test_bad_controls_are_refused_naming_the_field(fields, param):
    with pytest.raises(InvalidRequestError) as error:
        openai_protocol.validate_body(
            {"messages": USER, **fields}, chat_protocol.ChatCompletionRequest
        )
    assert (error.value.param or "").startswith(param)


# --- harmony (gpt-oss) ----------------------------------------------------------


HARMONY_MARKERS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "analysis", "final"]


def harmony_options() -> RequestOptions:
    tokenizer = ChatFakeTokenizer(extra_pieces=HARMONY_MARKERS)
    tokenizer.chat_template_source = "<|start|>system<|message|>{{ reasoning_effort }}<|channel|>"
    return RequestOptions("m", Preprocessor(tokenizer, 4096), reasoning_parser="harmony")


def test_a_harmony_budget_covers_the_opening_analysis_and_forces_the_final_channel():
    opts = harmony_options()
    request = chat(opts, reasoning_effort="none")
    assert request.params.thinking_budget == ThinkingBudget(
        0,
        ids(opts, "<|channel|>analysis<|message|>"),
        ids(opts, "<|end|><|start|>assistant<|channel|>final<|message|>"),
    )
    assert '"reasoning_effort": "low"' in request.prompts[0].text
    assert not request.skip_special_tokens  # harmony's markers are read
