"""Ollama's API (POST /api/chat), streamed and not: plain greedy text and an
answer cut by `options.num_predict`, each non-streamed (a warm-up), streamed
to a slow reader (its lines merge) and, for the plain case, to a normal one,
then non-streamed again as the streams' twin (agent_cases.py's order); then
one invalid request (`messages` not a list), which must be a 400 in Ollama's
error shape. Every answer is checked by checks/ollama.py: NDJSON lines,
`done` last, no empty line, eval_count against num_predict, the stream's
content, thinking, tool calls and eval_count equal to its twin's. Skipped
(after preflight's one "api_not_served" note) where /api/chat is not served.
"""

from __future__ import annotations

from typing import Any

from sluice.audit.checks.evidence import finding
from sluice.audit.checks.ollama import read_answer
from sluice.audit.records import OLLAMA_CHAT, Exchange, Finding, Reader, ScenarioResult
from sluice.audit.scenarios.agent_cases import AgentCase, prompts_of, send_case
from sluice.audit.scenarios.bad_inputs import LAX_VALIDATION
from sluice.audit.scenarios.base import ScenarioContext

NAME = "ollama"


async def run_ollama(ctx: ScenarioContext) -> ScenarioResult:
    result = ctx.begin(NAME)
    if not ctx.traits.serves_ollama:
        return ctx.finish(result)
    size = ctx.sizes.ollama

    def body(prompt: str, num_predict: int) -> dict[str, Any]:
        return {"model": ctx.client.target.model,
                "messages": [{"role": "user", "content": prompt}],
                "options": {"temperature": 0, "num_predict": num_predict}}  # fmt: skip

    reader = Reader("slow", size.slow_read_bytes, size.slow_read_interval_s)
    for round_number in range(size.rounds):
        prompts = prompts_of(round_number)
        cases = [
            AgentCase("plain", body(prompts["plain"], size.max_tokens), also_normal_reader=True),
            AgentCase("truncated", body(prompts["truncated"], size.truncated_tokens)),
        ]
        for case in cases[: size.cases]:
            result.exchanges += await send_case(ctx, NAME, OLLAMA_CHAT, case, reader)
    slow = [e for e in result.exchanges if e.reader == "slow" and e.is_ok]
    result.figures.update(
        slow_streams=float(len(slow)),
        slow_output_tokens=float(sum(_eval_count(e) for e in slow)),
        slow_delta_events=float(sum(len(read_answer(e).lines) - 1 for e in slow)),
    )
    invalid = {**body(prompts_of(0)["plain"], size.max_tokens), "messages": "not a list"}
    exchange = ctx.exchange(NAME, OLLAMA_CHAT, invalid, f"{NAME}/messages not a list")
    exchange.expects_error = True
    exchange = await ctx.client.send(exchange)
    result.exchanges.append(exchange)
    result.findings += invalid_request_findings(exchange)
    return ctx.finish(result)


def invalid_request_findings(exchange: Exchange) -> list[Finding]:
    """An invalid request must be a 400 (its shape: checks/ollama.py)."""
    if exchange.status is None or exchange.status >= 300:
        return []  # the transport or the error-shape check reports it
    message = f"{exchange.case.rpartition('/')[2]}: answered {exchange.status}"
    return [finding("bad_input_accepted", exchange, message, cause=LAX_VALIDATION)]


def _eval_count(exchange: Exchange) -> int:
    final = read_answer(exchange).final or {}
    count = final.get("eval_count")
    return count if isinstance(count, int) else 0
