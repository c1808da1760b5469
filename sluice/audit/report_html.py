"""The HTML report (`--html PATH`): one self-contained page (inline CSS and
SVG, no script, no external asset) that a person reads at a glance: the
verdict, the findings with their evidence, the metrics table (B/A in compare
mode), latency CDFs, throughput over time and the tokens-per-chunk histogram.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from sluice.audit.compare import COMPARED_METRICS
from sluice.audit.metrics import (
    ScenarioMetrics,
    samples_of,
    throughput_timeline,
    tokens_per_chunk_counts,
)
from sluice.audit.records import AuditResult, Finding, ScenarioResult
from sluice.audit.summary import EXIT_PASS, EXIT_UNVERIFIED, Summary
from sluice.audit.svg import PALETTE, Band, Series, bar_chart, line_chart

MAX_CDF_POINTS = 300
EXAMPLES_PER_CHECK = 5
HISTOGRAM_MAX_TOKENS = 16

_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1200px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.verdict { display: inline-block; padding: 4px 12px; border-radius: 4px; color: white; font-weight: bold; }
.pass { background: #2e7d32; } .fail { background: #c62828; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; } th { background: #f4f4f4; }
td:first-child, th:first-child { text-align: left; }
tr.ratio td { color: #555; font-style: italic; }
.break, .extension { color: #c62828; font-weight: bold; } .strict { color: #6a1b9a; } .unverified { color: #b35900; } .note { color: #8a6d00; }
pre { background: #f7f7f7; padding: 6px; white-space: pre-wrap; word-break: break-all; font-size: 12px; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; } .plots svg { border: 1px solid #eee; }
details { margin: 4px 0; } summary { cursor: pointer; }
"""


