"""The machine-readable report (`--json PATH`).

Top-level keys: tool, schema_version, started_at, duration_s, profile,
scenarios, targets, exit_status, invariants_broken, findings (every finding
with its evidence, cause and severity: break / extension / strict / note),
findings_by_check, causes (grouped by check and cause, with every distinct
message and the requests affected per target), coverage (responses each
check could read), merging (target -> the backpressure scenario's "merging
achieved on N of M streams" line), metrics (target -> scenario|"all" ->
figures), ratios (compare mode: scenario -> metric -> B/A), determinism,
figures (scenario-level measurements), timeline and tokens_per_chunk.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sluice.audit.metrics import throughput_timeline, tokens_per_chunk_counts
from sluice.audit.records import AuditResult
from sluice.audit.summary import Summary

SCHEMA_VERSION = 2


def report_document(result: AuditResult, summary: Summary) -> dict[str, Any]:
    labels = summary.targets
    return {
        "tool": "sluice audit",
        "schema_version": SCHEMA_VERSION,
        "started_at": result.started_at,
        "duration_s": result.duration_s,
        "profile": result.profile,
        "scenarios": result.scenarios,
        "targets": [
            {"label": t.label, "base_url": t.base_url, "model": t.model} for t in result.targets
        ],
        "exit_status": summary.exit_status,
        "invariants_broken": summary.exit_status == 1,
        "findings": [asdict(finding) for finding in result.findings],
        "findings_by_check": summary.findings_by_check,
        "causes": [
            {
                "check_id": cause.check_id,
                "cause": cause.cause,
                "severity": cause.severity,
                "requests": cause.requests,
                "messages": cause.messages,
            }
            for cause in summary.causes
        ],
        "coverage": asdict(summary.coverage),
        "merging": summary.merging,
        "metrics": {
            label: {scenario: asdict(row[label]) for scenario, row in summary.metrics.items()}
            for label in labels
        },
        "ratios": summary.ratios,
        "determinism": {label: asdict(figure) for label, figure in summary.determinism.items()},
        "figures": summary.figures,
        "timeline": {
            label: asdict(throughput_timeline(result.results_for(label), result.duration_s))
            for label in labels
        },
        "tokens_per_chunk": {
            label: {
                str(k): v for k, v in tokens_per_chunk_counts(result.results_for(label)).items()
            }
            for label in labels
        },
    }


def write_json(result: AuditResult, summary: Summary, path: Path) -> None:
    text = json.dumps(
        report_document(result, summary), indent=2, ensure_ascii=False, allow_nan=False
    )
    path.write_text(text + "\n", encoding="utf-8")
