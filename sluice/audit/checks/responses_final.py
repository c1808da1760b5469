"""Checks of a Responses API answer's final object: the body of a
non-streamed answer, the `response` of a stream's terminal event.

Invariants (the ids are in catalogue.py):
- `responses_truncation`: an answer that used all of `max_output_tokens` is
  `incomplete` with `incomplete_details.reason` "max_output_tokens" (a
  stream's terminal event is then `response.incomplete`), never `completed`;
  an `incomplete` one names that reason only when it did use them all;
- `responses_usage`: usage is there, in whole numbers, with total = input +
  output; a greedy stream's output_tokens are its non-streamed twin's;
- `responses_invalid_arguments`: a function call names a given tool and its
  arguments are a JSON object, `{}` for a tool without parameters;
- `tools_no_call`: a forced call (`tool_choice` required or named) is missing
  from an answer that was not cut;
- `responses_logprobs`: asked for (`include` message.output_text.logprobs),
  a message's text comes with entries, and a stream's entries are those of
  its `.done` event and, token for token, its twin's;
- `responses_stream_mismatch`: the stream's final object differs from its
  greedy non-streamed twin (status, items: text, tool names, arguments; ids
  aside).
"""

from __future__ import annotations

import json
from typing import Any

from sluice.audit.agent_events import read_events
from sluice.audit.checks.evidence import finding
from sluice.audit.checks.responses import TERMINAL
from sluice.audit.records import RESPONSES, Exchange, Finding
from sluice.audit.stream_view import StreamView

LOGPROBS_INCLUDE = "message.output_text.logprobs"


def final_response(exchange: Exchange) -> tuple[dict[str, Any] | None, list[int]]:
    """The final object, with the numbers of the events that carry it."""
    if not exchange.is_ok:
        return None, []
    if not exchange.is_stream:
        try:
            body = json.loads(exchange.raw)
        except ValueError:
            return None, []
        return (body if isinstance(body, dict) else None), []
    terminals = [e for e in read_events(exchange).events if e.type in TERMINAL and e.payload]
    if not terminals:
        return None, []
    response = terminals[-1].payload.get("response")
    return (response if isinstance(response, dict) else None), [terminals[-1].number]


def check_responses_final(exchange: Exchange, view: StreamView) -> list[Finding]:
    if exchange.endpoint != RESPONSES:
        return []
    response, numbers = final_response(exchange)
    if response is None or response.get("status") == "failed":
        return []
    body = exchange.body or {}
    problems = _truncation(response, body) + _usage(response) + _calls(response, body)
    problems += _logprobs(response, body)
    return [finding(check_id, exchange, message, numbers, view=view)
            for check_id, message in problems]  # fmt: skip


def _output_tokens(response: dict[str, Any]) -> int | None:
    usage = response.get("usage")
    tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) else None


def _truncation(response: dict[str, Any], body: dict[str, Any]) -> list[tuple[str, str]]:
    limit, used = body.get("max_output_tokens"), _output_tokens(response)
    if not isinstance(limit, int) or used is None:
        return []
    status = response.get("status")
    reason = (response.get("incomplete_details") or {}).get("reason")
    is_cut = used >= limit
    if is_cut and (status != "incomplete" or reason != "max_output_tokens"):
        message = (f"{used} output tokens of max_output_tokens {limit}, yet status {status!r} "
                   f"and incomplete reason {reason!r}")  # fmt: skip
        return [("responses_truncation", message)]
    if not is_cut and reason == "max_output_tokens":
        message = f"incomplete for max_output_tokens {limit} after {used} output tokens"
        return [("responses_truncation", message)]
    return []


def _usage(response: dict[str, Any]) -> list[tuple[str, str]]:
    usage = response.get("usage")
    if not isinstance(usage, dict):
        return [("responses_usage", f"usage is {usage!r}")]
    counts = [usage.get(key) for key in ("input_tokens", "output_tokens", "total_tokens")]
    if not all(isinstance(count, int) and count >= 0 for count in counts):
        return [("responses_usage", f"usage counts {counts} are not whole numbers")]
    if counts[2] != counts[0] + counts[1]:
        return [("responses_usage", f"total_tokens {counts[2]} != {counts[0]} + {counts[1]}")]
    return []


def tool_parameters(tools: Any) -> dict[str, dict[str, Any]]:
    """Function tools by name: their parameter properties (empty: no arguments)."""
    found = {}
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            schema = tool.get("parameters") or tool.get("input_schema") or {}
            found[tool["name"]] = schema.get("properties") or {}
    return found


def is_forced(tool_choice: Any) -> bool:
    """Whether `tool_choice` forces a call (Responses: required or named; Messages: any or tool)."""
    if tool_choice == "required":
        return True
    return isinstance(tool_choice, dict) and tool_choice.get("type") in ("function", "any", "tool")


def arguments_problem(name: Any, arguments: Any, tools: dict[str, dict[str, Any]]) -> str | None:
    """What is wrong with a call's arguments (a JSON text, or a decoded object)."""
    if name not in tools:
        return f"{str(name)[:40]!r} is not one of the tools"
    value = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError as error:
            return f"arguments are not JSON ({error}): {arguments[:80]!r}"
    if not isinstance(value, dict):
        return f"arguments are not a JSON object: {str(arguments)[:80]!r}"
    if not tools[name] and value != {}:
        return f"{name} takes no arguments, yet got {str(arguments)[:80]!r}"
    return None


