"""The frontend's view of one API request, built at the HTTP edge after
validation and tokenization. Pydantic stops at the edge: this is a frozen value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sluice.engine.sampling_params import SamplingParams
from sluice.tools.output_parsing import OutputParsing


@dataclass(frozen=True, slots=True)
class PromptInput:
    # The prompt as the engine sees it.
    token_ids: tuple[int, ...]
    # The prompt text, for `echo` (decoded from the ids when given as ids).
    text: str


@dataclass(frozen=True, slots=True)
class ResponsesSettings:
    """What a Responses API request adds to the chat request underneath it."""

    # The response object's fields that echo the request (instructions, tools,
    # tool_choice, text, reasoning, temperature, ...), JSON-encoded at the edge.
    echoed_json: bytes
    # Tools offered to the model as functions with one string argument,
    # `input`, whose calls become `custom_tool_call` items.
    custom_tool_names: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    # Which API's shapes the output takes: chat and completions (OpenAI), the
    # Responses API's events and items, Anthropic's Messages events and blocks.
    # "responses" and "messages" are chat requests underneath (one prompt
    # rendered from messages, output parsing for tools and reasoning).
    kind: Literal["completion", "chat", "responses", "messages"]
    # "cmpl-…", "chatcmpl-…", "resp_…" or "msg_…"; the same on every event.
    response_id: str
    # Unix seconds; the same on every chunk.
    created: int
    # The name the client asked for (echoed as `model`).
    model_name: str
    # Completions: one per prompt of the list. Chat: exactly one.
    prompts: tuple[PromptInput, ...]
    # Choices per prompt. Completions index = prompt_index * n + i.
    n: int
    # Engine parameters shared by every choice. With a seed, choice i of
    # prompt p is sampled with seed + p * n + i so choices differ yet repeat.
    # Its `logprobs` is the answer's too (None: none; completions' `logprobs`,
    # chat's `top_logprobs` when `logprobs` is true: top N, 0..20).
    params: SamplingParams
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    stream: bool = False
    # stream_options.include_usage: one usage chunk with `choices: []` before [DONE].
    include_usage: bool = False
    # stream_options.continuous_usage_stats: cumulative usage on every chunk.
    continuous_usage_stats: bool = False
    # Completions only: prepend the prompt text to each choice.
    echo: bool = False
    # Completions `echo` with `max_tokens: 0` (lm-eval's loglikelihood): the
    # engine samples one token, which the frontend drops; the prompt alone returns.
    is_echo_only: bool = False
    # Chat: how each choice's text is read into reasoning, content and tool
    # calls (sluice/tools); None: the text is the content.
    output_parsing: OutputParsing | None = None
    # kind "responses" only.
    responses: ResponsesSettings | None = None

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n
