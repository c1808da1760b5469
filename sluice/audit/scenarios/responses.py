"""The Responses API (POST /v1/responses), streamed and not: plain greedy
text, a response cut by `max_output_tokens`, a call forced to a named tool,
to a tool without parameters, text with its logprobs
(`include: ["message.output_text.logprobs"]`), and a call forced by
`tool_choice: "required"`. Sent as agent_cases.py describes; skipped (after
preflight's one "api_not_served" note) when the server has no such route.
"""

from __future__ import annotations

from typing import Any

from sluice.audit.checks.responses_final import LOGPROBS_INCLUDE
from sluice.audit.records import RESPONSES, ScenarioResult
from sluice.audit.scenarios.agent_cases import (
    TOOL_SPECS,
    ZERO_ARGUMENT_TOOL,
    AgentCase,
    prompts_of,
    run_cases,
    schema,
)
from sluice.audit.scenarios.base import ScenarioContext

NAME = "responses"
TOOLS = [
    {"type": "function", "name": name, "description": description,
     "parameters": schema(properties, required)}
    for name, description, properties, required in TOOL_SPECS
]  # fmt: skip


async def run_responses(ctx: ScenarioContext) -> ScenarioResult:
    if not ctx.traits.serves_responses:
        return ctx.finish(ctx.begin(NAME))
    size = ctx.sizes.responses

    def cases(round_number: int) -> list[AgentCase]:
        prompts = prompts_of(round_number)

        def body(prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
            return {"model": ctx.client.target.model, "input": prompt,
                    "max_output_tokens": max_tokens, "temperature": 0, **extra}  # fmt: skip

        def forced(prompt: str, choice: Any) -> dict[str, Any]:
            return body(prompt, size.tool_max_tokens, tools=TOOLS, tool_choice=choice)

        return [
            AgentCase("plain", body(prompts["plain"], size.max_tokens), also_normal_reader=True),
            AgentCase("truncated", body(prompts["truncated"], size.truncated_tokens)),
            AgentCase("named tool", forced(prompts["tool"],
                                           {"type": "function", "name": "get_weather"})),
            AgentCase("zero-argument tool", forced(prompts["status"],
                                                   {"type": "function", "name": ZERO_ARGUMENT_TOOL})),
            AgentCase("logprobs", body(prompts["plain"], size.max_tokens, include=[LOGPROBS_INCLUDE],
                                       top_logprobs=size.top)),
            AgentCase("required tool", forced(prompts["any"], "required")),
        ]  # fmt: skip

    return await run_cases(ctx, NAME, RESPONSES, cases, size)
