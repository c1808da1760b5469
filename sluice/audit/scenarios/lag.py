"""Lag: the original failure (STREAMING_CONTRACT.md, hard cases 1 and 7).

Many concurrent streams with logprobs and continuous usage, a share of them
read slowly (the server's writes back up), while huge prompts keep arriving
(long prefills, heavy tokenization). Deltas must coalesce without duplicates,
gaps or frozen counters, and /health must keep answering.
"""

from __future__ import annotations

import asyncio
import contextlib

from sluice.audit.checks.evidence import scenario_finding
from sluice.audit.records import COMPLETIONS, Exchange, Reader, ScenarioResult
from sluice.audit.scenarios.base import ENDPOINTS, ScenarioContext, gather_exchanges, health_probe
from sluice.audit.scenarios.prompts import huge_prompt, prompt_for

NAME = "lag"
HEALTH_INTERVAL_S = 0.25
LONG_PROMPT_SPACING_S = 0.3


async def run_lag(ctx: ScenarioContext) -> ScenarioResult:
    size = ctx.sizes.lag
    result = ctx.begin(NAME)
    num_slow = round(size.streams * size.slow_share)
    stop_watch = asyncio.Event()
    watcher = asyncio.create_task(_watch_health(ctx, stop_watch))
    streams = [
        _stream(ctx, position, is_slow=position < num_slow) for position in range(size.streams)
    ]
    long_prompts = [_long_prompt(ctx, position) for position in range(size.long_prompts)]
    exchanges = await gather_exchanges(*streams, *long_prompts)
    stop_watch.set()
    health_latencies_s = await watcher
    await ctx.add_twins(exchanges[: size.streams])
    result.exchanges = exchanges
    result.figures.update(_health_figures(health_latencies_s))
    slowest_s = max(health_latencies_s, default=0.0)
    if slowest_s > size.health_stall_s:
        message = f"/health took {slowest_s:.2f}s during the lag (limit {size.health_stall_s}s)"
        result.findings.append(
            scenario_finding("health_stalled", NAME, ctx.client.target.label, message)
        )
    return ctx.finish(result)


async def _stream(ctx: ScenarioContext, position: int, *, is_slow: bool) -> Exchange:
    size = ctx.sizes.lag
    endpoint = ENDPOINTS[position % 2]
    body = ctx.body(
        endpoint,
        prompt_for(endpoint, position),
        size.max_tokens,
        stream=True,
        stream_options=ctx.stream_options(continuous=True),
        **ctx.logprobs_fields(endpoint, 1),
    )
    reader = Reader("slow", size.slow_read_bytes, size.slow_read_interval_s) if is_slow else None
    case = f"lag/{'slow' if is_slow else 'normal'} reader"
    return await ctx.send(NAME, endpoint, body, case, reader=reader)


async def _long_prompt(ctx: ScenarioContext, position: int) -> Exchange:
    size = ctx.sizes.lag
    # Staggered, so prefills land while the streams are decoding.
    await asyncio.sleep(0.1 + position * LONG_PROMPT_SPACING_S)
    prompt = huge_prompt(size.long_prompt_words, salt=position)
    body = ctx.body(
        COMPLETIONS, prompt, 4, stream=True, stream_options=ctx.stream_options(continuous=False)
    )
    return await ctx.send(NAME, COMPLETIONS, body, "lag/huge prompt")


async def _watch_health(ctx: ScenarioContext, stop: asyncio.Event) -> list[float]:
    latencies_s = []
    while not stop.is_set():
        probe = await health_probe(ctx.client)
        latencies_s.append(probe.latency_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), HEALTH_INTERVAL_S)
    return latencies_s


def _health_figures(latencies_s: list[float]) -> dict[str, float]:
    if not latencies_s:
        return {}
    ordered = sorted(latencies_s)
    return {
        "health_checks": float(len(ordered)),
        "health_p50_s": ordered[len(ordered) // 2],
        "health_max_s": ordered[-1],
    }
