"""Which responses each check could read: a check with nothing to check must
show as such in the report, not as a silent pass (a server whose logprobs
come in another shape, or whose usage is never continuous, leaves whole
checks idle).

`COVERAGE` maps a check id to a predicate on a response and its view; the
report prints, per check, how many responses satisfied it. Checks that apply
to every response of a kind share a predicate. A new check (or a new API's
scenario group) registers its own predicate here.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.audit.checks.responses_final import wants_logprobs
from sluice.audit.checks.responses_tokens import delta_chunks
from sluice.audit.records import AGENT_ENDPOINTS, MESSAGES, OLLAMA_CHAT, RESPONSES, Exchange
from sluice.audit.stream_view import StreamView, view_of

Applies = Callable[[Exchange, StreamView], bool]


def _is_stream(exchange: Exchange, view: StreamView) -> bool:
    """A stream of chat or completions (the agent APIs have predicates of their own)."""
    return view.sse is not None and exchange.endpoint not in AGENT_ENDPOINTS


def _has_usage_asked(exchange: Exchange, view: StreamView) -> bool:
    return view.sse is not None and view.request.include_usage


def _has_continuous_usage(exchange: Exchange, view: StreamView) -> bool:
    return view.request.continuous_usage and any(
        chunk.usage is not None and chunk.finish_reason is None
        for chunks in view.choices.values()
        for chunk in chunks
    )


def _has_entries(exchange: Exchange, view: StreamView) -> bool:
    return view.request.top_logprobs is not None and any(
        chunk.logprobs for chunks in view.choices.values() for chunk in chunks
    )


def _has_exact_entries(exchange: Exchange, view: StreamView) -> bool:
    entries = [e for chunks in view.choices.values() for c in chunks for e in c.logprobs or []]
    return view.request.top_logprobs is not None and any(e.has_exact_bytes for e in entries)


def _has_greedy_alternatives(exchange: Exchange, view: StreamView) -> bool:
    return (
        view.request.is_greedy and bool(view.request.top_logprobs) and _has_entries(exchange, view)
    )


def _has_responses_entries(exchange: Exchange, view: StreamView) -> bool:
    """A Responses stream whose text deltas carry logprob entries (responses_tokens.py)."""
    body = exchange.body or {}
    return (
        exchange.endpoint == RESPONSES
        and exchange.is_ok
        and view.sse is not None
        and wants_logprobs(body)
        and any(chunk.logprobs for chunk in delta_chunks(exchange))
    )


def _either(*predicates: Applies) -> Applies:
    return lambda exchange, view: any(applies(exchange, view) for applies in predicates)


def _has_twin(exchange: Exchange, view: StreamView) -> bool:
    twin = exchange.twin
    return view.sse is not None and twin is not None and twin.is_ok and bool(view.choices)


def _has_offsets_to_compare(exchange: Exchange, view: StreamView) -> bool:
    if view.request.is_chat or not _has_twin(exchange, view) or not _has_entries(exchange, view):
        return False
    assert exchange.twin is not None, "checked by _has_twin"
    return any(
        entry.text_offset is not None
        for chunks in view_of(exchange.twin).choices.values()
        for chunk in chunks
        for entry in chunk.logprobs or []
    )


def _has_stops(exchange: Exchange, view: StreamView) -> bool:
    request = view.request
    return bool(view.choices and request.stops) and not (
        request.include_stop_str or request.min_tokens
    )


def _has_stop_to_include(exchange: Exchange, view: StreamView) -> bool:
    return view.request.include_stop_str and bool(exchange.unstopped_texts) and bool(view.choices)


def _is_error_answer(exchange: Exchange, view: StreamView) -> bool:
    return exchange.status is not None and 400 <= exchange.status < 500


def _is_openai_error(exchange: Exchange, view: StreamView) -> bool:
    return _is_error_answer(exchange, view) and exchange.endpoint not in (MESSAGES, OLLAMA_CHAT)


def _is_messages_error(exchange: Exchange, view: StreamView) -> bool:
    return _is_error_answer(exchange, view) and exchange.endpoint == MESSAGES


def _is_agent_stream(exchange: Exchange, view: StreamView) -> bool:
    return exchange.endpoint in AGENT_ENDPOINTS and view.sse is not None


def _answers(
    endpoint: str,
    *,
    stream_only: bool = False,
    twin: bool = False,
    tools: bool = False,
    logprobs: bool = False,
) -> Applies:
    """Answers of one agent API, of a kind."""

    def applies(exchange: Exchange, view: StreamView) -> bool:
        body = exchange.body or {}
        return (
            exchange.endpoint == endpoint
            and exchange.is_ok
            and (view.sse is not None or not stream_only)
            and (not twin or (exchange.twin is not None and exchange.twin.is_ok))
            and (not tools or bool(body.get("tools")))
            and (not logprobs or wants_logprobs(body))
        )

    return applies


COVERAGE: dict[str, Applies] = {
    "framing": _is_stream,
    "id_changed": _is_stream,
    "finish_reason_count": _is_stream,
    "usage_placement": _has_usage_asked,
    "usage_continuous_inexact": _has_continuous_usage,
    "logprob_count": _has_entries,
    "logprob_alignment": _either(_has_exact_entries, _has_responses_entries),
    "logprob_greedy_head": _either(_has_greedy_alternatives, _has_responses_entries),
    "logprob_text_offset": _has_offsets_to_compare,
    "replacement_char": _is_stream,
    "stop_leak": _has_stops,
    "stop_str_not_included": _has_stop_to_include,
    "duplicate_delta": _has_twin,
    "bad_error_shape": _is_openai_error,
    "agent_framing": _is_agent_stream,
    "responses_sequence": _answers(RESPONSES, stream_only=True),
    "responses_item_order": _answers(RESPONSES, stream_only=True),
    "responses_delta_mismatch": _answers(RESPONSES, stream_only=True),
    "responses_truncation": _answers(RESPONSES),
    "responses_usage": _answers(RESPONSES),
    "responses_invalid_arguments": _answers(RESPONSES, tools=True),
    "responses_logprobs": _answers(RESPONSES, logprobs=True),
    "responses_stream_mismatch": _answers(RESPONSES, stream_only=True, twin=True),
    "messages_block_order": _answers(MESSAGES, stream_only=True),
    "messages_delta_type": _answers(MESSAGES, stream_only=True),
    "messages_stop_reason": _answers(MESSAGES),
    "messages_invalid_input": _answers(MESSAGES, tools=True),
    "messages_stream_mismatch": _answers(MESSAGES, stream_only=True, twin=True),
    "messages_error_shape": _is_messages_error,
    "ollama_framing": lambda exchange, view: _is_ollama(exchange),
    "ollama_done": lambda exchange, view: _is_ollama(exchange, stream_only=True),
    "ollama_empty_line": lambda exchange, view: _is_ollama(exchange, stream_only=True),
    "ollama_eval_count": lambda exchange, view: _is_ollama(exchange),
    "ollama_stream_mismatch": lambda exchange, view: (
        _is_ollama(exchange, stream_only=True) and exchange.twin is not None and exchange.twin.is_ok
    ),
    "ollama_error_shape": lambda exchange, view: (
        exchange.endpoint == OLLAMA_CHAT and _is_error_answer(exchange, view)
    ),
}


def _is_ollama(exchange: Exchange, *, stream_only: bool = False) -> bool:
    """An Ollama chat answer (a stream, with `stream_only`)."""
    return (
        exchange.endpoint == OLLAMA_CHAT
        and exchange.is_ok
        and (exchange.is_stream or not stream_only)
    )


def covered_checks(exchange: Exchange) -> list[str]:
    """The checks in `COVERAGE` that could read this response."""
    view = view_of(exchange)
    return [check_id for check_id, applies in COVERAGE.items() if applies(exchange, view)]
