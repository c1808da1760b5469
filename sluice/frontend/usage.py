"""Token usage of one API request, counted on the consumer side.

Counts only what was delivered, so a continuous-usage chunk can never run
ahead of the tokens it accompanies. Prompt tokens count once per prompt, as
OpenAI and vLLM do for n > 1: choice i of prompt p (index p * n + i) shares
prompt p's count; the totals sum the prompts and all choices' completions.
"""

from __future__ import annotations

from sluice.frontend.request import GenerationRequest


class UsageCounter:
    __slots__ = ("_n", "_num_prompt_tokens", "_num_completion_tokens")

    def __init__(self, request: GenerationRequest):
        self._n = request.n
        # Per prompt.
        self._num_prompt_tokens = [len(prompt.token_ids) for prompt in request.prompts]
        # Per choice index: tokens delivered so far.
        self._num_completion_tokens = [0] * request.num_choices

    def add(self, index: int, num_tokens: int) -> None:
        self._num_completion_tokens[index] += num_tokens

    def num_completion_tokens(self, index: int) -> int:
        return self._num_completion_tokens[index]

    def for_choice(self, index: int) -> dict[str, int]:
        """Cumulative usage of one choice: its prompt and its delivered tokens."""
        prompt = self._num_prompt_tokens[index // self._n]
        return _usage(prompt, self._num_completion_tokens[index])

    def total(self) -> dict[str, int]:
        return _usage(sum(self._num_prompt_tokens), sum(self._num_completion_tokens))


def _usage(num_prompt_tokens: int, num_completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
    }
