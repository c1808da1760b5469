"""Usage modes (STREAMING_CONTRACT.md, I5).

For both APIs: no stream_options, `stream_options: {}`, include_usage,
include_usage with continuous_usage_stats (a vLLM extension), all streamed at
once, each then with a non-streamed twin whose usage is the reference; and `stream_options`
with `stream: false`, which must be a 400.
"""

from __future__ import annotations

from typing import Any

from sluice.audit.checks.evidence import finding
from sluice.audit.records import Exchange, ScenarioResult
from sluice.audit.scenarios.base import ENDPOINTS, ScenarioContext, gather_exchanges
from sluice.audit.scenarios.prompts import prompt_for

NAME = "usage"


def _modes(ctx: ScenarioContext) -> list[tuple[str, dict[str, Any]]]:
    modes: list[tuple[str, dict[str, Any]]] = [
        ("none", {}),
        ("empty stream_options", {"stream_options": {}}),
        ("include_usage", {"stream_options": {"include_usage": True}}),
    ]
    if ctx.traits.continuous_usage_stats:
        modes.append(("continuous", {"stream_options": ctx.stream_options(continuous=True)}))
    return modes


async def run_usage(ctx: ScenarioContext) -> ScenarioResult:
    size = ctx.sizes.usage
    result = ctx.begin(NAME)
    sends = [
        ctx.send(
            NAME,
            endpoint,
            ctx.body(endpoint, prompt_for(endpoint, 3), size.max_tokens, stream=True, **extra),
            f"usage/{mode}",
        )
        for endpoint in ENDPOINTS
        for mode, extra in _modes(ctx)
    ]
    streams = await gather_exchanges(*sends)
    await ctx.add_twins(streams)
    result.exchanges = streams
    for endpoint in ENDPOINTS:
        prompt = prompt_for(endpoint, 3)
        result.exchanges.append(await _stream_options_without_stream(ctx, result, endpoint, prompt))
    return ctx.finish(result)


async def _stream_options_without_stream(
    ctx: ScenarioContext, result: ScenarioResult, endpoint: str, prompt: str
) -> Exchange:
    body = ctx.body(
        endpoint,
        prompt,
        ctx.sizes.usage.max_tokens,
        stream=False,
        stream_options={"include_usage": True},
    )
    exchange = ctx.exchange(NAME, endpoint, body, "usage/stream_options with stream=false")
    exchange.expects_error = True
    await ctx.client.send(exchange)
    if exchange.is_ok or exchange.status in range(401, 422) or exchange.status in range(423, 500):
        message = f"answered {exchange.status}, expected 400"
        result.findings.append(finding("stream_options_without_stream", exchange, message))
    return exchange
