"""Determinism: the same greedy request alone, then inside a crowd.

Each probe (a greedy stream with logprobs) is sent alone, then again while
a crowd of different requests runs (sent first, asking for twice the tokens,
so the probe shares every step with them). A batch-invariant server returns
the same tokens with the same logprobs both times; many servers do not
(batch shape changes the matmul kernels and so the rounding). Reported as
figures, not as a broken invariant: the contract does not promise it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.audit.checks.exchange import ensure_view
from sluice.audit.records import Exchange, ScenarioResult
from sluice.audit.scenarios.base import ENDPOINTS, ScenarioContext, gather_exchanges
from sluice.audit.scenarios.prompts import prompt_for

NAME = "determinism"
ALONE, IN_CROWD, CROWD = "determinism/alone", "determinism/in crowd", "determinism/crowd"


@dataclass(slots=True)
class ProbeComparison:
    is_tokens_equal: bool
    # The sampled tokens' logprobs and their alternatives, all equal.
    is_logprobs_equal: bool


async def run_determinism(ctx: ScenarioContext) -> ScenarioResult:
    size = ctx.sizes.determinism
    result = ctx.begin(NAME)
    comparisons = []
    for position in range(size.probes):
        for endpoint in ENDPOINTS:
            body = ctx.body(
                endpoint,
                prompt_for(endpoint, position),
                size.max_tokens,
                stream=True,
                **ctx.logprobs_fields(endpoint, size.top),
            )
            alone = await ctx.send(NAME, endpoint, body, ALONE)
            crowd = [_crowd_member(ctx, endpoint, position, k) for k in range(size.crowd)]
            # The crowd's requests go out first: gather starts them in order.
            *others, in_crowd = await gather_exchanges(
                *crowd, ctx.send(NAME, endpoint, body, IN_CROWD)
            )
            result.exchanges += [alone, *others, in_crowd]
            comparison = compare_probes(alone, in_crowd)
            if comparison is not None:
                comparisons.append(comparison)
    result.figures.update(
        {
            "probes_compared": float(len(comparisons)),
            "tokens_equal": float(sum(c.is_tokens_equal for c in comparisons)),
            "logprobs_equal": float(sum(c.is_logprobs_equal for c in comparisons)),
        }
    )
    return ctx.finish(result)


async def _crowd_member(ctx: ScenarioContext, probe_endpoint: str, position: int, k: int):
    """A request unlike the probe: another prompt, utf8 or not, either API."""
    size = ctx.sizes.determinism
    endpoint = ENDPOINTS[k % 2]
    offset = 1 + k // 2 if endpoint == probe_endpoint else k // 2
    body = ctx.body(
        endpoint,
        prompt_for(endpoint, position + offset, utf8=k % 4 >= 2),
        2 * size.max_tokens,
        stream=True,
        **ctx.logprobs_fields(endpoint, size.top),
    )
    return await ctx.send(NAME, endpoint, body, CROWD)


def compare_probes(alone: Exchange, in_crowd: Exchange) -> ProbeComparison | None:
    """Token and logprob equality of two answers to one request; None if either failed."""
    if not alone.is_ok or not in_crowd.is_ok:
        return None
    first, second = _generated(alone), _generated(in_crowd)
    return ProbeComparison(is_tokens_equal=first[0] == second[0], is_logprobs_equal=first == second)


def _generated(exchange: Exchange) -> tuple[list[bytes], list[tuple]]:
    """(token bytes, logprob signatures) of choice 0; the text when no entries came."""
    chunks = ensure_view(exchange).choices.get(0, [])
    entries = [entry for chunk in chunks for entry in chunk.logprobs or []]
    if not entries:
        return [ensure_view(exchange).text(0).encode()], []
    return [entry.token_bytes for entry in entries], [entry.signature for entry in entries]
