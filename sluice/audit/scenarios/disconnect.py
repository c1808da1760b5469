"""Disconnects (STREAMING_CONTRACT.md, hard case 6).

Streams abandoned mid-generation must stop consuming the server. Measured two
ways, both from outside: a small probe request's latency before and after
abandoning K long streams (flagged when the probe after is `slowdown` times
slower, unless the gauge below fell to zero), and, where the server exports
Prometheus metrics, its running requests gauge, which must fall back to zero.
"""

from __future__ import annotations

import asyncio
import re
from statistics import median

from sluice.audit.checks.evidence import scenario_finding
from sluice.audit.records import CHAT, COMPLETIONS, Exchange, Reader, ScenarioResult
from sluice.audit.scenarios.base import ScenarioContext, gather_exchanges
from sluice.audit.scenarios.prompts import prompt_for

NAME = "disconnect"
# Below this absolute difference a slowdown is noise, whatever the ratio.
MIN_SLOWDOWN_S = 0.02
GAUGE_POLL_S = 0.2
GAUGE_WAIT_S = 2.0
# vLLM's num_requests_running, SGLang's num_running_reqs, llama.cpp's
# llamacpp:requests_processing, and the generic requests_running.
_RUNNING_GAUGE = re.compile(
    r"^([A-Za-z_:][\w:]*(?:num_requests_running|num_running_reqs|requests_running|"
    r"requests_processing))(\{[^}]*\})?\s+(\S+)",
    re.MULTILINE,
)


async def run_disconnect(ctx: ScenarioContext) -> ScenarioResult:
    size = ctx.sizes.disconnect
    result = ctx.begin(NAME)
    before = await _probes(ctx, "before")
    abandoned = await gather_exchanges(*(_abandoned_stream(ctx, i) for i in range(size.streams)))
    await asyncio.sleep(size.settle_s)
    after = await _probes(ctx, "after")
    gauge_lines = await _running_after(ctx)
    result.exchanges = before + abandoned + after
    before_s = median(e.end_s - e.sent_s for e in before)
    after_s = median(e.end_s - e.sent_s for e in after)
    result.figures.update(
        {
            "probe_before_s": before_s,
            "probe_after_s": after_s,
            "probe_ratio": after_s / max(before_s, 1e-9),
        }
    )
    target = ctx.client.target.label
    if is_slowdown_a_finding(before_s, after_s, size.slowdown, gauge_lines):
        message = (
            f"probe took {after_s:.3f}s after abandoning {size.streams} streams, "
            f"{before_s:.3f}s before ({after_s / before_s:.1f}x, limit {size.slowdown}x)"
        )
        result.findings.append(
            scenario_finding("disconnect_keeps_generating", NAME, target, message)
        )
    if gauge_lines:  # still above zero after the wait
        message = f"running requests gauge still above zero {GAUGE_WAIT_S}s after the disconnects"
        finding = scenario_finding(
            "disconnect_keeps_generating", NAME, target, message, evidence=gauge_lines
        )
        result.findings.append(finding)
    return ctx.finish(result)


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
    body = ctx.body(endpoint, prompt, size.max_tokens, stream=True, **extra)
    reader = Reader("abandon", abandon_after_events=size.read_events)
    return await ctx.send(NAME, endpoint, body, "disconnect/abandoned", reader=reader)


async def _running_after(ctx: ScenarioContext) -> list[str] | None:
    """The gauge lines still above zero after waiting: [] when they fell to zero,
    None when the server exports no running-requests gauge."""
    waited_s = 0.0
    while True:
        probe = await ctx.client.get("/metrics")
        text = probe.body.decode("utf-8", "replace") if probe.is_ok else ""
        if not _RUNNING_GAUGE.search(text):
            return None
        lines = _running_lines(text)
        if not lines or waited_s >= GAUGE_WAIT_S:
            return lines
        await asyncio.sleep(GAUGE_POLL_S)
        waited_s += GAUGE_POLL_S


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
