"""Responses stream events without their index fields.

llama.cpp's llama-server (commit 0c1e570) names an item's events by `item_id`
alone: no `output_index` on `output_item.*`, `content_part.*` and
`output_text.*` events, no `content_index` on the part and text events.
OpenAI's events carry both. Each field missing from a stream is one finding
(`responses_index_mismatch`, "N events carry no output_index"), not one per
event kind and check, and the walk that checks the items' order and deltas
then reads the indexes the ids imply (items numbered in the order they were
added, content part 0), so the deltas are still compared with their done
values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sluice.audit.agent_events import NamedEvent

# Events about the response as a whole: no item to index.
_RESPONSE_EVENTS = {
    "response.created",
    "response.in_progress",
    "response.queued",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
}
_PART_PREFIXES = ("response.content_part.", "response.output_text.", "response.refusal.")

# (check id, event number, message)
Problem = tuple[str, int, str]


def missing_index_fields(events: list[NamedEvent]) -> tuple[list[Problem], list[NamedEvent]]:
    """The findings for absent index fields, and the events with the indexes
    their ids imply filled in (the events unchanged when nothing is absent)."""
    needs = {
        "output_index": [e for e in events if e.type not in _RESPONSE_EVENTS],
        "content_index": [e for e in events if e.type.startswith(_PART_PREFIXES)],
    }
    problems: list[Problem] = []
    for name, wanting in needs.items():
        missing = [event for event in wanting if name not in event.payload]
        if missing:
            message = f"{len(missing)} events carry no {name}"
            problems.append(("responses_index_mismatch", missing[0].number, message))
    if not problems:
        return [], events
    return problems, _filled(events)


def _filled(events: list[NamedEvent]) -> list[NamedEvent]:
    indexes: dict[Any, int] = {}
    filled = []
    for event in events:
        payload: dict[str, Any] = dict(event.payload)
        item = payload.get("item") if isinstance(payload.get("item"), dict) else {}
        item_id = payload.get("item_id", item.get("id"))
        if event.type == "response.output_item.added" and item_id not in indexes:
            indexes[item_id] = len(indexes)
        if event.type not in _RESPONSE_EVENTS and item_id in indexes:
            payload.setdefault("output_index", indexes[item_id])
        if event.type.startswith(_PART_PREFIXES):
            payload.setdefault("content_index", 0)
        filled.append(dataclasses.replace(event, payload=payload))
    return filled
