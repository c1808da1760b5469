"""Structured outputs: `response_format` json_schema, streamed and not.

Each prompt goes out three times, one after another: non-streamed (a
warm-up), streamed to a slow reader, then non-streamed again (the stream's
twin). The warm-up puts the prompt in a prefix cache, if the server has one,
so stream and twin are computed alike, alone in their batches, and a greedy
server owes the same text both times.

Checks (invariants): a response that finished with "stop" is valid JSON
(`structured_invalid_json`) matching the schema (`structured_schema_mismatch`,
by the audit's own validator of the keywords used); the streamed text equals
the twin's byte for byte (`structured_stream_mismatch`). An output cut by
max_tokens is a note (`structured_cut_by_length`): the schema bounds every
string and array, but a model may still pad with whitespace.
"""

from __future__ import annotations

import json
from typing import Any

from sluice.audit.checks.evidence import finding
from sluice.audit.checks.exchange import ensure_view
from sluice.audit.json_schema_subset import schema_errors
from sluice.audit.records import CHAT, Exchange, Finding, Reader, ScenarioResult
from sluice.audit.scenarios.base import ScenarioContext
from sluice.audit.text_utils import first_difference

NAME = "structured"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "is_student": {"type": "boolean"},
        "languages": {
            "type": "array",
            "items": {"type": "string", "maxLength": 20},
            "minItems": 1,
            "maxItems": 3,
        },
        "mood": {"enum": ["happy", "calm", "busy"]},
    },
    "required": ["name", "age", "is_student", "languages", "mood"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "person", "strict": True, "schema": SCHEMA},
}
PROMPTS = (
    "Describe a fictional person as JSON.",
    "Invent a student who speaks two languages and describe them in JSON.",
    "Give me a JSON record of a busy engineer.",
)


async def run_structured(ctx: ScenarioContext) -> ScenarioResult:
    size = ctx.sizes.structured
    result = ctx.begin(NAME)
    reader = Reader("slow", size.slow_read_bytes, size.slow_read_interval_s)
    num_checked = num_valid = num_equal = 0
    for position in range(size.requests):
        prompt = PROMPTS[position % len(PROMPTS)]
        body = ctx.body(CHAT, prompt, size.max_tokens, stream=True, response_format=RESPONSE_FORMAT)
        warm_up = await ctx.send(NAME, CHAT, {**body, "stream": False}, "structured/warm-up")
        stream = await ctx.send(
            NAME, CHAT, body, "structured/slow reader", reader=reader, with_twin=True
        )
        result.exchanges += [warm_up, stream]
        for exchange in (warm_up, stream, stream.twin):
            found = output_findings(exchange)
            num_checked += exchange is not None and exchange.is_ok
            num_valid += exchange is not None and exchange.is_ok and not found
            result.findings += found
        mismatch = stream_mismatch(stream)
        num_equal += mismatch is None and stream.is_ok
        result.findings += [mismatch] if mismatch else []
    result.figures.update(
        {
            "outputs_checked": float(num_checked),
            "outputs_valid": float(num_valid),
            "streams_equal": float(num_equal),
        }
    )
    return ctx.finish(result)


def output_findings(exchange: Exchange | None) -> list[Finding]:
    """Whether choice 0 of a finished answer is JSON matching SCHEMA."""
    if exchange is None or not exchange.is_ok:
        return []  # the response checks report failed requests
    view = ensure_view(exchange)
    text, finish_reason = view.text(0), _finish_reason(exchange)
    numbers = [chunk.number for chunk in view.choices.get(0, [])][-1:]
    if finish_reason == "length":
        message = f"max_tokens cut the JSON after {len(text)} characters: {text[-60:]!r}"
        return [finding("structured_cut_by_length", exchange, message, numbers, view=view)]
    try:
        value = json.loads(text)
    except ValueError as error:
        message = f"not JSON ({error}): {text[:120]!r}"
        return [finding("structured_invalid_json", exchange, message, numbers, view=view)]
    errors = schema_errors(value, SCHEMA)
    if errors:
        message = f"{len(errors)} schema violation(s): " + "; ".join(errors[:4])
        return [finding("structured_schema_mismatch", exchange, message, numbers, view=view)]
    return []


def stream_mismatch(stream: Exchange) -> Finding | None:
    """A finding when the streamed text differs from its twin's."""
    twin = stream.twin
    if not stream.is_ok or twin is None or not twin.is_ok:
        return None
    view = ensure_view(stream)
    streamed, whole = view.text(0), ensure_view(twin).text(0)
    if streamed == whole:
        return None
    offset = first_difference(streamed, whole)
    message = (
        f"streamed text differs from the non-streamed text at character {offset}: "
        f"{streamed[offset : offset + 30]!r} vs {whole[offset : offset + 30]!r}"
    )
    numbers = [chunk.number for chunk in view.choices.get(0, []) if chunk.text][:1]
    return finding("structured_stream_mismatch", stream, message, numbers, view=view)


def _finish_reason(exchange: Exchange) -> Any:
    chunks = ensure_view(exchange).choices.get(0, [])
    return next((c.finish_reason for c in reversed(chunks) if c.finish_reason), None)
