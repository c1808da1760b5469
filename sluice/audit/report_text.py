"""The terminal report: a metrics table per scenario (with B/A rows in
compare mode), the findings grouped by cause (check and cause: every
distinct message, the requests affected, one example with its raw bytes),
failing severities first, each check's coverage, the determinism figure, the
scenarios' own figures and a verdict.
"""

from __future__ import annotations

from sluice.audit.checks.catalogue import CHECKS
from sluice.audit.compare import COMPARED_METRICS
from sluice.audit.metrics import Percentiles, ScenarioMetrics
from sluice.audit.records import AuditResult, Finding
from sluice.audit.summary import Cause, Summary, failing_headline

EVIDENCE_CHARS = 200
MESSAGES_SHOWN = 6
_COLUMNS = (
    "scenario",
    "req",
    "err",
    "TTFT ms p50/90/99",
    "ITL ms p50/90/99",
    "E2E s p50/90/99",
    "tok/s",
    "chunk/s",
    "tok/chunk",
)
_WIDTHS = (18, 5, 4, 20, 18, 18, 8, 8, 9)


def render_text(result: AuditResult, summary: Summary) -> str:
    lines = [_header(result), "", *_metrics_table(summary), ""]
    lines += _findings(result, summary)
    lines += _coverage(summary)
    lines += _determinism(summary)
    lines += _figures(summary)
    lines += ["", _verdict(result, summary)]
    return "\n".join(lines) + "\n"


def _header(result: AuditResult) -> str:
    targets = ", ".join(f"{t.label}={t.base_url} ({t.model})" for t in result.targets)
    return f"sluice audit · {result.profile} profile · {targets} · {result.duration_s:.1f}s"


def _row(cells: list[str]) -> str:
    return "  ".join(
        cell.ljust(width) if i == 0 else cell.rjust(width)
        for i, (cell, width) in enumerate(zip(cells, _WIDTHS, strict=True))
    )


def _triple(values: Percentiles, scale: float, digits: int) -> str:
    if values.p50 is None:
        return "-"
    return "/".join(
        f"{value * scale:.{digits}f}"
        for value in (values.p50, values.p90, values.p99)
        if value is not None
    )


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _metric_cells(name: str, metrics: ScenarioMetrics) -> list[str]:
    return [
        name,
        str(metrics.requests),
        str(metrics.errors),
        _triple(metrics.ttft_s, 1000, 0),
        _triple(metrics.itl_s, 1000, 1),
        _triple(metrics.e2e_s, 1, 2),
        _number(metrics.output_tokens_per_s),
        _number(metrics.chunks_per_s),
        _number(metrics.tokens_per_chunk, 2),
    ]


def _ratio_cells(ratios: dict[str, float | None]) -> list[str]:
    def cell(*names: str) -> str:
        values = [ratios.get(name) for name in names]
        return "/".join("-" if v is None else f"{v:.2f}" for v in values)

    groups = [
        [m.name for m in COMPARED_METRICS if m.name.startswith(prefix)]
        for prefix in ("ttft", "itl", "e2e")
    ]
    return ["  B/A", "", cell("errors"), cell(*groups[0]), cell(*groups[1]), cell(*groups[2])] + [
        cell(name) for name in ("output_tokens_per_s", "chunks_per_s", "tokens_per_chunk")
    ]


def _metrics_table(summary: Summary) -> list[str]:
    lines = [_row(list(_COLUMNS)), _row(["-" * w for w in _WIDTHS])]
    for scenario, by_target in summary.metrics.items():
        for position, label in enumerate(summary.targets):
            name = (
                scenario
                if len(summary.targets) == 1
                else f"{scenario if position == 0 else ''} [{label}]"
            )
            lines.append(_row(_metric_cells(name, by_target[label])))
        if summary.ratios:
            lines.append(_row(_ratio_cells(summary.ratios[scenario])))
    return lines


def _findings(result: AuditResult, summary: Summary) -> list[str]:
    if not summary.causes:
        return ["Findings: none."]
    notes = [cause for cause in summary.causes if cause.severity == "note"]
    failing = len(summary.causes) - len(notes)
    headline = failing_headline(summary.causes, result.findings) if failing else "nothing broken"
    lines = [f"Findings: {headline}; {len(notes)} note causes."]
    for cause in summary.causes:
        lines += _cause(cause)
    return lines


def _cause(cause: Cause) -> list[str]:
    per_target = ", ".join(f"{label} {count}" for label, count in cause.requests.items())
    noun = "request" if cause.num_requests == 1 else "requests"
    lines = [
        f"  [{cause.severity}] {cause.check_id}: {cause.cause}",
        f"    {cause.num_requests} {noun} ({per_target}); {CHECKS[cause.check_id].summary}",
    ]
    shown = cause.messages[:MESSAGES_SHOWN]
    lines += [f"    · {message[:EVIDENCE_CHARS]}" for message in shown]
    if len(cause.messages) > len(shown):
        lines.append(f"    · and {len(cause.messages) - len(shown)} more distinct messages")
    if cause.example is not None:
        lines += _example(cause.example)
    return lines


def _example(finding: Finding) -> list[str]:
    chunks = (
        f" chunks {','.join(map(str, finding.chunk_numbers[:10]))}" if finding.chunk_numbers else ""
    )
    lines = [f"    example [{finding.target}] {finding.case}{chunks}"]
    if finding.request:
        lines.append(f"      request: {finding.request[:EVIDENCE_CHARS]}")
    lines += [f"      {quote[:EVIDENCE_CHARS]}" for quote in finding.evidence[:2]]
    return lines


def _coverage(summary: Summary) -> list[str]:
    """Per check, the responses it could read: 0 means it checked nothing."""
    coverage = summary.coverage
    lines = ["", "Coverage (responses each check could read, of all responses read):"]
    for check_id, counts in coverage.by_check.items():
        cells = ", ".join(
            f"{label} {count}/{coverage.responses[label]}" for label, count in counts.items()
        )
        idle = "  (nothing to check)" if not any(counts.values()) else ""
        lines.append(f"  {check_id}: {cells}{idle}")
    lines += [f"  [{label}] backpressure: {line}" for label, line in summary.merging.items()]
    return lines


def _determinism(summary: Summary) -> list[str]:
    lines = [
        "",
        "Determinism (streamed text equal to the non-streamed greedy text; not an invariant):",
    ]
    for label, figure in summary.determinism.items():
        equal = figure.compared - figure.mismatched
        lines.append(f"  [{label}] {equal}/{figure.compared} streams equal")
        if figure.crowd_compared:
            lines.append(f"  [{label}] {figure.crowd_equality}")
    return lines


def _figures(summary: Summary) -> list[str]:
    lines = []
    for label, by_scenario in summary.figures.items():
        for scenario, figures in by_scenario.items():
            values = ", ".join(f"{name} {value:.3g}" for name, value in figures.items())
            lines.append(f"  [{label}] {scenario}: {values}")
    return ["", "Scenario figures:", *lines] if lines else []


def _verdict(result: AuditResult, summary: Summary) -> str:
    broken = [f for f in result.findings if f.is_failure]
    if not broken and result.unverified:
        checks = ", ".join(sorted({f.check_id for f in result.unverified}))
        return f"UNVERIFIED: no invariant broken, but not every check was exercised: {checks}."
    if not broken:
        return "PASS: no invariant broken."
    checks = sorted({f.check_id for f in broken})
    headline = failing_headline(summary.causes, result.findings)
    return f"FAIL: {headline}: {', '.join(checks)}."
