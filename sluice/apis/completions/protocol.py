"""Pydantic model of the `/v1/completions` body (OpenAI's and vLLM's fields);
the fields it shares with chat and the rules every model follows:
`sluice.apis.openai_protocol`."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator

from sluice.apis.openai_protocol import INT64_MAX, Count, SamplingFields, TokenId, TopLogprobs


class CompletionRequest(SamplingFields):
    # A string, a list of strings, a list of token ids, or a list of token-id lists.
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]] | None = None
    best_of: Count | None = None
    echo: bool | None = None
    # 0 only with echo: the prompt alone comes back (lm-eval's loglikelihood).
    max_tokens: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = None
    logprobs: TopLogprobs | None = None
    suffix: str | None = None
    # vLLM extension: let the tokenizer add BOS and the like.
    add_special_tokens: bool | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _check_prompt_shape(cls, value: Any) -> Any:
        if value is None or isinstance(value, str) or is_prompt_list(value):
            return value
        raise ValueError(
            "prompt must be a string, a list of strings, a list of token ids "
            "or a list of token-id lists"
        )


def is_prompt_list(value: Any) -> bool:
    """Whether `value` is a list `prompt` accepts: all strings, ids or id lists."""
    if not isinstance(value, list):
        return False
    kinds = {_prompt_item_kind(item) for item in value}
    return len(kinds) <= 1 and None not in kinds


def _prompt_item_kind(item: Any) -> str | None:
    if isinstance(item, str):
        return "str"
    if isinstance(item, int) and not isinstance(item, bool):
        return "int"
    if isinstance(item, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in item):
        return "ids"
    return None
