"""Logprobs in both APIs (STREAMING_CONTRACT.md, I3 and hard case 5).

Completions `logprobs: N` and chat `logprobs: true, top_logprobs: N`, with
include_usage and continuous usage, sent concurrently so the server coalesces
tokens into multi-token chunks; each stream has a non-streamed twin with the
same logprobs, the token-level reference.
"""

from __future__ import annotations

from sluice.audit.records import ScenarioResult
from sluice.audit.scenarios.base import ENDPOINTS, ScenarioContext, gather_exchanges
from sluice.audit.scenarios.prompts import prompt_for

NAME = "logprobs"


async def run_logprobs(ctx: ScenarioContext) -> ScenarioResult:
    size = ctx.sizes.logprobs
    result = ctx.begin(NAME)
    sends = []
    for position in range(size.requests):
        for endpoint in ENDPOINTS:
            body = ctx.body(
                endpoint,
                prompt_for(endpoint, position + 2),
                size.max_tokens,
                stream=True,
                stream_options=ctx.stream_options(continuous=True),
                **ctx.logprobs_fields(endpoint, size.top),
            )
            sends.append(ctx.send(NAME, endpoint, body, f"logprobs/top {size.top}"))
    result.exchanges = await gather_exchanges(*sends)
    await ctx.add_twins(result.exchanges)
    return ctx.finish(result)
