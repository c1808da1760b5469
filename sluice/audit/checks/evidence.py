"""Turning an anomaly into a `Finding` a person can act on: the request body,
the chunk numbers, and the raw bytes of those chunks, truncated sensibly
(long events keep their head and tail; at most a few events are quoted), and
the cause it shares with findings on other responses.
"""

from __future__ import annotations

import json
import re

from sluice.audit.checks.catalogue import severity_of
from sluice.audit.records import Exchange, Finding
from sluice.audit.stream_view import StreamView

MAX_EVENT_BYTES = 480
MAX_EVENTS_QUOTED = 4
MAX_REQUEST_CHARS = 700
MAX_CHUNK_NUMBERS = 64
# Between the distinct messages of one merged finding.
MESSAGE_SEPARATOR = " | "
# Quoted texts (reprs of strings and bytes) and numbers vary between responses
# of one cause; blanked out, the rest of a message names the cause.
_QUOTED = re.compile(r"b?'(?:[^'\\]|\\.)*'|b?\"(?:[^\"\\]|\\.)*\"")
_NUMBER = re.compile(r"(?<![A-Za-z_])-?\d+(?:\.\d+)?(?:e-?\d+)?")


def cause_of(message: str) -> str:
    """A message with what varies per response blanked: "chunk #N: ... '…'"."""
    return _NUMBER.sub("N", _QUOTED.sub("…", message))


def escape_bytes(raw: bytes, limit: int = MAX_EVENT_BYTES) -> str:
    """Bytes as readable text: UTF-8 kept, invalid bytes and CR/LF escaped."""
    if len(raw) > limit:
        head, tail = raw[: limit * 3 // 4], raw[-limit // 4 :]
        return f"{escape_bytes(head, limit)} …[{len(raw) - len(head) - len(tail)} bytes]… {escape_bytes(tail, limit)}"
    text = raw.decode("utf-8", "backslashreplace")
    return text.replace("\r", "\\r").replace("\n", "\\n")


def request_text(exchange: Exchange) -> str:
    if exchange.body is None:
        text = escape_bytes(exchange.raw_request or b"")
    else:
        text = json.dumps(exchange.body, ensure_ascii=False, separators=(",", ":"))
    if len(text) > MAX_REQUEST_CHARS:
        return text[: MAX_REQUEST_CHARS - 40] + f"…[{len(text)} chars]"
    return text


def quote_events(exchange: Exchange, view: StreamView | None, numbers: list[int]) -> list[str]:
    if view is None or view.sse is None:
        return [escape_bytes(exchange.raw)] if exchange.raw else []
    by_number = {event.number: event for event in view.sse.events}
    quoted = []
    for number in numbers[:MAX_EVENTS_QUOTED]:
        if number in by_number:
            quoted.append(f"#{number}: {escape_bytes(by_number[number].raw)}")
    return quoted


def finding(
    check_id: str,
    exchange: Exchange,
    message: str,
    chunk_numbers: list[int] | None = None,
    *,
    view: StreamView | None = None,
    evidence: list[str] | None = None,
    cause: str | None = None,
) -> Finding:
    """`cause` names what went wrong when the message's wording varies with more
    than numbers and quoted texts (default: `cause_of(message)`)."""
    numbers = sorted(set(chunk_numbers or []))
    return Finding(
        check_id=check_id,
        severity=severity_of(check_id),
        scenario=exchange.scenario,
        target=exchange.target,
        message=message,
        case=exchange.case,
        endpoint=exchange.endpoint,
        request=request_text(exchange),
        chunk_numbers=numbers[:MAX_CHUNK_NUMBERS],
        evidence=evidence if evidence is not None else quote_events(exchange, view, numbers),
        cause=cause if cause is not None else cause_of(message),
        response_id=id(exchange),
    )


def scenario_finding(
    check_id: str, scenario: str, target: str, message: str, *, evidence: list[str] | None = None
) -> Finding:
    """A finding about the server as a whole rather than one response."""
    return Finding(
        check_id=check_id,
        severity=severity_of(check_id),
        scenario=scenario,
        target=target,
        message=message,
        case=scenario,
        evidence=evidence or [],
        cause=cause_of(message),
    )


def merge_findings(findings: list[Finding]) -> list[Finding]:
    """One finding per check id and cause (call it per response): chunk numbers
    and evidence pooled, every distinct message kept."""
    merged: dict[tuple[str, str], Finding] = {}
    for item in findings:
        first = merged.get((item.check_id, item.cause))
        if first is None:
            merged[(item.check_id, item.cause)] = item
            continue
        if item.message not in first.message.split(MESSAGE_SEPARATOR):
            first.message += MESSAGE_SEPARATOR + item.message
        first.chunk_numbers = sorted(set(first.chunk_numbers + item.chunk_numbers))[
            :MAX_CHUNK_NUMBERS
        ]
        room = MAX_EVENTS_QUOTED - len(first.evidence)
        first.evidence += [quote for quote in item.evidence if quote not in first.evidence][:room]
    return list(merged.values())
