"""Validated pydantic bodies -> frozen `GenerationRequest` (with `SamplingParams`).

The last step of the HTTP edge before the frontend. Pydantic has already
checked types and ranges; this module checks what needs the served model or
relates several fields (unknown model, vocabulary ids, n against best_of,
stream_options without stream, context length), tokenizes through the
`Preprocessor`, and raises a typed `RequestError` naming the field for
anything it refuses. Nothing a client sends gets past here unchecked.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar

import msgspec

from sluice.apis.max_tokens import effective_max_tokens
from sluice.config import GenerationDefaults, ReasoningEffortBudgets, RequestLimits
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import InvalidRequestError, ModelNotFoundError
from sluice.frontend.preprocess import ChatMessage, Preprocessor
from sluice.frontend.request import GenerationRequest, PromptInput
from sluice.server import limits, protocol, reasoning_fields, tool_fields
from sluice.server.structured_fields import GrammarCheck, structured_output
from sluice.server.tool_prompt import template_inputs
from sluice.structured.spec import StructuredOutputSpec
from sluice.tools.tool_format import ToolCallFormat

T = TypeVar("T")
RequestKind = Literal["completion", "chat"]

# The API's own sampling defaults (no override).
API_DEFAULTS = GenerationDefaults()
# Completions default; chat's default is the rest of the context.
DEFAULT_COMPLETION_MAX_TOKENS = 16
# Engine requests one API request may fan out to (prompts x n).
MAX_CHOICES_PER_REQUEST = 1024


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """What `to_internal` needs to know about the served model."""

    served_model_name: str
    preprocessor: Preprocessor
    limits: RequestLimits = field(default_factory=RequestLimits)
    # Chat outputs: the tool-call format (given, chosen from the chat template,
    # or the default the server shows) and the reasoning parser.
    tool_format: ToolCallFormat = field(default_factory=ToolCallFormat)
    reasoning_parser: str | None = None
    # How structured-output specs are compiled to check them.
    grammar_check: GrammarCheck = field(default_factory=GrammarCheck)
    # The engine schedules by priority (`priority` is refused otherwise, as vLLM does).
    is_priority_scheduling: bool = False
    # What a request that leaves a sampling field unset gets (--override-generation-config).
    generation_defaults: GenerationDefaults = field(default_factory=GenerationDefaults)
    # The thinking budget of each reasoning effort (--reasoning-effort-budgets).
    reasoning_effort_budgets: ReasoningEffortBudgets = field(default_factory=ReasoningEffortBudgets)


def check_model(requested: str | None, served_model_name: str) -> str:
    """The model name to echo; a name other than the served one is a 404."""
    if requested is None or requested == served_model_name:
        return served_model_name
    raise ModelNotFoundError(
        f"The model `{requested[:100]}` does not exist; this server serves `{served_model_name}`.",
        param="model",
        code="model_not_found",
    )


async def completion_request(
    body: protocol.CompletionRequest, options: RequestOptions
) -> GenerationRequest:
    model_name = check_model(body.model, options.served_model_name)
    limits.check_body(body, options.limits)
    _check_priority(body.priority, options)
    n = body.n or 1
    _refuse_unsupported_completion_fields(body, n)
    stream = _check_stream_options(body)
    structured = await structured_output(body, options.grammar_check)
    prompts = await _completion_prompts(body, n, options.preprocessor)
    limits.check_prompts(prompts, options.limits, "prompt")
    echo = _default(body.echo, False)
    is_echo_only = echo and body.max_tokens == 0
    requested_max_tokens = (
        1
        if is_echo_only
        else body.max_tokens
        or options.generation_defaults.max_new_tokens
        or DEFAULT_COMPLETION_MAX_TOKENS
    )
    max_tokens = effective_max_tokens(
        requested_max_tokens, prompts, options.preprocessor, options.limits.max_tokens,
        prompt_param="prompt",
    )  # fmt: skip
    params = sampling_params(
        body, max_tokens, body.logprobs, options.preprocessor, structured,
        options.generation_defaults,
    )  # fmt: skip
    # Echoed logprobs need the prompt's, as in vLLM.
    params = _with_prompt_logprobs(params, body, stream, body.logprobs if echo else None)
    request = _generation_request(body, "completion", model_name, prompts, n, params, stream, echo)
    request = _with_default_stop(request, body, options.generation_defaults)
    return dataclasses.replace(request, is_echo_only=is_echo_only)


async def chat_request(
    body: protocol.ChatCompletionRequest,
    options: RequestOptions,
    *,
    clamps_max_tokens: bool = False,
) -> GenerationRequest:
    """`clamps_max_tokens`: a max_tokens beyond what the context leaves is cut
    to fit instead of refused (the agent APIs: Claude Code asks for 32,000);
    the policy: `sluice.apis.max_tokens`."""
    model_name = check_model(body.model, options.served_model_name)
    limits.check_body(body, options.limits)
    _check_priority(body.priority, options)
    n = body.n or 1
    logprobs = _chat_logprobs(body)
    stream = _check_stream_options(body)
    structured = await structured_output(body, options.grammar_check)
    # The grammar holds from the first token, so no reasoning comes to split
    # off: the parser would take the whole output for reasoning.
    reasoning_parser = None if structured is not None else options.reasoning_parser
    tools = await tool_fields.tool_plan(
        body, options.tool_format, reasoning_parser, structured, options.grammar_check
    )
    structured = tools.structured_output
    messages, template_tools = template_inputs(
        chat_messages(body.messages), tools.template_tools, options.tool_format
    )
    template = reasoning_fields.template_reasoning(options.preprocessor.tokenizer)
    reasoning = reasoning_fields.reasoning_plan(body, template, options.reasoning_effort_budgets)
    prompt = await options.preprocessor.chat_prompt(
        messages,
        add_generation_prompt=_default(body.add_generation_prompt, True),
        add_special_tokens=_default(body.add_special_tokens, False),
        tools=template_tools,
        template_kwargs=reasoning.template_kwargs,
    )
    limits.check_prompts([prompt], options.limits, "messages")
    requested_max_tokens = (
        body.max_completion_tokens or body.max_tokens or options.generation_defaults.max_new_tokens
    )
    max_tokens = effective_max_tokens(
        requested_max_tokens, [prompt], options.preprocessor, options.limits.max_tokens,
        prompt_param="messages", is_clamped_to_context=clamps_max_tokens,
    )  # fmt: skip
    params = sampling_params(
        body, max_tokens, logprobs, options.preprocessor, structured, options.generation_defaults
    )
    params = _with_prompt_logprobs(params, body, stream, None)
    budget = reasoning_fields.thinking_budget(reasoning, template, tools, prompt)
    params = msgspec.structs.replace(params, thinking_budget=budget)
    request = _generation_request(body, "chat", model_name, (prompt,), n, params, stream, False)
    request = _with_default_stop(request, body, options.generation_defaults)
    if tools.reads_special_tokens:
        request = replace(request, skip_special_tokens=False)
    return replace(request, output_parsing=tools.output_parsing)


def sampling_params(
    body: protocol.SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    preprocessor: Preprocessor,
    structured_output: StructuredOutputSpec | None = None,
    defaults: GenerationDefaults = API_DEFAULTS,
) -> SamplingParams:
    """`defaults`: what a field the body leaves unset takes (the API's own
    defaults unless the server overrides them)."""
    min_tokens = body.min_tokens or 0
    if min_tokens > max_tokens:
        raise InvalidRequestError(
            f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})",
            param="min_tokens",
        )
    stop_token_ids = tuple(body.stop_token_ids or ())
    preprocessor.check_token_ids(stop_token_ids, "stop_token_ids")
    return SamplingParams(
        temperature=_default(body.temperature, _default(defaults.temperature, 1.0)),
        top_p=_default(body.top_p, _default(defaults.top_p, 1.0)),
        top_k=_default(body.top_k, _default(defaults.top_k, 0)),
        min_p=_default(body.min_p, _default(defaults.min_p, 0.0)),
        presence_penalty=_default(body.presence_penalty, _default(defaults.presence_penalty, 0.0)),
        frequency_penalty=_default(
            body.frequency_penalty, _default(defaults.frequency_penalty, 0.0)
        ),
        repetition_penalty=_default(
            body.repetition_penalty, _default(defaults.repetition_penalty, 1.0)
        ),
        logit_bias=logit_bias(body.logit_bias, preprocessor),
        seed=body.seed,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop_token_ids=stop_token_ids,
        ignore_eos=_default(body.ignore_eos, False),
        logprobs=logprobs,
        structured_output=structured_output,
        priority=body.priority or 0,
    )


def _with_default_stop(
    request: GenerationRequest, body: protocol.SamplingFields, defaults: GenerationDefaults
) -> GenerationRequest:
    if body.stop is not None or not defaults.stop_strings:
        return request
    return replace(request, stop=defaults.stop_strings)


def _check_priority(priority: int | None, options: RequestOptions) -> None:
    if priority and not options.is_priority_scheduling:
        raise InvalidRequestError(
            "priority needs a server started with --scheduling-policy priority; "
            "this one schedules first come, first served",
            param="priority",
        )


def logit_bias(bias: dict[str, float] | None, preprocessor: Preprocessor) -> dict[int, float]:
    """OpenAI's string-keyed bias as token id -> bias, every id checked.

    A key is a token id in ASCII decimal digits, nothing else: `int()` would
    also take signs, spaces, underscores and other scripts' digits ("١٢"),
    and `str.isdigit()` passes digits `int()` refuses ("²")."""
    if not bias:
        return {}
    biases: dict[int, float] = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()) or len(key) > 20:
            raise InvalidRequestError(
                f"logit_bias keys must be token ids in decimal digits, got {key[:40]!r}",
                param="logit_bias",
            )
        biases[int(key)] = value
    preprocessor.check_token_ids(list(biases), "logit_bias")
    return biases


def chat_messages(messages: list[protocol.ChatMessage] | None) -> list[ChatMessage]:
    if messages is None:
        raise InvalidRequestError("'messages' is required", param="messages")
    return [_chat_message(message, index) for index, message in enumerate(messages)]


def _chat_message(message: protocol.ChatMessage, index: int) -> ChatMessage:
    return ChatMessage(
        role=message.role,
        content=_message_text(message, index),
        name=message.name,
        tool_call_id=message.tool_call_id,
        tool_calls=tool_fields.message_tool_calls(message, index),
    )


def _message_text(message: protocol.ChatMessage, index: int) -> str:
    content = message.content
    if content is None:
        # Assistant turns may carry only tool calls; every other turn needs text.
        if message.role == "assistant":
            return ""
        raise InvalidRequestError(
            f"a {message.role} message needs content", param=f"messages[{index}].content"
        )
    if isinstance(content, str):
        return content
    texts = []
    for part_index, part in enumerate(content):
        param = f"messages[{index}].content[{part_index}]"
        if part.type != "text":
            raise InvalidRequestError(
                f"content part type {part.type[:40]!r} is not supported; only 'text' is",
                param=f"{param}.type",
            )
        if part.text is None:
            raise InvalidRequestError("a text content part needs 'text'", param=f"{param}.text")
        texts.append(part.text)
    # vLLM joins text parts with newlines; so do we, so templates see the same text.
    return "\n".join(texts)


async def _completion_prompts(
    body: protocol.CompletionRequest, n: int, preprocessor: Preprocessor
) -> tuple[PromptInput, ...]:
    prompt = body.prompt
    if prompt is None:
        raise InvalidRequestError("'prompt' is required", param="prompt")
    batch = _prompt_batch(prompt)
    if not batch:
        raise InvalidRequestError("the prompt list is empty", param="prompt")
    if len(batch) * n > MAX_CHOICES_PER_REQUEST:
        raise InvalidRequestError(
            f"{len(batch)} prompts x n={n} exceeds {MAX_CHOICES_PER_REQUEST} choices per request",
            param="n",
        )
    add_special_tokens = _default(body.add_special_tokens, True)
    echo = _default(body.echo, False)
    prompts = []
    for index, item in enumerate(batch):
        param = "prompt" if len(batch) == 1 else f"prompt[{index}]"
        if isinstance(item, str):
            prompts.append(await preprocessor.text_prompt(item, add_special_tokens, param))
        else:
            prompts.append(await preprocessor.token_prompt(item, param, needs_text=echo))
    return tuple(prompts)


def _prompt_batch(
    prompt: str | list[str] | list[int] | list[list[int]],
) -> Sequence[str | Sequence[int]]:
    """The prompt as a list of single prompts (a string or a token-id list each)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(item, int) for item in prompt):
        return [prompt]  # type: ignore[list-item]
    return prompt  # type: ignore[return-value]


