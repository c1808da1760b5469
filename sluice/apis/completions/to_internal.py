"""A validated `/v1/completions` body -> frozen `GenerationRequest`.

Pydantic has already checked types and ranges (protocol.py); this module
checks what needs the served model or relates several fields (n against
best_of, echo with max_tokens 0, suffix), tokenizes each prompt (strings or
token ids) through the `Preprocessor`, and raises a typed `RequestError`
naming the field for anything it refuses. What it shares with chat (sampling
fields, stop strings, stream options, priority, seeds):
`sluice.apis.openai_request`; its max_tokens: capped by the server's limit,
then fitted to the context (`sluice.apis.max_tokens`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sluice.apis.completions.protocol import CompletionRequest
from sluice.apis.max_tokens import effective_max_tokens
from sluice.apis.openai_request import (
    RequestOptions,
    check_model,
    check_priority,
    check_stream_options,
    generation_request,
    or_default,
    sampling_params,
    with_default_stop,
    with_prompt_logprobs,
)
from sluice.apis.rules.structured_fields import structured_output
from sluice.errors import InvalidRequestError
from sluice.frontend.preprocess import Preprocessor
from sluice.frontend.request import GenerationRequest, PromptInput
from sluice.server.body import limits

# Completions default; chat's default is the rest of the context.
DEFAULT_COMPLETION_MAX_TOKENS = 16
# Engine requests one API request may fan out to (prompts x n).
MAX_CHOICES_PER_REQUEST = 1024


async def completion_request(body: CompletionRequest, options: RequestOptions) -> GenerationRequest:
    model_name = check_model(body.model, options.served_model_name)
    limits.check_body(body, options.limits)
    check_priority(body.priority, options)
    n = body.n or 1
    _refuse_unsupported_completion_fields(body, n)
    stream = check_stream_options(body)
    structured = await structured_output(body, options.grammar_check)
    prompts = await _completion_prompts(body, n, options.preprocessor)
    limits.check_prompts(prompts, options.limits, "prompt")
    echo = or_default(body.echo, False)
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
    params = with_prompt_logprobs(params, body, stream, body.logprobs if echo else None)
    request = generation_request(body, "completion", model_name, prompts, n, params, stream, echo)
    request = with_default_stop(request, body, options.generation_defaults)
    return dataclasses.replace(request, is_echo_only=is_echo_only)


async def _completion_prompts(
    body: CompletionRequest, n: int, preprocessor: Preprocessor
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
    add_special_tokens = or_default(body.add_special_tokens, True)
    echo = or_default(body.echo, False)
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


def _refuse_unsupported_completion_fields(body: CompletionRequest, n: int) -> None:
    if body.suffix:
        raise InvalidRequestError("suffix is not supported", param="suffix")
    if body.max_tokens == 0 and not body.echo:
        raise InvalidRequestError("max_tokens 0 needs echo", param="max_tokens")
    if body.best_of is not None and body.best_of != n:
        raise InvalidRequestError(
            f"best_of ({body.best_of}) must equal n ({n}): sluice returns every sample",
            param="best_of",
        )
