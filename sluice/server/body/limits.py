"""Per-request bounds from `RequestLimits`, each a 400 naming the field.

Checked in two places by `to_internal`: `check_body` before any tokenization
(counts the client states outright: n, stop strings and their lengths,
logit_bias entries, max_tokens), `check_prompts` after it (prompt tokens). `cap_max_tokens` bounds
a default max_tokens (chat's "rest of the context") without refusing.
The protocol's fixed caps still apply first; these can only be stricter.
`check_parsed` runs earlier, by `sluice.server.body.body` on the parsed JSON before
pydantic sees it: counts that bound validation's own cost (chat messages,
logit_bias entries, which pydantic validates in one call).

JSON a client nests inside a field (a schema, a tool's parameters, an earlier
tool call's arguments) is at most MAX_JSON_DEPTH deep: `check_json_depth` for
a parsed value, `check_json_text_depth` for JSON text. Both count without
recursion; what reads the value later (deepcopy, msgspec, json, the chat
template, llguidance) recurses once per level.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from sluice.apis import openai_protocol
from sluice.config import RequestLimits
from sluice.errors import InvalidRequestError, PromptTooLongError
from sluice.frontend.request import PromptInput

# Deepest nesting of lists and objects in JSON a field carries ({} and [] are
# 1 deep): far beyond what schemas (OpenAI allows 10 levels of objects, ~20
# of JSON) or arguments need, and well within what readers recurse through
# (llguidance stops at 128, and the "required" schema nests the tools'
# parameters 6 deeper).
MAX_JSON_DEPTH = 64
# A JSON string, or the rest of the text from an unterminated one.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def check_parsed(
    data: dict[str, Any], model: type[openai_protocol.OpenAIModel], limits: RequestLimits
) -> None:
    """Counts in a parsed body, for the fields `model` reads, before validation."""
    messages = data.get("messages")
    if "messages" in model.model_fields and isinstance(messages, list):
        _at_most(len(messages), limits.max_chat_messages, "messages")
    logit_bias = data.get("logit_bias")
    if "logit_bias" in model.model_fields and isinstance(logit_bias, dict):
        _at_most(len(logit_bias), limits.max_logit_bias_entries, "logit_bias",
                 what="logit_bias entries")  # fmt: skip


def check_json_depth(value: object, param: str) -> None:
    """`value` (parsed JSON) nests at most MAX_JSON_DEPTH lists and dicts deep."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > MAX_JSON_DEPTH:
            _too_deep(param)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def check_json_text_depth(text: str, param: str) -> None:
    """JSON text opens at most MAX_JSON_DEPTH brackets at once outside strings:
    whether or not it is valid JSON, a parser goes no deeper than that."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    if max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0) > MAX_JSON_DEPTH:
        _too_deep(param)


def _too_deep(param: str) -> None:
    raise InvalidRequestError(
        f"{param} nests JSON more than this server's limit of {MAX_JSON_DEPTH} levels deep",
        param=param,
    )


def check_body(body: openai_protocol.SamplingFields, limits: RequestLimits) -> None:
    _at_most(body.n or 1, limits.max_n, "n")
    stop_strings = [body.stop] if isinstance(body.stop, str) else body.stop or []
    _at_most(len(stop_strings), limits.max_stop_strings, "stop", what="stop strings")
    for stop in stop_strings:
        _at_most(len(stop), limits.max_stop_string_chars, "stop",
                 what="characters in a stop string")  # fmt: skip
    _at_most(len(body.logit_bias or {}), limits.max_logit_bias_entries, "logit_bias",
             what="logit_bias entries")  # fmt: skip
    if limits.max_tokens is not None:
        for field in ("max_tokens", "max_completion_tokens"):
            value = getattr(body, field, None)
            if value is not None:
                _at_most(value, limits.max_tokens, field)


def check_prompts(prompts: Sequence[PromptInput], limits: RequestLimits, param: str) -> None:
    if limits.max_prompt_tokens is None:
        return
    for prompt in prompts:
        num_prompt_tokens = len(prompt.token_ids)
        if num_prompt_tokens > limits.max_prompt_tokens:
            raise PromptTooLongError(
                f"prompt tokens: {num_prompt_tokens}, more than this server's limit of "
                f"{limits.max_prompt_tokens}",
                num_prompt_tokens=num_prompt_tokens,
                max_prompt_tokens=limits.max_prompt_tokens,
                param=param,
            )


def cap_max_tokens(max_tokens: int, limits: RequestLimits) -> int:
    return max_tokens if limits.max_tokens is None else min(max_tokens, limits.max_tokens)


def _at_most(value: int, limit: int, param: str, what: str | None = None) -> None:
    if value > limit:
        raise InvalidRequestError(
            f"{what or param}: {value}, more than this server's limit of {limit}", param=param
        )
