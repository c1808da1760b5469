"""Checks of the chunk shape (STREAMING_CONTRACT.md, "Shape" and I4).

Per response: the same id/created/model on every chunk, the right `object`,
choice indices exactly 0..prompts*n-1. Per index: chat's role chunk first and
only once, no empty chunks, exactly one non-null finish reason and it on the
index's last chunk, `null` (never "" nor a missing key) before it.
"""

from __future__ import annotations

from sluice.audit.checks.evidence import finding
from sluice.audit.records import Exchange, Finding
from sluice.audit.stream_view import ChoiceChunk, StreamView

VALID_FINISH_REASONS = frozenset(
    {"stop", "length", "tool_calls", "content_filter", "function_call"}
)


def check_shape(exchange: Exchange, view: StreamView) -> list[Finding]:
    if not view.request.is_stream or view.sse is None:
        return []
    findings = _check_identity(exchange, view) + _check_indices(exchange, view)
    is_complete = exchange.reader != "abandon" and exchange.transport_error is None
    for chunks in view.choices.values():
        if view.request.is_chat:
            findings += _check_roles(exchange, view, chunks)
        findings += _check_finish(exchange, view, chunks, is_complete)
        findings += _check_empty(exchange, view, chunks)
    return findings


def _check_identity(exchange: Exchange, view: StreamView) -> list[Finding]:
    chunks = [chunk for chunk in view.chunks if not chunk.is_error]
    if not chunks:
        return []
    expected_object = "chat.completion.chunk" if view.request.is_chat else "text_completion"
    first = chunks[0]
    findings = []
    for name in ("id", "created", "model"):
        expected = getattr(first, name)
        changed = [chunk for chunk in chunks if getattr(chunk, name) != expected]
        if changed:
            message = (
                f"{name} changed: chunk #{first.number} has {expected!r}, "
                f"chunk #{changed[0].number} {getattr(changed[0], name)!r} "
                f"({len(changed)} chunks differ)"
            )
            numbers = [first.number, *(chunk.number for chunk in changed)]
            cause = f"{name} differs between chunks of one response"
            findings.append(
                finding("id_changed", exchange, message, numbers, view=view, cause=cause)
            )
    wrong_object = [chunk.number for chunk in chunks if chunk.object != expected_object]
    empty = [c.number for c in chunks if c.num_choices == 0 and c.usage is None]
    if wrong_object:
        message = f"object must be {expected_object!r}"
        findings.append(finding("object_wrong", exchange, message, wrong_object, view=view))
    if empty:
        message = "chunk with no choices and no usage"
        findings.append(finding("empty_chunk", exchange, message, empty, view=view))
    return findings


def _check_indices(exchange: Exchange, view: StreamView) -> list[Finding]:
    expected = set(range(view.request.num_choices))
    unexpected = sorted(set(view.choices) - expected)
    findings = []
    if unexpected:
        numbers = [c.number for index in unexpected for c in view.choices[index]]
        message = f"indices {unexpected} outside 0..{view.request.num_choices - 1}"
        findings.append(finding("index_unexpected", exchange, message, numbers, view=view))
    missing = sorted(expected - set(view.choices))
    if missing and exchange.reader != "abandon" and exchange.transport_error is None:
        message = f"indices {missing} never streamed"
        findings.append(finding("index_missing", exchange, message, view=view))
    return findings


def _check_roles(exchange: Exchange, view: StreamView, chunks: list[ChoiceChunk]) -> list[Finding]:
    findings = []
    if chunks[0].role != "assistant":
        message = f"first chunk of the index has role {chunks[0].role!r}"
        findings.append(finding("role_not_first", exchange, message, [chunks[0].number], view=view))
    repeated = [chunk.number for chunk in chunks[1:] if chunk.role is not None]
    if repeated:
        message = f"role repeated on {len(repeated)} later chunks"
        findings.append(finding("role_repeated", exchange, message, repeated, view=view))
    return findings


def _check_finish(
    exchange: Exchange, view: StreamView, chunks: list[ChoiceChunk], is_complete: bool
) -> list[Finding]:
    findings = []
    empty_string = [c.number for c in chunks if c.finish_reason == ""]
    if empty_string:
        message = 'finish_reason is "" (must be null)'
        findings.append(
            finding("finish_reason_empty_string", exchange, message, empty_string, view=view)
        )
    no_key = [c.number for c in chunks if not c.has_finish_key]
    if no_key:
        message = "finish_reason key absent (must be null)"
        findings.append(finding("finish_reason_key_missing", exchange, message, no_key, view=view))
    finished = [c for c in chunks if c.finish_reason not in (None, "")]
    invalid = [c.number for c in finished if c.finish_reason not in VALID_FINISH_REASONS]
    if invalid:
        values = sorted({repr(c.finish_reason) for c in finished})
        message = f"finish_reason values {', '.join(values)}"
        findings.append(finding("finish_reason_invalid", exchange, message, invalid, view=view))
    if len(finished) > 1 or (not finished and is_complete):
        numbers = [c.number for c in finished] or [chunks[-1].number]
        message = f"{len(finished)} non-null finish reasons for one index"
        findings.append(finding("finish_reason_count", exchange, message, numbers, view=view))
    elif finished and finished[0] is not chunks[-1]:
        after = [c.number for c in chunks if c.number > finished[0].number]
        message = f"{len(after)} chunks after the finish chunk"
        numbers = [finished[0].number, *after]
        findings.append(finding("finish_reason_not_last", exchange, message, numbers, view=view))
    return findings


def _check_empty(exchange: Exchange, view: StreamView, chunks: list[ChoiceChunk]) -> list[Finding]:
    empty = [
        chunk.number
        for chunk in chunks
        if not chunk.has_content and chunk.role is None and chunk.finish_reason in (None, "")
    ]
    if not empty:
        return []
    message = f"{len(empty)} chunks without text, role, finish reason or logprobs"
    return [finding("empty_chunk", exchange, message, empty, view=view)]
