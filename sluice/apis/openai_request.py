"""What completions and chat share on the way from a validated body to the
frozen `GenerationRequest` (with `SamplingParams`): the served model's
options (`RequestOptions`), the model name, sampling fields and their
defaults, stop strings, stream options, logprobs of the prompt, priority and
seeds, each refused with a typed `RequestError` naming the field. The
max_tokens policy is `sluice.apis.max_tokens`; each API's own fields are its
`to_internal` (apis/completions, apis/chat), and the agent APIs convert
through chat's.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar

import msgspec

from sluice.apis.openai_protocol import INT64_MAX, SamplingFields, StreamOptions
from sluice.apis.rules.structured_fields import GrammarCheck
from sluice.config import GenerationDefaults, ReasoningEffortBudgets, RequestLimits
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import InvalidRequestError, ModelNotFoundError
from sluice.frontend.preprocess import Preprocessor
from sluice.frontend.request import GenerationRequest, PromptInput
from sluice.structured.spec import StructuredOutputSpec
from sluice.tools.tool_format import ToolCallFormat

T = TypeVar("T")
RequestKind = Literal["completion", "chat"]

# The API's own sampling defaults (no override).
API_DEFAULTS = GenerationDefaults()


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """What the `to_internal` modules need to know about the served model."""

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


def sampling_params(
    body: SamplingFields,
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
        temperature=or_default(body.temperature, or_default(defaults.temperature, 1.0)),
        top_p=or_default(body.top_p, or_default(defaults.top_p, 1.0)),
        top_k=or_default(body.top_k, or_default(defaults.top_k, 0)),
        min_p=or_default(body.min_p, or_default(defaults.min_p, 0.0)),
        presence_penalty=or_default(
            body.presence_penalty, or_default(defaults.presence_penalty, 0.0)
        ),
        frequency_penalty=or_default(
            body.frequency_penalty, or_default(defaults.frequency_penalty, 0.0)
        ),
        repetition_penalty=or_default(
            body.repetition_penalty, or_default(defaults.repetition_penalty, 1.0)
        ),
        logit_bias=logit_bias(body.logit_bias, preprocessor),
        seed=body.seed,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop_token_ids=stop_token_ids,
        ignore_eos=or_default(body.ignore_eos, False),
        logprobs=logprobs,
        structured_output=structured_output,
        priority=body.priority or 0,
    )


def with_default_stop(
    request: GenerationRequest, body: SamplingFields, defaults: GenerationDefaults
) -> GenerationRequest:
    if body.stop is not None or not defaults.stop_strings:
        return request
    return replace(request, stop=defaults.stop_strings)


def check_priority(priority: int | None, options: RequestOptions) -> None:
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


def check_stream_options(body: SamplingFields) -> bool:
    stream = or_default(body.stream, False)
    if body.stream_options is not None and not stream:
        raise InvalidRequestError(
            "stream_options is only allowed when stream is true", param="stream_options"
        )
    return stream


def with_prompt_logprobs(
    params: SamplingParams, body: SamplingFields, stream: bool, default: int | None
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


def generation_request(
    body: SamplingFields,
    kind: RequestKind,
    model_name: str,
    prompts: tuple[PromptInput, ...],
    n: int,
    params: SamplingParams,
    stream: bool,
    echo: bool,
) -> GenerationRequest:
    _check_seed_room(params.seed, len(prompts) * n)
    stream_options = body.stream_options or StreamOptions()
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
        include_stop_str_in_output=or_default(body.include_stop_str_in_output, False),
        skip_special_tokens=or_default(body.skip_special_tokens, True),
        spaces_between_special_tokens=or_default(body.spaces_between_special_tokens, True),
        stream=stream,
        include_usage=bool(stream_options.include_usage),
        # As vLLM: continuous usage only alongside include_usage.
        continuous_usage_stats=bool(
            stream_options.include_usage and stream_options.continuous_usage_stats
        ),
        echo=echo,
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
    if seed is not None and seed + num_choices - 1 > INT64_MAX:
        raise InvalidRequestError(
            f"seed must be at most {INT64_MAX - num_choices + 1} for {num_choices} choices",
            param="seed",
        )


def or_default(value: T | None, default: T) -> T:
    return default if value is None else value
