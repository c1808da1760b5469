"""n > 1 and list prompts (STREAMING_CONTRACT.md, "Shape").

Each index streams independently and satisfies every invariant; completions
index = prompt_index * n + i. The completions case also asks for logprobs and
usage, whose totals must sum over every choice of every prompt.
"""

from __future__ import annotations

from sluice.audit.records import CHAT, COMPLETIONS, ScenarioResult
from sluice.audit.scenarios.base import ScenarioContext, gather_exchanges
from sluice.audit.scenarios.prompts import prompt_for

NAME = "choices"


async def run_choices(ctx: ScenarioContext) -> ScenarioResult:
    size = ctx.sizes.choices
    result = ctx.begin(NAME)
    prompts = [prompt_for(COMPLETIONS, position) for position in range(size.prompts)]
    completions = ctx.body(
        COMPLETIONS,
        prompts,
        size.max_tokens,
        n=size.n,
        stream=True,
        stream_options=ctx.stream_options(continuous=False),
        **ctx.logprobs_fields(COMPLETIONS, 1),
    )
    chat = ctx.body(
        CHAT,
        prompt_for(CHAT, 0),
        size.max_tokens,
        n=size.n,
        stream=True,
        stream_options=ctx.stream_options(continuous=False),
    )
    result.exchanges = await gather_exchanges(
        ctx.send(NAME, COMPLETIONS, completions, f"choices/{size.prompts} prompts x n={size.n}"),
        ctx.send(NAME, CHAT, chat, f"choices/chat n={size.n}"),
    )
    await ctx.add_twins(result.exchanges)
    return ctx.finish(result)
