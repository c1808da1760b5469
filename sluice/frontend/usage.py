"""Token usage of one API request, counted on the consumer side: the
request's one count of delivered tokens.

The frontend adds each delta's tokens just before its projection renders or
folds it (sluice/frontend/serving.py `delivered_event`); the projection's
usage, the access log, the API key's spend and the span all read this
count. Counts only what was delivered, so a continuous-usage chunk can never run
ahead of the tokens it accompanies. Prompt tokens count once per prompt, as
OpenAI and vLLM do for n > 1: choice i of prompt p (index p * n + i) shares
prompt p's count; the totals sum the prompts and all choices' completions.
`prompt_tokens_details.cached_tokens` is the part of the prompt tokens the
engine found in its prefix cache: per prompt, as its first choice found it.
"""

from __future__ import annotations

from typing import Any

from sluice.frontend.request import GenerationRequest


class UsageCounter:
    __slots__ = ("_n", "_num_prompt_tokens", "_num_completion_tokens", "_num_cached_tokens")

    def __init__(self, request: GenerationRequest):
        self._n = request.n
        # Per prompt.
        self._num_prompt_tokens = [len(prompt.token_ids) for prompt in request.prompts]
        # Per choice index: tokens delivered so far.
        self._num_completion_tokens = [0] * request.num_choices
        # Per choice index: prompt tokens its engine request found cached.
        self._num_cached_tokens = [0] * request.num_choices

    def add(self, index: int, num_tokens: int, num_cached_tokens: int = 0) -> None:
        self._num_completion_tokens[index] += num_tokens
        self._num_cached_tokens[index] = num_cached_tokens

    def num_completion_tokens(self, index: int) -> int:
        return self._num_completion_tokens[index]

    def num_all_completion_tokens(self) -> int:
        """Delivered over every choice."""
        return sum(self._num_completion_tokens)

    def for_choice(self, index: int) -> dict[str, Any]:
        """Cumulative usage of one choice: its prompt and its delivered tokens."""
        prompt = self._num_prompt_tokens[index // self._n]
        cached = self._num_cached_tokens[index]
        return _usage(prompt, self._num_completion_tokens[index], cached)

    def total(self) -> dict[str, Any]:
        cached = sum(self._num_cached_tokens[:: self._n])
        return _usage(sum(self._num_prompt_tokens), sum(self._num_completion_tokens), cached)


def _usage(num_prompt: int, num_completion: int, num_cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
        "prompt_tokens_details": {"cached_tokens": num_cached},
    }
