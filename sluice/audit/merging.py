"""How far a stream's deltas merged: the characters of its largest delta,
and whether a stream read with a pause merged beyond the same request read
without one (the backpressure scenario's coverage).

Characters, not tokens, so the reference needs no logprobs (it costs the
server less) and every API is measured alike. A server may send several
tokens per delta without any backpressure (speculative decoding, a fast
engine step), so a long delta proves nothing by itself: a paused stream
merged when its largest delta is longer than every delta of the same greedy
request streamed to a reader that kept up.
"""

from __future__ import annotations

from typing import Any

from sluice.audit.agent_events import is_delta, read_events
from sluice.audit.records import AGENT_ENDPOINTS, Exchange
from sluice.audit.stream_view import view_of


def largest_delta(exchange: Exchange) -> int:
    """The characters of the stream's largest delta (0 when it carried none)."""
    if not exchange.is_ok or not exchange.is_stream:
        return 0
    if exchange.endpoint in AGENT_ENDPOINTS:
        events = read_events(exchange).events
        return max((_agent_delta_chars(e.payload or {}) for e in events if is_delta(e)), default=0)
    view = view_of(exchange)
    return max((len(c.text) for chunks in view.choices.values() for c in chunks), default=0)


def _agent_delta_chars(payload: dict[str, Any]) -> int:
    delta = payload.get("delta")
    if isinstance(delta, str):  # Responses: text, arguments, reasoning
        return len(delta)
    if isinstance(delta, dict):  # Messages: text_delta, input_json_delta, thinking_delta
        text = delta.get("text") or delta.get("partial_json") or delta.get("thinking") or ""
        return len(text) if isinstance(text, str) else 0
    return 0


def has_merged(paused: Exchange, control: Exchange) -> bool:
    """Whether the paused stream merged deltas the reader that kept up got apart."""
    return control.is_ok and largest_delta(paused) > largest_delta(control)
