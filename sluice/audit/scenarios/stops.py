"""Stop strings (STREAMING_CONTRACT.md, hard case 4).

Stop strings are cut from the server's own greedy output of the same prompt,
so they really match: first a request without stops, then substrings at
various offsets: one spanning tokens mid-text, one matching in the first
chunk, two overlapping, several at once, one late. Each runs with and without
`include_stop_str_in_output` (a vLLM extension, sent only when allowed),
streamed (all cases at once), then each with its non-streamed twin.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.audit.records import Exchange, ScenarioResult
from sluice.audit.scenarios.base import ENDPOINTS, ScenarioContext, choice_texts, gather_exchanges
from sluice.audit.scenarios.prompts import prompt_for

NAME = "stops"
MIN_BASE_CHARS = 16
# Prompts tried in turn for the base answer, until one is long enough.
BASE_PROMPT_POSITIONS = (1, 4, 0)


@dataclass(frozen=True, slots=True)
class StopCase:
    name: str
    # In the order sent: the stop that completes first comes first.
    stops: tuple[str, ...]


def choose_stop_cases(text: str) -> list[StopCase]:
    """Stop cases cut from `text` at several offsets; none if it is too short."""
    length = len(text)
    if length < MIN_BASE_CHARS:
        return []
    quarter, half = length // 4, length // 2
    cases = [
        StopCase("spanning", (_cut(text, half, 8),)),
        StopCase("first chunk", (_cut(text, 1, 3),)),
        StopCase("overlapping", (_cut(text, length // 3, 6), _cut(text, length // 3 + 3, 7))),
        StopCase("several", tuple(_cut(text, start, 5) for start in (quarter, half, 3 * quarter))),
        StopCase("late", (_cut(text, 3 * quarter, 6),)),
    ]
    return [case for case in cases if all(case.stops)]


def _cut(text: str, start: int, length: int) -> str:
    """text[start:start+length], moved right past whitespace-only pieces."""
    while start + length <= len(text) and not text[start : start + length].strip():
        start += 1
    return text[start : start + length]


async def run_stops(ctx: ScenarioContext) -> ScenarioResult:
    size = ctx.sizes.stops
    result = ctx.begin(NAME)
    bases = await gather_exchanges(*(_base(ctx, endpoint) for endpoint in ENDPOINTS))
    sends = []
    for endpoint, base in zip(ENDPOINTS, bases, strict=True):
        text = choice_texts(base).get(0, "")
        result.figures[f"base_chars{endpoint.replace('/', '_')}"] = float(len(text))
        prompt = _prompt_of(base)
        for case in choose_stop_cases(text)[: size.cases]:
            for include in (False, True) if ctx.traits.include_stop_str_in_output else (False,):
                sends.append(_stopped(ctx, endpoint, prompt, case, include, text))
    streams = await gather_exchanges(*sends)
    await ctx.add_twins(streams)
    result.exchanges = [*bases, *streams]
    return ctx.finish(result)


async def _base(ctx: ScenarioContext, endpoint: str) -> Exchange:
    """The greedy stop-free answer of the first prompt that says enough to cut stops from."""
    for position in BASE_PROMPT_POSITIONS:
        body = ctx.body(endpoint, prompt_for(endpoint, position), ctx.sizes.stops.max_tokens)
        base = await ctx.send(NAME, endpoint, body, "stops/base")
        if len(choice_texts(base).get(0, "")) >= MIN_BASE_CHARS:
            break
    return base


def _prompt_of(base: Exchange) -> str:
    assert base.body is not None, "bases are JSON requests"
    if "messages" in base.body:
        return base.body["messages"][0]["content"]
    return base.body["prompt"]


async def _stopped(
    ctx: ScenarioContext, endpoint: str, prompt: str, case: StopCase, include: bool, unstopped: str
) -> Exchange:
    extra = {"include_stop_str_in_output": True} if include else {}
    body = ctx.body(
        endpoint, prompt, ctx.sizes.stops.max_tokens, stop=list(case.stops), stream=True, **extra
    )
    label = f"stops/{case.name}{' +include' if include else ''}"
    exchange = await ctx.send(NAME, endpoint, body, label)
    exchange.unstopped_texts = {0: unstopped}
    return exchange