def _refuse_unsupported_completion_fields(body: protocol.CompletionRequest, n: int) -> None:
    if body.suffix:
        raise InvalidRequestError("suffix is not supported", param="suffix")
    if body.max_tokens == 0 and not body.echo:
        raise InvalidRequestError("max_tokens 0 needs echo", param="max_tokens")
    if body.best_of is not None and body.best_of != n:
        raise InvalidRequestError(
            f"best_of ({body.best_of}) must equal n ({n}): sluice returns every sample",
            param="best_of",
        )


def _check_stream_options(body: protocol.SamplingFields) -> bool:
    stream = _default(body.stream, False)
    if body.stream_options is not None and not stream:
        raise InvalidRequestError(
            "stream_options is only allowed when stream is true", param="stream_options"
        )
    return stream


def _with_prompt_logprobs(
    params: SamplingParams, body: protocol.SamplingFields, stream: bool, default: int | None
) -> SamplingParams:
    """`params` asking for the prompt's logprobs: `prompt_logprobs`, else `default`."""
    prompt_logprobs = body.prompt_logprobs
    if prompt_logprobs is not None and stream:
        raise InvalidRequestError(
            "prompt_logprobs are not available when stream is true", param="prompt_logprobs"
        )
    if prompt_logprobs is None:
        prompt_logprobs = default
    if prompt_logprobs is None:
        return params
    return msgspec.structs.replace(params, prompt_logprobs=prompt_logprobs)


