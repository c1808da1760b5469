"""Checks of an Anthropic Messages answer's message: the body of a
non-streamed answer, or what a stream's events accumulate to, and of its
errors.

Invariants (the ids are in catalogue.py):
- `messages_stop_reason`: stop_reason is end_turn / max_tokens /
  stop_sequence / tool_use and fits what happened: all of `max_tokens`
  used -> max_tokens (and max_tokens only then); a tool_use block in an
  answer not cut -> tool_use (and tool_use only with one);
- `messages_usage`: input_tokens and output_tokens are whole numbers; a
  greedy stream's output_tokens are its non-streamed twin's;
- `messages_invalid_input`: a tool_use block names a given tool and its input
  is a JSON object, `{}` for a tool without parameters;
- `tools_no_call`: a forced call (`tool_choice` any or tool) is missing from
  an answer not cut by max_tokens;
- `messages_stream_mismatch`: the accumulated message differs from its greedy
  non-streamed twin (blocks: text, thinking, tool names and inputs; the stop
  reason; ids aside);
- `messages_error_shape`: a 4xx body is not Anthropic's
  `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import json
from typing import Any

from sluice.audit.checks.evidence import finding
from sluice.audit.checks.messages import streamed_message
from sluice.audit.checks.responses_final import arguments_problem, is_forced, tool_parameters
from sluice.audit.checks.wire import check_status
from sluice.audit.records import MESSAGES, Exchange, Finding
from sluice.audit.stream_view import StreamView

STOP_REASONS = frozenset({"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn",
                          "refusal"})  # fmt: skip
# Ids check_status reports for OpenAI's error shape: Messages has its own.
_OPENAI_SHAPE_IDS = frozenset({"bad_error_shape", "error_param_missing", "request_refused"})


def final_message(exchange: Exchange) -> tuple[dict[str, Any] | None, list[int]]:
    if not exchange.is_ok:
        return None, []
    if exchange.is_stream:
        return streamed_message(exchange)
    try:
        body = json.loads(exchange.raw)
    except ValueError:
        return None, []
    return (body if isinstance(body, dict) else None), []


def check_messages_final(exchange: Exchange, view: StreamView) -> list[Finding]:
    if exchange.endpoint != MESSAGES:
        return []
    message, numbers = final_message(exchange)
    if message is None:
        return []
    body = exchange.body or {}
    problems = _stop_reason(message, body) + _usage(message) + _inputs(message, body)
    if exchange.is_stream and exchange.twin is not None:
        twin_message = final_message(exchange.twin)[0]
        problems += _twin_problems(message, twin_message) if twin_message else []
    return [finding(check_id, exchange, text, numbers, view=view)
            for check_id, text in problems]  # fmt: skip


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return (
        [block for block in content if isinstance(block, dict)] if isinstance(content, list) else []
    )


def _output_tokens(message: dict[str, Any]) -> int | None:
    usage = message.get("usage")
    tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) else None


def _stop_reason(message: dict[str, Any], body: dict[str, Any]) -> list[tuple[str, str]]:
    reason, limit, used = (
        message.get("stop_reason"),
        body.get("max_tokens"),
        _output_tokens(message),
    )
    has_tool_use = _has_tool_use(message)
    is_cut = isinstance(limit, int) and used is not None and used >= limit
    problem = None
    if reason not in STOP_REASONS:
        problem = f"stop_reason {reason!r}"
    elif is_cut and reason != "max_tokens":
        problem = f"stop_reason {reason!r} after {used} output tokens of max_tokens {limit}"
    elif reason == "max_tokens" and not is_cut:
        problem = f"stop_reason 'max_tokens' after {used} output tokens of max_tokens {limit}"
    elif has_tool_use and not is_cut and reason != "tool_use":
        problem = f"stop_reason {reason!r} for an answer with a tool_use block"
    elif reason == "tool_use" and not has_tool_use:
        problem = "stop_reason 'tool_use' without a tool_use block"
    return [("messages_stop_reason", problem)] if problem else []


def _usage(message: dict[str, Any]) -> list[tuple[str, str]]:
    usage = message.get("usage")
    counts = [usage.get(key) for key in ("input_tokens", "output_tokens")] if isinstance(
        usage, dict) else [None, None]  # fmt: skip
    if not all(isinstance(count, int) and count >= 0 for count in counts):
        return [("messages_usage", f"usage {usage!r} lacks whole input_tokens and output_tokens")]
    return []


def _inputs(message: dict[str, Any], body: dict[str, Any]) -> list[tuple[str, str]]:
    tools = tool_parameters(body.get("tools"))
    uses = [block for block in _blocks(message) if block.get("type") == "tool_use"]
    problems = []
    if message.get("stop_reason") == "max_tokens":
        uses = uses[:-1]  # the last call may have been cut mid-input
    for block in uses:
        problem = arguments_problem(block.get("name"), block.get("input"), tools)
        if problem is not None:
            problems.append(("messages_invalid_input", problem.replace("arguments", "input")))
    is_cut = message.get("stop_reason") == "max_tokens"
    if is_forced(body.get("tool_choice")) and not _has_tool_use(message) and not is_cut:
        problems.append(("tools_no_call", f"a forced tool call ended ({message.get('stop_reason')!r})"
                         " without a tool_use block"))  # fmt: skip
    return problems


def _has_tool_use(message: dict[str, Any]) -> bool:
    return any(block.get("type") == "tool_use" for block in _blocks(message))


def outline(message: dict[str, Any]) -> dict[str, Any]:
    """What a stream and its greedy twin must share, ids and signatures aside."""
    blocks = []
    for block in _blocks(message):
        kind = block.get("type")
        if kind == "tool_use":
            blocks.append((kind, block.get("name"), block.get("input")))
        else:
            blocks.append((kind, block.get("text", block.get("thinking"))))
    return {"content": blocks, "stop_reason": message.get("stop_reason"),
            "stop_sequence": message.get("stop_sequence")}  # fmt: skip


def _twin_problems(streamed: dict[str, Any], whole: dict[str, Any]) -> list[tuple[str, str]]:
    mine, theirs = outline(streamed), outline(whole)
    if mine != theirs:
        key = next(key for key in mine if mine[key] != theirs[key])
        message = (f"{key}: streamed {str(mine[key])[:160]} vs non-streamed "
                   f"{str(theirs[key])[:160]}")  # fmt: skip
        return [("messages_stream_mismatch", message)]
    used, twin_used = _output_tokens(streamed), _output_tokens(whole)
    if used != twin_used:
        message = f"output_tokens {used} streamed, {twin_used} non-streamed, for the same blocks"
        return [("messages_usage", message)]
    return []


def anthropic_error_problem(payload: Any) -> str | None:
    """What keeps a body from being Anthropic's error object; None when it is one."""
    if not isinstance(payload, dict) or payload.get("type") != "error":
        return 'not {"type": "error", "error": {...}}'
    error = payload.get("error")
    if not isinstance(error, dict):
        return "no error object"
    if not isinstance(error.get("type"), str) or not isinstance(error.get("message"), str):
        return "the error's type and message must be strings"
    return None


def check_messages_status(exchange: Exchange, view: StreamView) -> list[Finding]:
    """check_status with Anthropic's error shape in place of OpenAI's."""
    found = [f for f in check_status(exchange, view) if f.check_id not in _OPENAI_SHAPE_IDS]
    status = exchange.status
    if status is None or not 400 <= status < 500 or status == 422:
        return found
    try:
        payload = json.loads(exchange.raw)
    except ValueError:
        payload = None
    problem = anthropic_error_problem(payload)
    if problem is not None:
        found.append(finding("messages_error_shape", exchange, f"{status} body: {problem}"))
    elif not exchange.expects_error:
        said = str(payload["error"]["message"])[:160]
        found.append(finding("request_refused", exchange, f"{status}: {said}",
                             cause=f"{status} for a valid request"))  # fmt: skip
    return found
