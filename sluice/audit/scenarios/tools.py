"""Tool calls, streamed and not: `tool_choice` "required" and a named function.

Each case goes out three times, one after another: non-streamed (a warm-up,
which puts the prompt in a prefix cache if the server has one), streamed to a
slow reader (so deltas coalesce: one chunk may carry many tokens of a call),
then non-streamed again (the stream's twin). A greedy server owes the stream
and its twin the same calls.

Checks (invariants):
- `tools_stream_mismatch`: the calls accumulated from the stream's deltas
  (as the OpenAI SDK does: per index, the id, type and name once, then the
  argument fragments appended) differ from the twin's, by name or by
  arguments byte for byte;
- `tools_delta_malformed`: a call's first delta lacks its id, type or name,
  a later one repeats the name, or indices skip;
- `tools_invalid_arguments`: a call that finished is not named after a given
  tool, or its arguments are not a JSON object;
- `tools_no_call`: a request that forces a call finished without one.
A response cut by max_tokens is a note (`tools_cut_by_length`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sluice.audit.checks.evidence import finding
from sluice.audit.checks.exchange import ensure_view
from sluice.audit.records import CHAT, Exchange, Finding, Reader, ScenarioResult
from sluice.audit.scenarios.base import ScenarioContext
from sluice.audit.stream_view import ChoiceChunk
from sluice.audit.text_utils import first_difference

NAME = "tools"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 40},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The local time in a time zone.",
            "parameters": {
                "type": "object",
                "properties": {"timezone": {"type": "string", "maxLength": 40}},
                "required": ["timezone"],
                "additionalProperties": False,
            },
        },
    },
]
TOOL_NAMES = frozenset(tool["function"]["name"] for tool in TOOLS)
# (case, prompt, tool_choice)
CASES: tuple[tuple[str, str, Any], ...] = (
    ("required", "What is the weather in Zürich, and the time in Tokyo?", "required"),
    ("named", "Is it raining in Paris?",
     {"type": "function", "function": {"name": "get_weather"}}),
)  # fmt: skip


@dataclass(slots=True)
class Call:
    name: str
    arguments: str = ""


@dataclass(slots=True)
class Calls:
    """The calls of one choice, accumulated from its chunks."""

    calls: list[Call] = field(default_factory=list)
    # Malformed deltas: (chunk number, what is wrong).
    problems: list[tuple[int, str]] = field(default_factory=list)


async def run_tools(ctx: ScenarioContext) -> ScenarioResult:
    size = ctx.sizes.tools
    result = ctx.begin(NAME)
    reader = Reader("slow", size.slow_read_bytes, size.slow_read_interval_s)
    figures = {"calls_checked": 0.0, "streams_equal": 0.0}
    for position in range(size.requests):
        case, prompt, tool_choice = CASES[position % len(CASES)]
        body = ctx.body(CHAT, prompt, size.max_tokens, stream=True, tools=TOOLS,
                        tool_choice=tool_choice)  # fmt: skip
        warm_up = await ctx.send(NAME, CHAT, {**body, "stream": False}, f"tools/{case} warm-up")
        stream = await ctx.send(
            NAME, CHAT, body, f"tools/{case} slow reader", reader=reader, with_twin=True
        )
        result.exchanges += [warm_up, stream]
        for exchange in (warm_up, stream, stream.twin):
            found, num_calls = call_findings(exchange)
            result.findings += found
            figures["calls_checked"] += num_calls
        mismatch = stream_mismatch(stream)
        figures["streams_equal"] += mismatch is None and stream.is_ok
        result.findings += [mismatch] if mismatch else []
    result.figures.update(figures)
    return ctx.finish(result)


def accumulate_calls(chunks: list[ChoiceChunk], is_stream: bool) -> Calls:
    """The calls a client assembles from one choice's chunks (a non-streamed
    message has one chunk, whose entries are whole calls)."""
    found = Calls()
    for chunk in chunks:
        for position, entry in enumerate(chunk.tool_calls):
            if not isinstance(entry, dict) or not isinstance(entry.get("function"), dict):
                found.problems.append((chunk.number, f"tool_calls entry {entry!r:.80}"))
                continue
            index = entry.get("index") if is_stream else position
            problem = _entry_problem(entry, index, found.calls)
            if problem is not None:
                found.problems.append((chunk.number, problem))
                continue
            function = entry["function"]
            if index == len(found.calls):
                found.calls.append(Call(function["name"]))
            arguments = function.get("arguments") or ""
            found.calls[index].arguments += arguments if isinstance(arguments, str) else ""
    return found


def _entry_problem(entry: dict[str, Any], index: Any, calls: list[Call]) -> str | None:
    if not isinstance(index, int) or not 0 <= index <= len(calls):
        return f"index {index!r} after {len(calls)} calls"
    is_first = index == len(calls)
    has_name = entry["function"].get("name") is not None
    if is_first and not (entry.get("id") and entry.get("type") == "function" and has_name):
        return f"the first delta of call {index} lacks its id, type or name"
    if not is_first and has_name:
        return f"call {index} named again"
    return None


def call_findings(exchange: Exchange | None) -> tuple[list[Finding], int]:
    """Findings on choice 0's calls, and how many calls were checked."""
    if exchange is None or not exchange.is_ok:
        return [], 0  # the response checks report failed requests
    view = ensure_view(exchange)
    chunks = view.choices.get(0, [])
    found = accumulate_calls(chunks, exchange.is_stream)
    findings = [
        finding("tools_delta_malformed", exchange, problem, [number], view=view)
        for number, problem in found.problems
    ]
    finish_reason = next((c.finish_reason for c in reversed(chunks) if c.finish_reason), None)
    last = [chunks[-1].number] if chunks else []
    if finish_reason == "length":
        message = f"max_tokens cut the calls ({len(found.calls)} begun)"
        return [*findings, finding("tools_cut_by_length", exchange, message, last, view=view)], 0
    if not found.calls:
        message = f"a forced tool call finished ({finish_reason!r}) without any call"
        return [*findings, finding("tools_no_call", exchange, message, last, view=view)], 0
    for index, call in enumerate(found.calls):
        problem = _call_problem(call)
        if problem is not None:
            message = f"call {index}: {problem}"
            findings.append(finding("tools_invalid_arguments", exchange, message, last, view=view))
    return findings, len(found.calls)


