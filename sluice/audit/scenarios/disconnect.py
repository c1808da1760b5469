"""Disconnects (STREAMING_CONTRACT.md, hard case 6).

Streams abandoned mid-generation must stop consuming the server. Where the
server exports a running-requests gauge (Prometheus /metrics), the gauge
decides: watched from the moment the streams are abandoned, it must fall to
zero before half the time the streams would still have taken (their own pace,
from the logprob entries of the events read, times the tokens left; at most
`MAX_GAUGE_WAIT_S`). Where it exports none, only a probe request's latency
before and after is left: flagged when the probe after is `slowdown` times
slower; otherwise "abort not verifiable", never a pass (a server that keeps
generating on spare capacity would answer the probe as fast).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from statistics import median

from sluice.audit.checks.evidence import scenario_finding
from sluice.audit.records import CHAT, COMPLETIONS, Exchange, Finding, Reader, ScenarioResult
from sluice.audit.scenarios.base import ScenarioContext, gather_exchanges
from sluice.audit.scenarios.prompts import prompt_for
from sluice.audit.stream_view import view_of

NAME = "disconnect"
# Below this absolute difference a slowdown is noise, whatever the ratio.
MIN_SLOWDOWN_S = 0.02
GAUGE_POLL_S = 0.05
# The gauge must fall before this share of the time the abandoned streams
# would still have run: a server that keeps generating holds it up to the end.
GAUGE_SHARE = 0.5
# The longest wait for the gauge (a slow server's streams would run minutes),
# and the wait where the streams' pace could not be read.
MAX_GAUGE_WAIT_S = 3.0
# vLLM's num_requests_running, SGLang's num_running_reqs, llama.cpp's
# llamacpp:requests_processing, and the generic requests_running.
_RUNNING_GAUGE = re.compile(
    r"^([A-Za-z_:][\w:]*(?:num_requests_running|num_running_reqs|requests_running|"
    r"requests_processing))(\{[^}]*\})?\s+(\S+)",
    re.MULTILINE,
)


@dataclass(slots=True)
class GaugeWatch:
    # Gauge lines still above zero when the wait ended ([]: it fell to zero);
    # None when the server exports no running-requests gauge.
    lines: list[str] | None
    # How long it was watched, and the longest it could be.
    waited_s: float
    limit_s: float


async def run_disconnect(ctx: ScenarioContext) -> ScenarioResult:
    size = ctx.sizes.disconnect
    result = ctx.begin(NAME)
    before = await _probes(ctx, "before")
    abandoned = await gather_exchanges(*(_abandoned_stream(ctx, i) for i in range(size.streams)))
    paces = [_remaining_s(e, size.max_tokens) for e in abandoned]
    remaining_s = min((s for s in paces if s is not None), default=MAX_GAUGE_WAIT_S)
    limit_s = min(MAX_GAUGE_WAIT_S, GAUGE_SHARE * remaining_s)
    watch = await _watch_gauge(ctx, limit_s)
    await asyncio.sleep(size.settle_s)
    after = await _probes(ctx, "after")
    result.exchanges = before + abandoned + after
    before_s = median(e.end_s - e.sent_s for e in before)
    after_s = median(e.end_s - e.sent_s for e in after)
    result.figures.update(
        {
            "probe_before_s": before_s,
            "probe_after_s": after_s,
            "probe_ratio": after_s / max(before_s, 1e-9),
            "gauge_watched_s": watch.waited_s,
            "gauge_limit_s": watch.limit_s,
        }
    )
    result.findings += _verdicts(ctx, watch, before_s, after_s)
    return ctx.finish(result)


def _verdicts(
    ctx: ScenarioContext, watch: GaugeWatch, before_s: float, after_s: float
) -> list[Finding]:
    size, target = ctx.sizes.disconnect, ctx.client.target.label
    findings = []
    if is_slowdown_a_finding(before_s, after_s, size.slowdown, watch.lines):
        message = (
            f"probe took {after_s:.3f}s after abandoning {size.streams} streams, "
            f"{before_s:.3f}s before ({after_s / before_s:.1f}x, limit {size.slowdown}x)"
        )
        findings.append(scenario_finding("disconnect_keeps_generating", NAME, target, message))
    elif watch.lines is None:
        message = (
            f"no running-requests gauge in /metrics: whether {size.streams} abandoned streams "
            f"stopped cannot be seen (probe {before_s:.3f}s before, {after_s:.3f}s after)"
        )
        findings.append(scenario_finding("abort_not_verifiable", NAME, target, message))
    if watch.lines:  # still above zero after the wait
        message = (
            f"running requests gauge still above zero {watch.waited_s:.2f}s after the "
            f"disconnects (limit {watch.limit_s:.2f}s: half the time the streams had left)"
        )
        findings.append(
            scenario_finding(
                "disconnect_keeps_generating", NAME, target, message, evidence=watch.lines
            )
        )
    return findings


async def _probes(ctx: ScenarioContext, when: str) -> list[Exchange]:
    size = ctx.sizes.disconnect
    body = ctx.body(COMPLETIONS, "Count from one to ten.", size.probe_tokens)
    return [
        await ctx.send(NAME, COMPLETIONS, body, f"disconnect/probe {when}")
        for _ in range(size.probes)
    ]


async def _abandoned_stream(ctx: ScenarioContext, position: int) -> Exchange:
    size = ctx.sizes.disconnect
    endpoint = (COMPLETIONS, CHAT)[position % 2]
    extra = {"ignore_eos": True} if ctx.traits.ignore_eos else {}
    prompt = prompt_for(endpoint, position)
    # Logprobs count the tokens of the events read: the streams' pace.
    body = ctx.body(
        endpoint,
        prompt,
        size.max_tokens,
        stream=True,
        **ctx.logprobs_fields(endpoint, 1),
        **extra,
    )
    reader = Reader("abandon", abandon_after_events=size.read_events)
    return await ctx.send(NAME, endpoint, body, "disconnect/abandoned", reader=reader)


def _remaining_s(exchange: Exchange, max_tokens: int) -> float | None:
    """How long the abandoned stream would still have run at its own pace
    (None when the events read do not show it)."""
    chunks = [c for cs in view_of(exchange).choices.values() for c in cs if c.logprobs]
    if len(chunks) < 2:
        return None
    later_tokens = sum(len(chunk.logprobs or []) for chunk in chunks[1:])
    pace_s = (chunks[-1].time_s - chunks[0].time_s) / later_tokens
    tokens_left = max_tokens - later_tokens - len(chunks[0].logprobs or [])
    return max(tokens_left, 0) * pace_s


async def _watch_gauge(ctx: ScenarioContext, limit_s: float) -> GaugeWatch:
    """Poll the gauge from now until it falls to zero or `limit_s` passed."""
    started_s = ctx.client.now_s()
    while True:
        probe = await ctx.client.get("/metrics")
        waited_s = ctx.client.now_s() - started_s
        text = probe.body.decode("utf-8", "replace") if probe.is_ok else ""
        if not _RUNNING_GAUGE.search(text):
            return GaugeWatch(None, waited_s, limit_s)
        lines = _running_lines(text)
        if not lines or waited_s >= limit_s:
            return GaugeWatch(lines, waited_s, limit_s)
        await asyncio.sleep(GAUGE_POLL_S)


def is_slowdown_a_finding(
    before_s: float, after_s: float, slowdown: float, gauge_lines: list[str] | None
) -> bool:
    """A probe slower after the disconnects is the evidence only where the server
    exports no running gauge: a gauge back at zero says the abandoned streams
    stopped, and the probe's slowdown is then the machine's noise (llama-server
    on a shared 2-core VM: 2.0x with its gauge at zero)."""
    if gauge_lines is not None and not gauge_lines:
        return False
    return after_s > before_s * slowdown and after_s - before_s > MIN_SLOWDOWN_S


def _running_lines(metrics_text: str) -> list[str]:
    lines = []
    for match in _RUNNING_GAUGE.finditer(metrics_text):
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if value > 0:
            lines.append(match.group(0))
    return lines