def _chat_logprobs(body: protocol.ChatCompletionRequest) -> int | None:
    if body.logprobs:
        return body.top_logprobs or 0
    if body.top_logprobs:
        raise InvalidRequestError("top_logprobs requires logprobs to be true", param="top_logprobs")
    return None


def _generation_request(
    body: protocol.SamplingFields,
    kind: RequestKind,
    model_name: str,
    prompts: tuple[PromptInput, ...],
    n: int,
    params: SamplingParams,
    stream: bool,
    echo: bool,
) -> GenerationRequest:
    _check_seed_room(params.seed, len(prompts) * n)
    stream_options = body.stream_options or protocol.StreamOptions()
    prefix = "cmpl" if kind == "completion" else "chatcmpl"
    return GenerationRequest(
        kind=kind,
        response_id=f"{prefix}-{uuid.uuid4().hex}",
        created=int(time.time()),
        model_name=model_name,
        prompts=prompts,
        n=n,
        params=params,
        stop=_stop_strings(body.stop),
        include_stop_str_in_output=_default(body.include_stop_str_in_output, False),
        skip_special_tokens=_default(body.skip_special_tokens, True),
        spaces_between_special_tokens=_default(body.spaces_between_special_tokens, True),
        stream=stream,
        include_usage=bool(stream_options.include_usage),
        # As vLLM: continuous usage only alongside include_usage.
        continuous_usage_stats=bool(
            stream_options.include_usage and stream_options.continuous_usage_stats
        ),
        echo=echo,
        logprobs=params.logprobs,
    )


def _stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    strings = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(not s for s in strings):
        raise InvalidRequestError("stop strings must not be empty", param="stop")
    return strings


def _check_seed_room(seed: int | None, num_choices: int) -> None:
    # Choice i is sampled with seed + i: every one of them must stay a 64-bit int.
    if seed is not None and seed + num_choices - 1 > protocol.INT64_MAX:
        raise InvalidRequestError(
            f"seed must be at most {protocol.INT64_MAX - num_choices + 1} for {num_choices} choices",
            param="seed",
        )


def _default(value: T | None, default: T) -> T:
    return default if value is None else value
