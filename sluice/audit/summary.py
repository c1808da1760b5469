"""The figures every report shows, computed once from an `AuditResult`:
metrics per scenario and in total per target, B/A ratios in compare mode,
findings grouped by cause (check id and cause) with the requests each
affects, per-check coverage, the determinism figure, the scenarios' own
figures and the exit status.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.audit.checks.catalogue import CHECKS
from sluice.audit.checks.coverage import COVERAGE, covered_checks
from sluice.audit.checks.evidence import MESSAGE_SEPARATOR, cause_of
from sluice.audit.checks.exchange import ensure_view
from sluice.audit.compare import ratios
from sluice.audit.metrics import ScenarioMetrics, summarize
from sluice.audit.records import AGENT_ENDPOINTS, AuditResult, Exchange, Finding, Severity
from sluice.audit.scenarios.backpressure import NAME as BACKPRESSURE
from sluice.audit.scenarios.backpressure import merging_line

SEVERITY_ORDER: tuple[Severity, ...] = ("break", "extension", "strict", "unverified", "note")
# Exit statuses: every invariant held; one broke; none broke but a check could
# not be exercised (no stream merged, abort not verifiable): not a pass.
EXIT_PASS, EXIT_BROKEN, EXIT_UNVERIFIED = 0, 1, 3


@dataclass(slots=True)
class Cause:
    """Findings of one check that share one cause, across responses and targets."""

    check_id: str
    cause: str
    severity: Severity
    # target label -> responses affected.
    requests: dict[str, int]
    # Every distinct message, in the order first seen.
    messages: list[str] = field(default_factory=list)
    example: Finding | None = None

    @property
    def num_requests(self) -> int:
        return sum(self.requests.values())


@dataclass(slots=True)
class Coverage:
    # Responses read per target (streams, non-streamed answers and twins).
    responses: dict[str, int]
    # check id -> target label -> responses that check could read.
    by_check: dict[str, dict[str, int]]


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
    # check id -> target label -> findings (one per response, check and cause).
    findings_by_check: dict[str, dict[str, int]]
    # Grouped by (check, cause), failing severities first, most requests first.
    causes: list[Cause]
    coverage: Coverage
    determinism: dict[str, Determinism]
    # target label -> scenario -> figure name -> value.
    figures: dict[str, dict[str, dict[str, float]]]
    exit_status: int
    # target label -> "merging achieved on N of M streams (per API)", where
    # the backpressure scenario ran.
    merging: dict[str, str] = field(default_factory=dict)


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
        causes=group_causes(result.findings, labels),
        coverage=coverage_of(result, labels),
        determinism={label: _determinism(result, label) for label in labels},
        figures={
            label: {r.scenario: r.figures for r in result.results_for(label) if r.figures}
            for label in labels
        },
        exit_status=exit_status_of(result),
        merging={
            label: merging_line(r.figures)
            for label in labels
            for r in result.results_for(label)
            if r.scenario == BACKPRESSURE and "paused_streams" in r.figures
        },
    )


def exit_status_of(result: AuditResult) -> int:
    if result.has_broken_invariant:
        return EXIT_BROKEN
    return EXIT_UNVERIFIED if result.unverified else EXIT_PASS


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
        and exchange.endpoint not in AGENT_ENDPOINTS  # compared by their own checks
        and exchange.is_ok
        and exchange.reader != "abandon"
        and twin is not None
        and twin.is_ok
    )


def group_causes(findings: list[Finding], labels: list[str]) -> list[Cause]:
    groups: dict[tuple[str, str], Cause] = {}
    seen: dict[tuple[str, str], set[tuple[str, int]]] = {}
    for item in findings:
        key = (item.check_id, item.cause or cause_of(item.message))
        group = groups.get(key)
        if group is None:
            severity = CHECKS[item.check_id].severity
            group = groups[key] = Cause(*key, severity, dict.fromkeys(labels, 0))
            group.example, seen[key] = item, set()
        response = (item.target, item.response_id or id(item))
        if response not in seen[key]:
            seen[key].add(response)
            group.requests[item.target] = group.requests.get(item.target, 0) + 1
        for message in item.message.split(MESSAGE_SEPARATOR):
            if message not in group.messages:
                group.messages.append(message)
    return sorted(
        groups.values(),
        key=lambda g: (SEVERITY_ORDER.index(g.severity), -g.num_requests, g.check_id, g.cause),
    )


def failing_headline(causes: list[Cause], findings: list[Finding]) -> str:
    """ "N causes in M checks (K requests)" over the failing findings."""
    failing = [cause for cause in causes if cause.severity not in ("note", "unverified")]
    checks = {cause.check_id for cause in failing}
    responses = {(f.target, f.response_id or id(f)) for f in findings if f.is_failure}
    return f"{len(failing)} causes in {len(checks)} checks ({len(responses)} requests)"


def _responses(result: AuditResult, label: str) -> list[Exchange]:
    """Every response of a target once (twins shared by several streams, once)."""
    unique: dict[int, Exchange] = {}
    for scenario_result in result.results_for(label):
        for exchange in scenario_result.exchanges:
            unique[id(exchange)] = exchange
            if exchange.twin is not None:
                unique[id(exchange.twin)] = exchange.twin
    return list(unique.values())


def coverage_of(result: AuditResult, labels: list[str]) -> Coverage:
    responses: dict[str, int] = {}
    by_check = {check_id: dict.fromkeys(labels, 0) for check_id in COVERAGE}
    for label in labels:
        exchanges = _responses(result, label)
        responses[label] = len(exchanges)
        for exchange in exchanges:
            for check_id in covered_checks(exchange):
                by_check[check_id][label] += 1
    return Coverage(responses, by_check)
