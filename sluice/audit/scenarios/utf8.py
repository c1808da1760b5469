"""UTF-8 stress (STREAMING_CONTRACT.md, hard case 2).

Prompts that draw emoji, CJK and Thai, whose characters byte-level tokenizers
split across tokens and chunks. Logprobs (top 1) are on so the token bytes can
be checked against the text; no delta may carry U+FFFD.
"""

from __future__ import annotations

from sluice.audit.records import ScenarioResult
from sluice.audit.scenarios.base import ENDPOINTS, ScenarioContext, gather_exchanges
from sluice.audit.scenarios.prompts import prompt_for

NAME = "utf8"


async def run_utf8(ctx: ScenarioContext) -> ScenarioResult:
    size = ctx.sizes.utf8
    result = ctx.begin(NAME)
    sends = []
    for position in range(size.requests):
        for endpoint in ENDPOINTS:
            prompt = prompt_for(endpoint, position, utf8=True)
            body = ctx.body(
                endpoint,
                prompt,
                size.max_tokens,
                stream=True,
                stream_options=ctx.stream_options(continuous=True),
                **ctx.logprobs_fields(endpoint, 1),
            )
            sends.append(ctx.send(NAME, endpoint, body, f"utf8/prompt {position}"))
    result.exchanges = await gather_exchanges(*sends)
    await ctx.add_twins(result.exchanges)
    return ctx.finish(result)
