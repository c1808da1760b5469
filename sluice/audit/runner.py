"""Runs the audit: preflight (reachability, then probes of what each server
supports), then every scenario against every target, then the per-response
checks (sluice's strict rules only with --strict).

With two targets (compare mode) the scenarios are interleaved: each scenario
runs against A then B, the next one against B then A, so neither server
always goes first (warm caches, a machine's thermal state). Both share one
clock, so their timelines can be drawn on one axis.
"""

from __future__ import annotations

import json
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sluice.audit.checks.exchange import check_exchange
from sluice.audit.options import AuditOptions
from sluice.audit.probes import probe_server
from sluice.audit.progress import Progress
from sluice.audit.records import AuditResult, Finding, ScenarioResult, Target
from sluice.audit.scenarios.base import ScenarioContext
from sluice.audit.scenarios.registry import SCENARIOS
from sluice.audit.transport import Client


@dataclass(slots=True)
class Preflight:
    # Reasons the audit cannot run (unreachable, refused credentials): exit 2.
    errors: list[str] = field(default_factory=list)
    # Worth a line, not a stop (e.g. the model is not listed).
    warnings: list[str] = field(default_factory=list)


async def preflight(targets: list[Target], timeout_s: float = 10.0) -> Preflight:
    report = Preflight()
    for target in targets:
        async with Client(target, timeout_s=timeout_s, origin_s=time.perf_counter()) as client:
            probe = await client.get("/v1/models")
            if probe.error is not None:
                report.errors.append(f"{target.base_url}: unreachable ({probe.error})")
            elif probe.status in (401, 403):
                report.errors.append(
                    f"{target.base_url}: /v1/models answered {probe.status} (check --api-key)"
                )
            elif probe.status != 200:
                report.warnings.append(f"{target.base_url}: /v1/models answered {probe.status}")
            elif target.model not in _model_ids(probe.body):
                report.warnings.append(
                    f"{target.base_url}: model {target.model!r} is not in /v1/models"
                )
    return report


def _model_ids(body: bytes) -> set[str]:
    try:
        payload = json.loads(body)
        return {str(item.get("id")) for item in payload.get("data", []) if isinstance(item, dict)}
    except (ValueError, AttributeError):
        return set()


async def run_audit(
    targets: list[Target], options: AuditOptions, progress: Progress | None = None
) -> AuditResult:
    origin_s = time.perf_counter()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    results: list[ScenarioResult] = []
    server_findings: list[Finding] = []
    async with AsyncExitStack() as stack:
        clients, traits = [], {}
        for target in targets:
            client = Client(
                target, timeout_s=options.request_timeout_s, origin_s=origin_s, progress=progress
            )
            clients.append(await stack.enter_async_context(client))
            traits[target.label], notes = await probe_server(
                client, options.vllm_extensions, options.scenarios
            )
            server_findings += notes
        for position, name in enumerate(options.scenarios):
            for client in clients if position % 2 == 0 else clients[::-1]:
                context = ScenarioContext(client, options, traits[client.target.label])
                result = await _run_scenario(context, name, progress)
                if progress is not None:
                    progress.add_findings(len(result.findings))
                results.append(result)
        server_findings += [client.closed_connection_note() for client in clients]
    duration_s = time.perf_counter() - origin_s
    audit = AuditResult(
        list(targets), options.profile, list(options.scenarios), results, started_at, duration_s
    )
    audit.server_findings = [finding for finding in server_findings if finding is not None]
    return audit


async def _run_scenario(
    context: ScenarioContext, name: str, progress: Progress | None
) -> ScenarioResult:
    if progress is not None:
        progress.start_scenario(context.client.target.label, name)
    result = await SCENARIOS[name](context)
    check_result(result, strict=context.options.strict)
    return result


def check_result(result: ScenarioResult, *, strict: bool = False) -> None:
    """Run the response checks on every exchange; a shared twin is checked once.
    Strict-rule findings are kept only when asked for."""
    checked_twins: set[int] = set()
    for exchange in result.exchanges:
        twin_key = id(exchange.twin)
        is_new_twin = exchange.twin is not None and twin_key not in checked_twins
        result.findings.extend(check_exchange(exchange, include_twin=is_new_twin))
        checked_twins.add(twin_key)
    if not strict:
        result.findings = [f for f in result.findings if f.severity != "strict"]
