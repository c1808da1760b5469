"""Backpressure: the failure sluice exists for, made to happen (STREAMING_CONTRACT.md,
hard cases 1 and 5).

On every API the server serves (completions, chat, Responses, Messages), a
long greedy stream is read by a client that takes its first event, then
nothing, then everything: its connection has a small receive buffer (set
before connect), so the server's socket and its own buffers fill and a
server that coalesces must merge the deltas generated meanwhile. Each paused
stream runs beside the same request without logprobs, read at once (its
control, kept as its twin): the paused reader resumes when its control has
ended (the server generated the whole answer meanwhile), or after `pause_s`
at most, whatever the server's speed. The texts must match, and the
per-token checks read the merged chunks (each token with its own logprob
and alternatives). Bytes per token are raised where the API allows
(top_logprobs 20, n, ignore_eos) so the buffers fill sooner.

A paused stream merged when its largest delta is longer than every delta of
its control (merging.py). The scenario figures say on how many streams
merging was achieved, per API; when on none, the check was not exercised:
an "unverified" finding, never a pass. A server that cuts a stream whose
writes block (sluice's --send-timeout, 30 s) needs `pause_s` below that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from sluice.audit.checks.evidence import scenario_finding
from sluice.audit.checks.responses_final import LOGPROBS_INCLUDE
from sluice.audit.merging import has_merged
from sluice.audit.records import (
    CHAT,
    COMPLETIONS,
    MESSAGES,
    RESPONSES,
    Exchange,
    Reader,
    ScenarioResult,
)
from sluice.audit.scenarios.base import ScenarioContext, gather_exchanges
from sluice.audit.scenarios.prompts import prompt_for

NAME = "backpressure"
# What the control streams leave out (every API's logprob fields).
_LOGPROBS_FIELDS = frozenset({"logprobs", "top_logprobs", "include"})
# The short name of each API in figures and the coverage line.
API_NAMES = {COMPLETIONS: "completions", CHAT: "chat", RESPONSES: "responses", MESSAGES: "messages"}
# Agent APIs take an instruction; this one draws a long answer from an instruct model.
LONG_ANSWER_PROMPT = "Write a very long story, in many chapters, about a lighthouse keeper."


async def run_backpressure(ctx: ScenarioContext) -> ScenarioResult:
    size = ctx.sizes.backpressure
    result = ctx.begin(NAME)
    sends = []
    for endpoint in _endpoints(ctx):
        for position in range(size.streams):
            sends += _pair(ctx, endpoint, _body(ctx, endpoint, position))
    exchanges = await gather_exchanges(*sends)
    paused = exchanges[0::2]
    for stream, control in zip(paused, exchanges[1::2], strict=True):
        stream.twin = control
    result.exchanges = paused
    result.figures.update(merging_figures(paused))
    num_merged = int(result.figures["merged_streams"])
    if num_merged == 0:
        message = f"{merging_line(result.figures)}: the merged-chunk checks read nothing"
        result.findings.append(
            scenario_finding("backpressure_not_exercised", NAME, ctx.client.target.label, message)
        )
    return ctx.finish(result)


def _pair(ctx: ScenarioContext, endpoint: str, body: dict[str, Any]) -> list[Awaitable[Exchange]]:
    """The paused stream, and its control, whose end resumes it."""
    ended = asyncio.Event()
    reader = Reader("pause", pause_s=ctx.sizes.backpressure.pause_s, resume=ended)
    case = f"{NAME}/{API_NAMES[endpoint]}"
    control_body = {key: value for key, value in body.items() if key not in _LOGPROBS_FIELDS}

    async def control() -> Exchange:
        try:
            return await ctx.send(NAME, endpoint, control_body, f"{case} read at once")
        finally:
            ended.set()

    return [ctx.send(NAME, endpoint, body, f"{case} paused", reader=reader), control()]


def _endpoints(ctx: ScenarioContext) -> list[str]:
    served = {RESPONSES: ctx.traits.serves_responses, MESSAGES: ctx.traits.serves_messages}
    return [endpoint for endpoint in API_NAMES if served.get(endpoint, True)]


def _body(ctx: ScenarioContext, endpoint: str, position: int) -> dict[str, Any]:
    size = ctx.sizes.backpressure
    model = ctx.client.target.model
    if endpoint == RESPONSES:
        return {"model": model, "input": LONG_ANSWER_PROMPT, "max_output_tokens": size.max_tokens,
                "temperature": 0, "stream": True, "include": [LOGPROBS_INCLUDE],
                "top_logprobs": size.top}  # fmt: skip
    if endpoint == MESSAGES:
        return {"model": model, "max_tokens": size.max_tokens, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": LONG_ANSWER_PROMPT}]}  # fmt: skip
    extra: dict[str, Any] = {"ignore_eos": True} if ctx.traits.ignore_eos else {}
    if size.n > 1:
        extra["n"] = size.n
    return ctx.body(
        endpoint,
        prompt_for(endpoint, position),
        size.max_tokens,
        stream=True,
        **ctx.logprobs_fields(endpoint, size.top),
        **extra,
    )


def merging_figures(paused: list[Exchange]) -> dict[str, float]:
    """Paused streams and those that merged, in all and per API."""
    figures = {"paused_streams": float(len(paused)), "merged_streams": 0.0}
    for stream in paused:
        name = API_NAMES[stream.endpoint]
        is_merged = stream.twin is not None and has_merged(stream, stream.twin)
        figures["merged_streams"] += is_merged
        figures[f"merged_{name}"] = figures.get(f"merged_{name}", 0.0) + is_merged
        figures[f"paused_{name}"] = figures.get(f"paused_{name}", 0.0) + 1
    return figures


def merging_line(figures: dict[str, float]) -> str:
    """ "merging achieved on N of M streams (completions 1/1, chat 0/1, ...)"."""
    per_api = ", ".join(
        f"{name} {figures.get(f'merged_{name}', 0):.0f}/{figures[f'paused_{name}']:.0f}"
        for name in API_NAMES.values()
        if f"paused_{name}" in figures
    )
    merged, paused = figures.get("merged_streams", 0), figures.get("paused_streams", 0)
    return f"merging achieved on {merged:.0f} of {paused:.0f} streams ({per_api})"
