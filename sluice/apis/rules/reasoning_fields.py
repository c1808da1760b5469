"""A chat request's reasoning controls -> the chat template's inputs and the
engine's thinking budget (docs/API.md, "Reasoning controls").

Each API's fields arrive as chat's (Responses' `reasoning.effort` and
Messages' `thinking` are mapped onto them before chat's `chat_request`):
- `chat_template_kwargs` (vLLM's): extra variables of the chat template,
  e.g. `{"enable_thinking": false}` for Qwen3's;
- `reasoning_effort` (OpenAI's): "none" turns thinking off, the others turn
  it on and cap it at the server's budget for that effort
  (`--reasoning-effort-budgets`); a template that reads `reasoning_effort`
  itself (gpt-oss's: `Reasoning: low|medium|high` in its system message)
  gets the effort as well, as the nearest of those three;
- `thinking_token_budget` (vLLM's; Messages' `thinking.budget_tokens`): the
  cap in tokens, over the effort's.

Thinking off means `enable_thinking: false` for a template that reads it;
for one that does not, a budget of 0 (the end of reasoning comes first).
A key of `chat_template_kwargs` wins over what an effort implies for it.

The budget is enforced (`SamplingParams.thinking_budget`) only where the
output's reasoning is read (a reasoning parser runs and no grammar
constrains the output) and the end marker `</think>` is one token of the
vocabulary (every reasoning model's is an added token): a marker spelled by
several ordinary tokens could end the reasoning in another spelling that the
engine would not see. Harmony's budget covers the analysis message that
opens the output; its forced end is `<|end|>` and the final channel's
header. Elsewhere the budget is accepted and not enforced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from sluice.apis.chat import protocol as chat_protocol
from sluice.apis.rules.tool_fields import ToolPlan
from sluice.config import ReasoningEffortBudgets
from sluice.engine.sampling_params import ThinkingBudget
from sluice.frontend.preprocess import PromptTokenizer
from sluice.frontend.request import PromptInput
from sluice.tools.harmony import is_harmony_template
from sluice.tools.reasoning import THINK_END, THINK_START

# What a chat template reads as its thinking switch (Qwen3, SmolLM3, ...).
THINKING_SWITCH = "enable_thinking"
# What gpt-oss's template reads as its effort.
EFFORT_VARIABLE = "reasoning_effort"
# The effort that turns thinking off.
NO_EFFORT = "none"
# gpt-oss's template knows low, medium and high: the others as the nearest.
_TEMPLATE_EFFORTS = {NO_EFFORT: "low", "minimal": "low", "xhigh": "high"}
# Harmony's markers around the analysis message that opens gpt-oss's output.
HARMONY_END = "<|end|>"
HARMONY_ANALYSIS = "<|channel|>analysis<|message|>"
HARMONY_TO_FINAL = HARMONY_END + "<|start|>assistant<|channel|>final<|message|>"


@dataclass(frozen=True, slots=True)
class TemplateReasoning:
    """What a served model's chat template and vocabulary offer the controls."""

    # The template reads `enable_thinking`.
    has_thinking_switch: bool = False
    # The template reads `reasoning_effort`.
    reads_effort: bool = False
    # `<think>` and `</think>` as token ids (empty where not one token).
    start_token_ids: tuple[int, ...] = ()
    end_token_ids: tuple[int, ...] = ()


_TEMPLATE_REASONING: WeakKeyDictionary[Any, TemplateReasoning] = WeakKeyDictionary()


def template_reasoning(tokenizer: PromptTokenizer) -> TemplateReasoning:
    """Read once per tokenizer (the template's text, a few encodes)."""
    known = _TEMPLATE_REASONING.get(tokenizer)
    if known is None:
        source = getattr(tokenizer, "chat_template_source", None) or ""
        if is_harmony_template(source):
            markers = _harmony_markers(tokenizer)
        else:
            markers = _one_token(tokenizer, THINK_START), _one_token(tokenizer, THINK_END)
        known = TemplateReasoning(
            has_thinking_switch=THINKING_SWITCH in source,
            reads_effort=EFFORT_VARIABLE in source,
            start_token_ids=markers[0],
            end_token_ids=markers[1],
        )
        _TEMPLATE_REASONING[tokenizer] = known
    return known


def _one_token(tokenizer: PromptTokenizer, marker: str) -> tuple[int, ...]:
    ids = tokenizer.encode(marker, add_special_tokens=False)
    return tuple(ids) if len(ids) == 1 else ()


def _harmony_markers(tokenizer: PromptTokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Harmony's reasoning is the analysis message that opens the output; its
    forced end closes it and opens the final channel (`<|end|>`, which ends
    it by itself, one token)."""
    if not _one_token(tokenizer, HARMONY_END):
        return (), ()
    encode = tokenizer.encode
    start = tuple(encode(HARMONY_ANALYSIS, add_special_tokens=False))
    return start, tuple(encode(HARMONY_TO_FINAL, add_special_tokens=False))


@dataclass(frozen=True, slots=True)
class ReasoningPlan:
    """What a chat request's controls decided."""

    # Variables added to the chat template's.
    template_kwargs: dict[str, Any]
    # The cap on reasoning tokens; None: unbounded.
    budget_tokens: int | None


def reasoning_plan(
    body: chat_protocol.ChatCompletionRequest,
    template: TemplateReasoning,
    budgets: ReasoningEffortBudgets,
) -> ReasoningPlan:
    """The template's inputs and the budget for a chat body's controls."""
    effort = body.reasoning_effort
    implied: dict[str, Any] = {}
    budget = None
    if effort is not None:
        if template.has_thinking_switch:
            implied[THINKING_SWITCH] = effort != NO_EFFORT
        if template.reads_effort:
            implied[EFFORT_VARIABLE] = _TEMPLATE_EFFORTS.get(effort, effort)
        if effort == NO_EFFORT:
            budget = None if template.has_thinking_switch else 0
        else:
            budget = budgets.of(effort)
    if body.thinking_token_budget is not None:
        budget = body.thinking_token_budget
    return ReasoningPlan({**implied, **(body.chat_template_kwargs or {})}, budget)


def thinking_budget(
    plan: ReasoningPlan, template: TemplateReasoning, tools: ToolPlan, prompt: PromptInput
) -> ThinkingBudget | None:
    """The engine's budget, where it can be enforced (the module docstring)."""
    parsing = tools.output_parsing
    reasoning_parser = None if parsing is None else parsing.reasoning_parser
    if tools.structured_output is not None or reasoning_parser is None:
        return None
    if plan.budget_tokens is None or not template.end_token_ids:
        return None
    # The reasoning starts with the output when the prompt opened it
    # (DeepSeek-R1's and Qwen3-Thinking's generation prompts), or when the
    # parser reads everything before `</think>` as reasoning.
    is_open = prompt.text.rstrip().endswith(THINK_START) or reasoning_parser == "deepseek_r1"
    start = () if is_open else template.start_token_ids
    if not is_open and not start:
        return None
    return ThinkingBudget(plan.budget_tokens, start, template.end_token_ids)