def _call_problem(call: Call) -> str | None:
    if call.name not in TOOL_NAMES:
        return f"{call.name[:40]!r} is not one of the tools"
    try:
        arguments = json.loads(call.arguments)
    except ValueError as error:
        return f"arguments are not JSON ({error}): {call.arguments[:80]!r}"
    if not isinstance(arguments, dict):
        return f"arguments are not a JSON object: {call.arguments[:80]!r}"
    return None


def stream_mismatch(stream: Exchange) -> Finding | None:
    """A finding when the streamed calls differ from the twin's."""
    twin = stream.twin
    if not stream.is_ok or twin is None or not twin.is_ok:
        return None
    view = ensure_view(stream)
    streamed = accumulate_calls(view.choices.get(0, []), is_stream=True).calls
    whole = accumulate_calls(ensure_view(twin).choices.get(0, []), is_stream=False).calls
    if streamed == whole:
        return None
    differing = first_difference(streamed, whole)
    message = (
        f"{len(streamed)} streamed calls vs {len(whole)} non-streamed; call {differing} differs: "
        f"{_describe(streamed, differing)} vs {_describe(whole, differing)}"
    )
    numbers = [c.number for c in view.choices.get(0, []) if c.tool_calls][:1]
    return finding("tools_stream_mismatch", stream, message, numbers, view=view)


def _describe(calls: list[Call], index: int) -> str:
    if index >= len(calls):
        return "none"
    return f"{calls[index].name}({calls[index].arguments[:60]!r})"
