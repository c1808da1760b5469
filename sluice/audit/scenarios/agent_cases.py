"""What the responses and messages scenarios share: the cases, the tools, and
how each case is sent.

Each case goes out one request at a time (no batch to change a greedy
answer): non-streamed (a warm-up, which puts the prompt in a prefix cache if
the server has one), streamed to a slow reader (the server's writes back up,
so its deltas coalesce), for the plain case also streamed to a normal reader,
then non-streamed again: the streams' twin, which a greedy server must match
(checks/responses_final.py, checks/messages_final.py). Every response is
checked; the scenario measures how far the slow streams' deltas merged
(output tokens per delta event).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.audit.agent_events import delta_events, output_tokens
from sluice.audit.options import AgentApiSize
from sluice.audit.records import Exchange, Reader, ScenarioResult
from sluice.audit.scenarios.base import ScenarioContext

# (name, description, parameter properties, required) of the tools offered.
TOOL_SPECS: tuple[tuple[str, str, dict[str, Any], list[str]], ...] = (
    ("get_weather", "The current weather in a city.",
     {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
     ["city", "unit"]),
    ("get_time", "The local time in a time zone.",
     {"timezone": {"type": "string", "maxLength": 40}}, ["timezone"]),
    ("get_server_status", "Whether the server is up. Takes no arguments.", {}, []),
)  # fmt: skip
ZERO_ARGUMENT_TOOL = "get_server_status"

# Per round, the prompt of each case (rounds past the last reuse them in turn).
PLAIN_PROMPTS = (
    "Write two sentences about a lighthouse keeper.",
    "Explain in a few sentences how a bicycle works.",
    "Describe a busy market in the morning.",
)
TRUNCATED_PROMPTS = (
    "Count from one to one hundred in words, separated by commas.",
    "List every country of Europe, one per line.",
    "Write a long poem about the sea.",
)
TOOL_PROMPTS = (
    "What is the weather in Zürich, in celsius?",
    "Is it raining in Paris right now?",
    "How warm is it in Tokyo today?",
)
STATUS_PROMPTS = ("Is the server up?", "Check the server status.", "Is everything running?")
ANY_PROMPTS = ("What time is it in Tokyo?", "What is the time in New York?", "Time in Oslo?")


@dataclass(frozen=True, slots=True)
class AgentCase:
    name: str
    # The request body, without `stream`.
    body: dict[str, Any]
    also_normal_reader: bool = False


def schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}  # fmt: skip


def prompts_of(round_number: int) -> dict[str, str]:
    """The prompt of each case kind in one round."""
    pick = round_number
    return {
        "plain": PLAIN_PROMPTS[pick % len(PLAIN_PROMPTS)],
        "truncated": TRUNCATED_PROMPTS[pick % len(TRUNCATED_PROMPTS)],
        "tool": TOOL_PROMPTS[pick % len(TOOL_PROMPTS)],
        "status": STATUS_PROMPTS[pick % len(STATUS_PROMPTS)],
        "any": ANY_PROMPTS[pick % len(ANY_PROMPTS)],
    }


async def run_cases(
    ctx: ScenarioContext,
    scenario: str,
    endpoint: str,
    cases_of_round: Callable[[int], list[AgentCase]],
    size: AgentApiSize,
) -> ScenarioResult:
    result = ctx.begin(scenario)
    reader = Reader("slow", size.slow_read_bytes, size.slow_read_interval_s)
    for round_number in range(size.rounds):
        for case in cases_of_round(round_number)[: size.cases]:
            result.exchanges += await send_case(ctx, scenario, endpoint, case, reader)
    slow = [e for e in result.exchanges if e.reader == "slow" and e.is_ok]
    result.figures.update(
        slow_streams=float(len(slow)),
        slow_output_tokens=float(sum(output_tokens(e) for e in slow)),
        slow_delta_events=float(sum(delta_events(e) for e in slow)),
    )
    return ctx.finish(result)


async def send_case(
    ctx: ScenarioContext, scenario: str, endpoint: str, case: AgentCase, reader: Reader
) -> list[Exchange]:
    """One case: warm-up, its streams (a slow reader's, with a normal one's if
    asked), their non-streamed twin."""
    label = f"{scenario}/{case.name}"
    warm_up = await ctx.send(scenario, endpoint, {**case.body, "stream": False}, f"{label} warm-up")
    streamed = {**case.body, "stream": True}
    streams = []
    if case.also_normal_reader:
        streams.append(await ctx.send(scenario, endpoint, streamed, f"{label} normal reader"))
    streams.append(await ctx.send(scenario, endpoint, streamed, f"{label} slow reader",
                                  reader=reader))  # fmt: skip
    await ctx.add_twins(streams)
    return [warm_up, *streams]