def _calls(response: dict[str, Any], body: dict[str, Any]) -> list[tuple[str, str]]:
    tools = tool_parameters(body.get("tools"))
    output = response.get("output") if isinstance(response.get("output"), list) else []
    calls = [
        item for item in output if isinstance(item, dict) and item.get("type") == "function_call"
    ]
    problems = []
    if response.get("status") == "incomplete":
        calls = calls[:-1]  # the last call may have been cut mid-arguments
    for call in calls:
        problem = arguments_problem(call.get("name"), call.get("arguments"), tools)
        if problem is not None:
            problems.append(("responses_invalid_arguments", problem))
    if is_forced(body.get("tool_choice")) and not calls and response.get("status") == "completed":
        problems.append(("tools_no_call", f"a forced tool call completed with {len(output)} "
                         "items and no function_call"))  # fmt: skip
    return problems


def wants_logprobs(body: dict[str, Any]) -> bool:
    include = body.get("include")
    return isinstance(include, list) and LOGPROBS_INCLUDE in include


def message_entries(response: dict[str, Any]) -> tuple[str, list[Any]]:
    """The text of the message items and their logprob entries, joined."""
    text, entries = "", []
    for item in response.get("output") or []:
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") == "output_text":
                    text += str(part.get("text", ""))
                    entries += part.get("logprobs") or []
    return text, entries


def _logprobs(response: dict[str, Any], body: dict[str, Any]) -> list[tuple[str, str]]:
    if not wants_logprobs(body):
        return []
    text, entries = message_entries(response)
    if text and not entries:
        return [("responses_logprobs", f"{len(text)} characters of text and no logprob entry")]
    return []


def outline(response: dict[str, Any]) -> dict[str, Any]:
    """What a stream and its greedy twin must share: status and items, ids aside."""
    items = []
    for item in response.get("output") or []:
        item = item if isinstance(item, dict) else {}
        kind = item.get("type")
        if kind in ("message", "reasoning"):
            parts = item.get("content") or []
            items.append((kind, [p.get("text") for p in parts if isinstance(p, dict)]))
        elif kind in ("function_call", "custom_tool_call"):
            items.append((kind, item.get("name"), item.get("arguments", item.get("input"))))
        else:
            items.append((kind,))
    reason = (response.get("incomplete_details") or {}).get("reason")
    return {"status": response.get("status"), "incomplete": reason, "output": items}


def check_responses_twin(exchange: Exchange, view: StreamView) -> list[Finding]:
    """The stream against its non-streamed twin, and its deltas' logprobs."""
    if exchange.endpoint != RESPONSES or not exchange.is_stream:
        return []
    streamed, numbers = final_response(exchange)
    if streamed is None or streamed.get("status") == "failed":
        return []
    problems = _streamed_entries(exchange, streamed)
    whole = final_response(exchange.twin)[0] if exchange.twin is not None else None
    twin_body = (exchange.twin.body if exchange.twin is not None else None) or {}
    if whole is not None and whole.get("status") != "failed":
        # A twin without logprobs (the backpressure scenario's control) has no tokens to compare.
        has_logprobs = wants_logprobs(exchange.body or {}) and wants_logprobs(twin_body)
        problems += _twin_problems(streamed, whole, has_logprobs)
    return [finding(check_id, exchange, message, numbers, view=view)
            for check_id, message in problems]  # fmt: skip


def _twin_problems(
    streamed: dict[str, Any], whole: dict[str, Any], has_logprobs: bool
) -> list[tuple[str, str]]:
    mine, theirs = outline(streamed), outline(whole)
    if mine != theirs:
        differing = next(key for key in mine if mine[key] != theirs[key])
        message = (f"{differing}: streamed {str(mine[differing])[:160]} vs non-streamed "
                   f"{str(theirs[differing])[:160]}")  # fmt: skip
        return [("responses_stream_mismatch", message)]
    problems = []
    used, twin_used = _output_tokens(streamed), _output_tokens(whole)
    if used != twin_used:
        message = f"output_tokens {used} streamed, {twin_used} non-streamed, for the same items"
        problems.append(("responses_usage", message))
    tokens = [_token(e) for e in message_entries(streamed)[1]]
    twin_tokens = [_token(e) for e in message_entries(whole)[1]]
    if has_logprobs and tokens != twin_tokens:
        message = f"{len(tokens)} streamed logprob tokens vs {len(twin_tokens)} non-streamed"
        problems.append(("responses_logprobs", message))
    return problems


def _token(entry: Any) -> Any:
    return entry.get("token") if isinstance(entry, dict) else entry


def _streamed_entries(exchange: Exchange, streamed: dict[str, Any]) -> list[tuple[str, str]]:
    """The entries the text deltas carried are those of the final message."""
    if not wants_logprobs(exchange.body or {}):
        return []
    entries = []
    for event in read_events(exchange).events:
        if event.type == "response.output_text.delta" and event.payload is not None:
            entries += event.payload.get("logprobs") or []
    final = message_entries(streamed)[1]
    if entries != final:
        message = (
            f"the text deltas carried {len(entries)} logprob entries, the response {len(final)}"
        )
        return [("responses_logprobs", message)]
    return []