def render_html(result: AuditResult, summary: Summary) -> str:
    # At a glance first (verdict, what broke, figures, plots); the evidence after.
    sections = [
        _header(result, summary),
        _findings_section(summary),
        _metrics_section(summary),
        _plots_section(result, summary),
        _evidence_section(result, summary),
        _determinism_section(summary),
    ]
    body = "\n".join(sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>sluice audit</title><style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def write_html(result: AuditResult, summary: Summary, path: Path) -> None:
    path.write_text(render_html(result, summary), encoding="utf-8")


def _header(result: AuditResult, summary: Summary) -> str:
    is_pass = summary.exit_status == EXIT_PASS
    verdict = {
        EXIT_PASS: "PASS: no invariant broken",
        EXIT_UNVERIFIED: "UNVERIFIED: no invariant broken, not every check exercised",
    }.get(summary.exit_status, "FAIL: invariants broken")
    targets = "".join(
        f"<li><b>{escape(t.label)}</b>: {escape(t.base_url)} · model <code>{escape(t.model)}</code></li>"
        for t in result.targets
    )
    return (
        f"<h1>sluice audit</h1><p><span class='verdict {'pass' if is_pass else 'fail'}'>{verdict}</span> "
        f"· {escape(result.profile)} profile · {len(result.scenarios)} scenarios · "
        f"{result.duration_s:.1f}s · started {escape(result.started_at)}</p><ul>{targets}</ul>"
    )


def _findings_section(summary: Summary) -> str:
    """One row per cause (check and cause), failing severities first."""
    if not summary.causes:
        return "<h2>Findings</h2><p>None: every check passed.</p>"
    header = "".join(f"<th>{escape(label)}</th>" for label in summary.targets)
    rows = []
    for cause in summary.causes:
        cells = "".join(f"<td>{cause.requests.get(label, 0)}</td>" for label in summary.targets)
        messages = "<br>".join(escape(message) for message in cause.messages[:6])
        rows.append(
            f"<tr><td><code>{cause.check_id}</code></td>"
            f"<td class='{cause.severity}'>{cause.severity}</td>"
            f"<td style='text-align:left'>{escape(cause.cause)}<br><small>{messages}</small></td>"
            f"{cells}</tr>"
        )
    return (
        "<h2>Findings by cause</h2><table><tr><th>check</th><th>severity</th>"
        f"<th style='text-align:left'>cause and its messages</th>{header}</tr>{''.join(rows)}"
        "</table><p>Counts are requests affected. Evidence for each is below the plots.</p>"
    )


def _evidence_section(result: AuditResult, summary: Summary) -> str:
    """A few examples per check; the JSON report holds them all."""
    if not summary.findings_by_check:
        return ""
    parts = ["<h2>Evidence</h2>"]
    for check_id in summary.findings_by_check:
        examples = [f for f in result.findings if f.check_id == check_id]
        parts += [_finding_details(f) for f in examples[:EXAMPLES_PER_CHECK]]
        if len(examples) > EXAMPLES_PER_CHECK:
            parts.append(
                f"<p>… and {len(examples) - EXAMPLES_PER_CHECK} more <code>{check_id}</code> (see --json).</p>"
            )
    return "\n".join(parts)


def _finding_details(finding: Finding) -> str:
    chunks = ", ".join(map(str, finding.chunk_numbers)) or "-"
    evidence = escape("\n".join(finding.evidence)) or "(no body)"
    return (
        f"<details><summary><span class='{finding.severity}'>{finding.check_id}</span> "
        f"[{escape(finding.target)}] {escape(finding.case)}: {escape(finding.message)}</summary>"
        f"<p>scenario {escape(finding.scenario)} · {escape(finding.endpoint)} · chunks {chunks}</p>"
        f"<pre>request: {escape(finding.request)}</pre><pre>{evidence}</pre></details>"
    )


def _format(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _metric_cells(metrics: ScenarioMetrics) -> list[str]:
    cells = [str(metrics.requests)]
    for metric in COMPARED_METRICS:
        value = metric.read(metrics)
        is_latency = metric.name.startswith(("ttft", "itl", "e2e"))
        cells.append(_format(value, 1000 if is_latency else 1, 0 if metric.name == "errors" else 1))
    return cells


def _metrics_section(summary: Summary) -> str:
    header = "".join(f"<th>{escape(m.label)}</th>" for m in COMPARED_METRICS)
    rows = []
    for scenario, by_target in summary.metrics.items():
        for label in summary.targets:
            name = scenario if len(summary.targets) == 1 else f"{scenario} [{label}]"
            cells = "".join(f"<td>{cell}</td>" for cell in _metric_cells(by_target[label]))
            rows.append(f"<tr><td>{escape(name)}</td>{cells}</tr>")
        if summary.ratios:
            ratios = summary.ratios[scenario]
            cells = "".join(
                f"<td>{_format(ratios.get(m.name), 1, 2)}</td>" for m in COMPARED_METRICS
            )
            rows.append(f"<tr class='ratio'><td>{escape(scenario)} B/A</td><td></td>{cells}</tr>")
    return (
        "<h2>Measurements</h2><p>Latencies in milliseconds, from streams read at full speed.</p>"
        f"<table><tr><th>scenario</th><th>req</th>{header}</tr>{''.join(rows)}</table>"
    )


def _latency_groups(
    result: AuditResult, summary: Summary
) -> list[tuple[str, list[ScenarioResult]]]:
    """Compare mode: one line per target; one target: one line per scenario."""
    if len(summary.targets) > 1:
        return [(label, result.results_for(label)) for label in summary.targets]
    return [(r.scenario, [r]) for r in result.results]


def _cdf(name: str, values: list[float], color: str) -> Series:
    ordered = sorted(values)
    stride = max(1, len(ordered) // MAX_CDF_POINTS)
    picked = list(range(0, len(ordered), stride))
    if picked and picked[-1] != len(ordered) - 1:
        picked.append(len(ordered) - 1)
    return Series(
        name, [ordered[i] * 1000 for i in picked], [(i + 1) / len(ordered) for i in picked], color
    )


def _latency_plots(result: AuditResult, summary: Summary) -> list[str]:
    plots = []
    for title, pick in (
        ("Time to first token (CDF)", lambda s: [s.ttft_s] if s.ttft_s is not None else []),
        ("Inter-token latency (CDF)", lambda s: s.itl_s),
        ("End-to-end latency (CDF)", lambda s: [s.e2e_s]),
    ):
        series = []
        for position, (name, results) in enumerate(_latency_groups(result, summary)):
            values = [
                v
                for sample in samples_of(results)
                if sample.is_latency_sample
                for v in pick(sample)
            ]
            if values:
                series.append(_cdf(name, values, PALETTE[position % len(PALETTE)]))
        plots.append(line_chart(title, series, "milliseconds", "cumulative share", is_step=True))
    return plots


def _throughput_plot(result: AuditResult, summary: Summary) -> str:
    series = []
    for position, label in enumerate(summary.targets):
        timeline = throughput_timeline(result.results_for(label), result.duration_s)
        series.append(
            Series(
                label, timeline.starts_s, timeline.tokens_per_s, PALETTE[position % len(PALETTE)]
            )
        )
    # Shade the scenarios of the first target (in compare mode B's runs interleave with them).
    bands = [
        Band(r.started_s, r.finished_s, r.scenario) for r in result.results_for(summary.targets[0])
    ]
    return line_chart(
        "Output throughput over time", series, "seconds since start", "tokens/s", bands=bands
    )


def _chunk_histogram(result: AuditResult, summary: Summary) -> str:
    counts = {
        label: tokens_per_chunk_counts(result.results_for(label)) for label in summary.targets
    }
    sizes = sorted({min(size, HISTOGRAM_MAX_TOKENS) for c in counts.values() for size in c})
    categories = [f"{size}+" if size == HISTOGRAM_MAX_TOKENS else str(size) for size in sizes]
    series = []
    for position, (label, histogram) in enumerate(counts.items()):
        total = sum(histogram.values()) or 1
        shares = [0.0] * len(sizes)
        for size, count in histogram.items():
            shares[sizes.index(min(size, HISTOGRAM_MAX_TOKENS))] += 100 * count / total
        series.append(Series(label, [], shares, PALETTE[position % len(PALETTE)]))
    return bar_chart("Tokens per chunk", categories, series, "tokens in a chunk", "% of chunks")


def _plots_section(result: AuditResult, summary: Summary) -> str:
    plots = _latency_plots(result, summary)
    plots += [_throughput_plot(result, summary), _chunk_histogram(result, summary)]
    return "<h2>Plots</h2><div class='plots'>" + "\n".join(plots) + "</div>"


def _determinism_section(summary: Summary) -> str:
    items = "".join(
        f"<li>[{escape(label)}] {figure.compared - figure.mismatched}/{figure.compared} streams equal "
        "to the non-streamed greedy text</li>"
        + (
            f"<li>[{escape(label)}] {escape(figure.crowd_equality)}</li>"
            if figure.crowd_compared
            else ""
        )
        for label, figure in summary.determinism.items()
    )
    figures = "".join(
        f"<li>[{escape(label)}] {escape(scenario)}: "
        + ", ".join(f"{escape(name)} {value:.3g}" for name, value in values.items())
        + "</li>"
        for label, by_scenario in summary.figures.items()
        for scenario, values in by_scenario.items()
    )
    return (
        "<h2>Determinism</h2><p>Reported, not failed: a correct server may not be batch-invariant.</p>"
        f"<ul>{items}</ul><h2>Scenario figures</h2><ul>{figures}</ul>"
    )
