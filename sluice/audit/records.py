"""The values the audit passes between its stages: who is audited (`Target`),
what was sent and what came back (`Exchange`), what was found (`Finding`) and
what one scenario produced (`ScenarioResult`).

Invariants:
- An `Exchange` keeps the response body byte for byte as it arrived, with the
  arrival time of every piece, so every check can quote raw bytes and every
  measurement can be recomputed from it.
- Times are seconds since the audit started (one clock for every target, so
  compare mode can put two servers on one time axis).
- Request bodies are the JSON objects put on the wire: they stay dicts because
  they are the wire format, not an internal interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ReaderKind = Literal["normal", "slow", "abandon"]
Severity = Literal["invariant", "note"]

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Target:
    # "server" for a single audit; "A" and "B" in compare mode.
    label: str
    # Base URL without a trailing slash and without /v1: http://127.0.0.1:8000
    base_url: str
    # The model name sent in every request.
    model: str
    api_key: str | None = None


@dataclass(frozen=True, slots=True)
class Reader:
    """How the client consumes a response body."""

    kind: ReaderKind = "normal"
    # slow: bytes taken from the socket per read, and the pause between reads.
    read_bytes: int = 256
    interval_s: float = 0.05
    # abandon: close the connection after this many SSE events arrived.
    abandon_after_events: int = 4


# Weak references let `stream_view.view_of` remember each exchange's view
# without this module knowing the view's type (records stays a leaf).
@dataclass(slots=True, weakref_slot=True)
class Exchange:
    """One HTTP request and its response, as seen on the wire."""

    scenario: str
    target: str
    # "/v1/completions" or "/v1/chat/completions".
    endpoint: str
    # The JSON body as sent; None when `raw_request` bytes were sent instead.
    body: dict[str, Any] | None
    # A short name of the case inside its scenario, e.g. "stops/overlapping".
    case: str = ""
    raw_request: bytes | None = None
    reader: ReaderKind = "normal"
    # True for deliberately invalid requests: a 4xx is the right answer.
    expects_error: bool = False
    status: int | None = None
    content_type: str = ""
    retry_after: str | None = None
    # The response body exactly as received.
    raw: bytes = b""
    # One entry per received piece: the end offset in `raw`, and its arrival time.
    arrival_offsets: list[int] = field(default_factory=list)
    arrival_times_s: list[float] = field(default_factory=list)
    sent_s: float = 0.0
    headers_s: float | None = None
    end_s: float = 0.0
    # Connection refused, reset, timed out... (never set for an abandon reader's own close).
    transport_error: str | None = None
    # The same request sent with `stream: false`, for I1 and for counting tokens.
    twin: Exchange | None = None
    # Stops scenario: the greedy text of the same prompt without stop strings, per index.
    unstopped_texts: dict[int, str] | None = None

    @property
    def is_stream(self) -> bool:
        return self.body is not None and self.body.get("stream") is True

    @property
    def is_ok(self) -> bool:
        return self.transport_error is None and self.status is not None and self.status < 300


@dataclass(slots=True)
class Finding:
    """One anomaly, with what a person needs to reproduce and see it."""

    # Stable id, e.g. "usage_frozen" (the list is in sluice.audit.checks.catalogue).
    check_id: str
    # "invariant": the contract broke (exit status 1); "note": reported, not failed.
    severity: Severity
    scenario: str
    target: str
    message: str
    case: str = ""
    endpoint: str = ""
    # The request body as JSON, truncated.
    request: str = ""
    # SSE event numbers (0-based, [DONE] included) that show the anomaly.
    chunk_numbers: list[int] = field(default_factory=list)
    # The raw bytes of those events (escaped, truncated).
    evidence: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ScenarioResult:
    scenario: str
    target: str
    started_s: float
    finished_s: float
    exchanges: list[Exchange] = field(default_factory=list)
    # Findings of the scenario itself (disconnect, health); the per-response
    # checks are added by the runner.
    findings: list[Finding] = field(default_factory=list)
    # Named measurements of the scenario, e.g. "probe_before_s".
    figures: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class AuditResult:
    targets: list[Target]
    profile: str
    scenarios: list[str]
    results: list[ScenarioResult]
    started_at: str
    duration_s: float

    @property
    def findings(self) -> list[Finding]:
        return [finding for result in self.results for finding in result.findings]

    @property
    def has_broken_invariant(self) -> bool:
        return any(finding.severity == "invariant" for finding in self.findings)

    def results_for(self, target: str) -> list[ScenarioResult]:
        return [result for result in self.results if result.target == target]
