"""Per-token logprob checks of a Responses stream that asked for them
(`include` message.output_text.logprobs): the entries each
`response.output_text.delta` carries are read in chat's shape, and the
checks every API with logprobs shares run on them (token_entries.py: a
token's own logprob among its alternatives, the greedy head, the entries'
bytes making the deltas' text). Held-back tokens' entries may ride on the
next delta, so alignment is cumulative over the stream, as for chat.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sluice.audit.agent_events import read_events
from sluice.audit.checks.responses_final import wants_logprobs
from sluice.audit.checks.token_entries import check_token_entries
from sluice.audit.logprob_entries import chat_entries
from sluice.audit.records import RESPONSES, Exchange, Finding
from sluice.audit.stream_view import ChoiceChunk, StreamView

TEXT_DELTA = "response.output_text.delta"


def check_responses_tokens(exchange: Exchange, view: StreamView) -> list[Finding]:
    body = exchange.body or {}
    if exchange.endpoint != RESPONSES or not exchange.is_stream or not wants_logprobs(body):
        return []
    chunks = delta_chunks(exchange)
    if not chunks:
        return []
    top = body.get("top_logprobs")
    request = replace(view.request, top_logprobs=top if isinstance(top, int) else 0)
    is_complete = exchange.transport_error is None
    return check_token_entries(exchange, view, chunks, request, is_complete)


def delta_chunks(exchange: Exchange) -> list[ChoiceChunk]:
    """Each text delta event as a chunk of one choice: its text and entries."""
    chunks = []
    for event in read_events(exchange).events:
        payload: dict[str, Any] = event.payload or {}
        if event.type != TEXT_DELTA or not isinstance(payload.get("delta"), str):
            continue
        entries = chat_entries({"content": payload.get("logprobs") or []})
        chunks.append(
            ChoiceChunk(event.number, payload["delta"], None, False, None, entries, None, 0.0)
        )
    return chunks
