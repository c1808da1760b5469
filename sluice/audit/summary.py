"""The figures every report shows, computed once from an `AuditResult`:
metrics per scenario and in total per target, B/A ratios in compare mode,
findings counted per check and target, the determinism figure, the
scenarios' own figures and the exit status.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.audit.checks.exchange import ensure_view
from sluice.audit.compare import ratios
from sluice.audit.metrics import ScenarioMetrics, summarize
from sluice.audit.records import AuditResult, Exchange

TOTAL = "all"


@dataclass(slots=True)
class Determinism:
    # Streams that had a non-streamed twin to compare with.
    compared: int
    # Of those, streams whose text differed from the twin's.
    mismatched: int
    # The determinism scenario: probes answered both alone and inside a crowd,
    # and of those, the ones whose tokens (and also logprobs) were equal.
    crowd_compared: int = 0
    crowd_tokens_equal: int = 0
    crowd_logprobs_equal: int = 0

    @property
    def crowd_equality(self) -> str:
        """The determinism scenario's figure, in words."""
        total = self.crowd_compared
        return (
            f"alone vs inside a crowd: tokens equal in {self.crowd_tokens_equal}/{total} "
            f"probes, tokens and logprobs in {self.crowd_logprobs_equal}/{total}"
        )


@dataclass(slots=True)
class Summary:
    targets: list[str]
    scenarios: list[str]
    # scenario (or "all") -> target label -> metrics.
    metrics: dict[str, dict[str, ScenarioMetrics]]
    # scenario (or "all") -> metric name -> B/A; empty unless comparing two targets.
    ratios: dict[str, dict[str, float | None]]
    # check id -> target label -> findings (one per response and check).
    findings_by_check: dict[str, dict[str, int]]
    determinism: dict[str, Determinism]
    # target label -> scenario -> figure name -> value.
    figures: dict[str, dict[str, dict[str, float]]]
    exit_status: int


def summarize_audit(result: AuditResult) -> Summary:
    labels = [target.label for target in result.targets]
    metrics: dict[str, dict[str, ScenarioMetrics]] = {}
    for scenario in [*result.scenarios, TOTAL]:
        metrics[scenario] = {}
        for label in labels:
            chosen = [r for r in result.results_for(label) if scenario in (TOTAL, r.scenario)]
            metrics[scenario][label] = summarize(chosen)
    compared = {}
    if len(labels) == 2:
        compared = {
            scenario: ratios(row[labels[0]], row[labels[1]]) for scenario, row in metrics.items()
        }
    by_check: dict[str, dict[str, int]] = {}
    for finding in result.findings:
        counts = by_check.setdefault(finding.check_id, dict.fromkeys(labels, 0))
        counts[finding.target] = counts.get(finding.target, 0) + 1
    return Summary(
        targets=labels,
        scenarios=list(result.scenarios),
        metrics=metrics,
        ratios=compared,
        findings_by_check=dict(sorted(by_check.items())),
        determinism={label: _determinism(result, label) for label in labels},
        figures={
            label: {r.scenario: r.figures for r in result.results_for(label) if r.figures}
            for label in labels
        },
        exit_status=1 if result.has_broken_invariant else 0,
    )


def _determinism(result: AuditResult, label: str) -> Determinism:
    figure = Determinism(0, 0)
    for scenario_result in result.results_for(label):
        if scenario_result.scenario == "determinism":
            figures = scenario_result.figures
            figure.crowd_compared += int(figures.get("probes_compared", 0))
            figure.crowd_tokens_equal += int(figures.get("tokens_equal", 0))
            figure.crowd_logprobs_equal += int(figures.get("logprobs_equal", 0))
        for exchange in scenario_result.exchanges:
            if _has_comparable_twin(exchange):
                figure.compared += 1
                assert exchange.twin is not None, "checked by _has_comparable_twin"
                figure.mismatched += (
                    ensure_view(exchange).texts() != ensure_view(exchange.twin).texts()
                )
    return figure


def _has_comparable_twin(exchange: Exchange) -> bool:
    twin = exchange.twin
    return (
        exchange.is_stream
        and exchange.is_ok
        and exchange.reader != "abandon"
        and twin is not None
        and twin.is_ok
    )
