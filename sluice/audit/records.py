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

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

ReaderKind = Literal["normal", "slow", "abandon", "pause"]
# "break": the OpenAI API's contract broke; "extension": a vLLM extension the
# server supports (its preflight probe passed) broke; "strict": a rule sluice
# holds itself to beyond the API (reported with --strict only); "unverified":
# a check the audit could not exercise on this server (no stream merged, no
# running-requests gauge): never a pass, nor a broken invariant (exit 3);
# "note": reported, never failed. "break", "extension" and "strict" fail the
# audit (exit 1).
Severity = Literal["break", "extension", "strict", "unverified", "note"]
FAILING_SEVERITIES = frozenset({"break", "extension", "strict"})

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
# The agent APIs: OpenAI's Responses and Anthropic's Messages. Their streams
# name each event (`event: <type>`) and end without [DONE]; they have checks
# of their own (checks/responses.py, checks/messages.py).
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
AGENT_ENDPOINTS = frozenset({RESPONSES, MESSAGES})
# Ollama's chat: NDJSON lines, not SSE; its own checks (checks/ollama.py).
OLLAMA_CHAT = "/api/chat"


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
    # pause: after this many SSE events, read nothing (the server's writes
    # back up) until `resume` is set or `pause_s` passed, then read as fast
    # as the bytes come.
    pause_after_events: int = 1
    pause_s: float = 0.0
    resume: asyncio.Event | None = None


# Weak references let `stream_view.view_of` remember each exchange's view
# without this module knowing the view's type (records stays a leaf).
@dataclass(slots=True, weakref_slot=True)
class Exchange:
    """One HTTP request and its response, as seen on the wire."""

    scenario: str
    target: str
    # "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"
    # or "/api/chat".
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
    # Sent again on a fresh connection: the pooled one it went out on was dead
    # (closed by the server after its previous response) before any byte came.
    is_retried: bool = False
    # The same request sent with `stream: false`, for I1 and for counting
    # tokens; in the backpressure scenario, the same request streamed to a
    # reader that kept up (the paused stream's reference, chunk by chunk).
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
    # What the report groups by, with the check id: findings of one cause share
    # it across responses (by default the message with its numbers and quoted
    # texts blanked out, see `evidence.cause_of`).
    cause: str = ""
    # Which response it is about (0: the server as a whole), so a report can
    # count affected requests.
    response_id: int = 0

    @property
    def is_failure(self) -> bool:
        return self.severity in FAILING_SEVERITIES


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
    # About the server rather than a scenario: preflight (extensions it lacks)
    # and transport (it closes kept-alive connections) notes.
    server_findings: list[Finding] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        scenario_findings = [finding for result in self.results for finding in result.findings]
        return self.server_findings + scenario_findings

    @property
    def has_broken_invariant(self) -> bool:
        return any(finding.is_failure for finding in self.findings)

    @property
    def unverified(self) -> list[Finding]:
        """Checks the audit could not exercise: the verdict cannot be a pass."""
        return [finding for finding in self.findings if finding.severity == "unverified"]

    def results_for(self, target: str) -> list[ScenarioResult]:
        return [result for result in self.results if result.target == target]
