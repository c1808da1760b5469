"""Checks of the wire and of HTTP errors (STREAMING_CONTRACT.md, "The wire").

Stream framing: Content-Type, `data: ` + one JSON object line + blank line
per event (`data: null` is a break of its own: clients hand the None to user
code), `[DONE]` last and nothing after it. A stream may end with one error
object and `[DONE]` (the request failed after its headers, as the contract
prescribes: a note); any other error event is a break. Comment lines are
sluice's strict rule only.

Errors: any 4xx carries the OpenAI error object (`param` is sluice's strict
rule: openai-python does not need it); 5xx (but 503 with Retry-After) and 422
are failures whatever the request was. A valid request answered 4xx, or
429/503 with Retry-After, is a refusal: a note, and no other check reads it.
Transport failures: a timeout before the first token is capacity (the
request waited its turn under the load: a note), a timeout after it a
stalled stream, anything else a connection error.
"""

from __future__ import annotations

import json
from typing import Any

from sluice.audit.checks.evidence import escape_bytes, finding
from sluice.audit.records import AGENT_ENDPOINTS, Exchange, Finding
from sluice.audit.sse import SseEvent
from sluice.audit.stream_view import StreamView


def check_stream_framing(exchange: Exchange, view: StreamView) -> list[Finding]:
    if not exchange.is_stream or exchange.status != 200 or view.sse is None:
        return []
    findings = []
    if not exchange.content_type.startswith("text/event-stream"):
        message = f"Content-Type is {exchange.content_type!r}"
        findings.append(finding("content_type", exchange, message, view=view))
    for event in view.sse.events:
        findings += _check_event(exchange, view, event)
    if exchange.reader != "abandon" and exchange.transport_error is None:
        findings += _check_done(exchange, view)
    return findings


def _check_event(exchange: Exchange, view: StreamView, event: SseEvent) -> list[Finding]:
    numbers = [event.number]
    found = []
    if event.comment_lines:
        message = f"{event.comment_lines} comment lines"
        found.append(finding("comment_line", exchange, message, numbers, view=view))
    if event.problem:
        found.append(finding("framing", exchange, event.problem, numbers, view=view))
    elif event.data is not None and not event.is_done and not isinstance(event.payload, dict):
        message = f"data is {event.data[:20].decode('utf-8', 'replace')}, not a JSON object"
        found.append(finding("data_null", exchange, message, numbers, view=view))
    elif isinstance(event.payload, dict) and "error" in event.payload:
        found.append(_error_event(exchange, view, event))
    return found


def _error_event(exchange: Exchange, view: StreamView, event: SseEvent) -> Finding:
    assert view.sse is not None, "stream views carry their parse"
    later = [other for other in view.sse.events if other.number > event.number]
    is_last_before_done = [other.is_done for other in later] == [True]
    problem = error_shape_problem(event.payload)
    if problem is None and is_last_before_done:
        message = f"error: {str(event.payload['error'].get('message'))[:120]}"
        return finding(
            "stream_ended_by_error", exchange, message, [event.number], view=view,
            cause="the stream ended with an error event",
        )  # fmt: skip
    why = problem or f"{len(later)} events follow it, expected [DONE] alone"
    return finding("error_event", exchange, why, [event.number], view=view)


def _check_done(exchange: Exchange, view: StreamView) -> list[Finding]:
    assert view.sse is not None, "stream views carry their parse"
    events, trailing = view.sse.events, view.sse.trailing
    done_numbers = [event.number for event in events if event.is_done]
    last_number = events[-1].number if events else 0
    if not done_numbers:
        evidence = [f"#{last_number}: {escape_bytes(events[-1].raw)}"] if events else []
        if trailing:
            evidence.append(f"unterminated: {escape_bytes(trailing)}")
        return [
            finding("done_missing", exchange, "no data: [DONE]", [last_number], evidence=evidence)
        ]
    if done_numbers[0] != last_number or trailing:
        after = [event.number for event in events if event.number > done_numbers[0]]
        message = f"{len(after)} events and {len(trailing)} stray bytes after [DONE]"
        quoted = finding("done_not_last", exchange, message, [done_numbers[0], *after], view=view)
        if trailing:
            quoted.evidence.append(f"after: {escape_bytes(trailing)}")
        return [quoted]
    return []


def check_status(exchange: Exchange, view: StreamView) -> list[Finding]:
    findings = []
    if exchange.transport_error and exchange.reader != "abandon":
        check_id = _transport_check_id(exchange, view)
        findings.append(finding(check_id, exchange, exchange.transport_error))
    status = exchange.status
    if status is None or status < 400:
        return findings
    if status == 422:
        return findings + [finding("status_422", exchange, "422 answer")]
    if status >= 500 and not (status == 503 and exchange.retry_after):
        return findings + [finding("server_error_5xx", exchange, f"{status} answer")]
    if status in (429, 503) and not exchange.retry_after:
        findings.append(finding("retry_after_missing", exchange, f"{status} without Retry-After"))
    payload = _json_or_none(exchange.raw)
    problem = error_shape_problem(payload)
    if problem:
        findings.append(finding("bad_error_shape", exchange, f"{status} body: {problem}"))
    elif "param" not in payload["error"]:
        message = f"{status} error object has no param key"
        findings.append(finding("error_param_missing", exchange, message))
    if not exchange.expects_error:
        findings.append(_refusal(exchange, status, payload))
    return findings


def _refusal(exchange: Exchange, status: int, payload: Any) -> Finding:
    """A valid request the server declined: what it said, for the reader to judge."""
    error = payload.get("error") if isinstance(payload, dict) else None
    said = error.get("message") if isinstance(error, dict) else None
    message = f"{status}: {str(said)[:160]}" if said is not None else f"{status} answer"
    return finding("request_refused", exchange, message, cause=f"{status} for a valid request")


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def error_shape_problem(payload: Any) -> str | None:
    """What keeps a body from being an OpenAI error object; None when it is one."""
    if not isinstance(payload, dict) or not isinstance(payload.get("error"), dict):
        return 'not {"error": {...}}'
    error = payload["error"]
    missing = [key for key in ("message", "type", "code") if key not in error]
    if missing:
        return f"error object lacks {', '.join(missing)}"
    if not isinstance(error["message"], str) or not isinstance(error["type"], str):
        return "error message and type must be strings"
    return None


# aiohttp's and asyncio's names for "nothing arrived in time".
_TIMEOUT_ERRORS = ("SocketTimeoutError", "ServerTimeoutError", "ConnectionTimeoutError",
                   "TimeoutError")  # fmt: skip


def _transport_check_id(exchange: Exchange, view: StreamView) -> str:
    """A timeout before any token came is capacity: the request waited for a
    place in the batch (a chat stream's headers and role chunk may have gone
    out before that). Once tokens flow, a timeout is a stalled stream."""
    assert exchange.transport_error is not None, "only for failed exchanges"
    error_type = exchange.transport_error.split(":", 1)[0]
    if error_type not in _TIMEOUT_ERRORS:
        return "connection_error"
    has_token = any(
        chunk.has_content or chunk.finish_reason is not None
        for chunks in view.choices.values()
        for chunk in chunks
    ) or (exchange.endpoint in AGENT_ENDPOINTS and b"delta" in exchange.raw)
    return "stream_stalled" if has_token else "timeout_before_response"
