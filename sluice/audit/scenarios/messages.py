"""Anthropic's Messages API (POST /v1/messages), streamed and not: plain
greedy text, a message cut by `max_tokens`, a call forced to a named tool
(`tool_choice: {"type": "tool"}`), to a tool without parameters, and a call
forced by `{"type": "any"}`; then one invalid request (no `max_tokens`),
which must be a 400 `invalid_request_error` in Anthropic's error shape. Sent
as agent_cases.py describes; skipped (after preflight's one "api_not_served"
note) when the server has no such route.
"""

from __future__ import annotations

import json
from typing import Any

from sluice.audit.checks.evidence import finding
from sluice.audit.records import MESSAGES, Exchange, Finding, ScenarioResult
from sluice.audit.scenarios.agent_cases import (
    TOOL_SPECS,
    ZERO_ARGUMENT_TOOL,
    AgentCase,
    prompts_of,
    run_cases,
    schema,
)
from sluice.audit.scenarios.bad_inputs import LAX_VALIDATION
from sluice.audit.scenarios.base import ScenarioContext

NAME = "messages"
TOOLS = [
    {"name": name, "description": description, "input_schema": schema(properties, required)}
    for name, description, properties, required in TOOL_SPECS
]


async def run_messages(ctx: ScenarioContext) -> ScenarioResult:
    if not ctx.traits.serves_messages:
        return ctx.finish(ctx.begin(NAME))
    size = ctx.sizes.messages

    def body(prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
        return {"model": ctx.client.target.model, "max_tokens": max_tokens, "temperature": 0,
                "messages": [{"role": "user", "content": prompt}], **extra}  # fmt: skip

    def cases(round_number: int) -> list[AgentCase]:
        prompts = prompts_of(round_number)

        def forced(prompt: str, choice: dict[str, Any]) -> dict[str, Any]:
            return body(prompt, size.tool_max_tokens, tools=TOOLS, tool_choice=choice)

        return [
            AgentCase("plain", body(prompts["plain"], size.max_tokens), also_normal_reader=True),
            AgentCase("truncated", body(prompts["truncated"], size.truncated_tokens)),
            AgentCase("named tool", forced(prompts["tool"], {"type": "tool", "name": "get_weather"})),
            AgentCase("zero-argument tool", forced(prompts["status"],
                                                   {"type": "tool", "name": ZERO_ARGUMENT_TOOL})),
            AgentCase("any tool", forced(prompts["any"], {"type": "any"})),
        ]  # fmt: skip

    result = await run_cases(ctx, NAME, MESSAGES, cases, size)
    invalid = body(prompts_of(0)["plain"], size.max_tokens)
    del invalid["max_tokens"]
    exchange = ctx.exchange(NAME, MESSAGES, invalid, f"{NAME}/max_tokens missing")
    exchange.expects_error = True
    exchange = await ctx.client.send(exchange)
    result.exchanges.append(exchange)
    result.findings += invalid_request_findings(exchange)
    return ctx.finish(result)


def invalid_request_findings(exchange: Exchange) -> list[Finding]:
    """An invalid request must be a 400 whose error type is invalid_request_error."""
    if exchange.status is None:
        return []  # the response checks report the transport error
    if exchange.status < 300:
        message = f"{exchange.case.rpartition('/')[2]}: answered {exchange.status}"
        return [finding("bad_input_accepted", exchange, message, cause=LAX_VALIDATION)]
    try:
        error = json.loads(exchange.raw).get("error")
    except (ValueError, AttributeError):
        error = None
    error_type = error.get("type") if isinstance(error, dict) else None
    if exchange.status != 400 or error_type != "invalid_request_error":
        message = (
            f"{exchange.status} with error type {error_type!r}, expected 400 invalid_request_error"
        )
        return [finding("messages_error_shape", exchange, message)]
    return []
