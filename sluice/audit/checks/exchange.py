"""All the per-response checks on one exchange (and on its non-streamed twin).

Each check is a function `(Exchange, StreamView) -> list[Finding]`; the ids
they report are listed with their severities in `catalogue.CHECKS`. The
agent APIs (Responses, Messages) have event models of their own, and
Ollama's chat its NDJSON lines: their answers get their own checks, not chat's.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.audit.checks.catalogue import SUBSUMED_BY
from sluice.audit.checks.evidence import merge_findings
from sluice.audit.checks.logprobs import check_logprobs
from sluice.audit.checks.messages import check_messages_stream
from sluice.audit.checks.messages_final import check_messages_final, check_messages_status
from sluice.audit.checks.ollama import check_ollama_status, check_ollama_stream, check_ollama_twin
from sluice.audit.checks.responses import check_responses_stream
from sluice.audit.checks.responses_final import check_responses_final, check_responses_twin
from sluice.audit.checks.responses_tokens import check_responses_tokens
from sluice.audit.checks.shape import check_shape
from sluice.audit.checks.text import check_text
from sluice.audit.checks.usage import check_usage
from sluice.audit.checks.wire import check_status, check_stream_framing
from sluice.audit.records import MESSAGES, OLLAMA_CHAT, RESPONSES, Exchange, Finding
from sluice.audit.stream_view import StreamView, view_of

Check = Callable[[Exchange, StreamView], list[Finding]]

RESPONSE_CHECKS: tuple[Check, ...] = (
    check_status,
    check_stream_framing,
    check_shape,
    check_usage,
    check_logprobs,
    check_text,
)
CHECKS_BY_ENDPOINT: dict[str, tuple[Check, ...]] = {
    RESPONSES: (
        check_status,
        check_responses_stream,
        check_responses_final,
        check_responses_twin,
        check_responses_tokens,
    ),
    MESSAGES: (check_messages_status, check_messages_stream, check_messages_final),
    OLLAMA_CHAT: (check_ollama_status, check_ollama_stream, check_ollama_twin),
}


def checks_for(exchange: Exchange) -> tuple[Check, ...]:
    return CHECKS_BY_ENDPOINT.get(exchange.endpoint, RESPONSE_CHECKS)


def ensure_view(exchange: Exchange) -> StreamView:
    return view_of(exchange)


def check_exchange(exchange: Exchange, *, include_twin: bool = True) -> list[Finding]:
    """Every response check on one exchange (and on its twin, unless that twin
    is shared and was checked already), one finding per id and response."""
    if exchange.twin is not None:
        ensure_view(exchange.twin)
    view = ensure_view(exchange)
    findings = _primary(
        merge_findings([item for check in checks_for(exchange) for item in check(exchange, view)])
    )
    if exchange.twin is not None and include_twin:
        twin_view = ensure_view(exchange.twin)
        twin_findings = [
            item for check in checks_for(exchange.twin) for item in check(exchange.twin, twin_view)
        ]
        findings += merge_findings(twin_findings)
    return findings


def _primary(findings: list[Finding]) -> list[Finding]:
    """Drop findings explained by another finding on the same response."""
    ids = {finding.check_id for finding in findings}
    return [f for f in findings if not SUBSUMED_BY.get(f.check_id, frozenset()) & ids]
