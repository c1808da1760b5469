"""Soak: a set request rate for a set duration (full profile only by default).

Requests start on a fixed schedule (i / rate seconds), whatever the server's
pace, alternating APIs and prompts; every stream is checked like the others,
and the throughput-over-time plot shows whether the server holds the rate.
"""

from __future__ import annotations

import asyncio

from sluice.audit.records import Exchange, ScenarioResult
from sluice.audit.scenarios.base import ENDPOINTS, ScenarioContext, gather_exchanges
from sluice.audit.scenarios.prompts import prompt_for

NAME = "soak"


async def run_soak(ctx: ScenarioContext) -> ScenarioResult:
    size = ctx.sizes.soak
    result = ctx.begin(NAME)
    num_requests = max(1, int(size.rate * size.duration_s))
    sends = [_scheduled(ctx, position, position / size.rate) for position in range(num_requests)]
    result.exchanges = await gather_exchanges(*sends)
    await ctx.add_twins(result.exchanges)
    result.figures["requests_scheduled"] = float(num_requests)
    return ctx.finish(result)


async def _scheduled(ctx: ScenarioContext, position: int, start_after_s: float) -> Exchange:
    await asyncio.sleep(start_after_s)
    size = ctx.sizes.soak
    endpoint = ENDPOINTS[position % 2]
    body = ctx.body(
        endpoint,
        prompt_for(endpoint, position),
        size.max_tokens,
        stream=True,
        stream_options=ctx.stream_options(continuous=False),
    )
    return await ctx.send(NAME, endpoint, body, "soak")
