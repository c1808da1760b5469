"""The agent APIs of tests/broken_servers.py's ScriptServer: OpenAI Responses
and Anthropic Messages answers built from the same script of tokens, as
events (a stream) and as the final object (a non-streamed answer).

An answer is either text (at most `TEXT_TOKENS` script tokens, then a stop;
fewer when the request's limit is lower: then cut) or, when `tool_choice`
forces one, a single call whose arguments (`{}` for a tool without
parameters) stream in pieces of `ARGUMENT_PIECE_CHARS`, one token each.
Without a defect the streams follow both APIs' contracts; each agent-API
`Defect` breaks one rule the way real servers have broken it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tests.broken_servers import MODEL, Defect, chat_logprobs, plan_choice

TEXT_TOKENS = 10
ARGUMENT_PIECE_CHARS = 5


@dataclass(slots=True)
class Answer:
    """One answer: its text pieces or its call, and how it ended."""

    pieces: list[str] = field(default_factory=list)
    # Per text piece, its logprob entries (chat's shape).
    entries: list[list[dict[str, Any]]] = field(default_factory=list)
    call_name: str | None = None
    is_cut: bool = False
    input_tokens: int = 0
    output_tokens: int = 0


def forced_tool(body: dict[str, Any]) -> str | None:
    choice, tools = body.get("tool_choice"), body.get("tools") or []
    if isinstance(choice, dict) and isinstance(choice.get("name"), str):
        return choice["name"]
    if choice in ("required", {"type": "any"}) and tools:
        return tools[0].get("name")
    return None


def answer_for(prompt: str, limit: int, body: dict[str, Any]) -> Answer:
    answer = Answer(input_tokens=len(prompt.split()) + 1)
    name = forced_tool(body)
    if name is not None:
        tool = next(t for t in body["tools"] if t.get("name") == name)
        schema = tool.get("parameters") or tool.get("input_schema") or {}
        arguments = json.dumps({key: "x" for key in schema.get("properties") or {}})
        pieces = [arguments[i : i + ARGUMENT_PIECE_CHARS]
                  for i in range(0, len(arguments), ARGUMENT_PIECE_CHARS)]  # fmt: skip
        answer.call_name, answer.pieces = name, pieces[:limit]
        answer.is_cut = len(pieces) > limit
        answer.output_tokens = len(answer.pieces)
        return answer
    count = min(limit, TEXT_TOKENS)
    held: list[dict[str, Any]] = []  # entries of tokens whose text is held back
    for step in plan_choice(prompt, count, [], False, Defect.NONE):
        held += chat_logprobs(step.tokens, 2, False)["content"]
        if step.text:
            answer.pieces.append(step.text)
            answer.entries.append(held)
            held = []
    if held and answer.entries:
        answer.entries[-1] += held
    answer.is_cut, answer.output_tokens = count == limit, count
    return answer


# --- Responses ------------------------------------------------------------------------------


def responses_events(
    answer: Answer, body: dict[str, Any], defect: Defect, stream: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The events of a stream and the final response."""
    wants = "message.output_text.logprobs" in (body.get("include") or [])
    if answer.call_name:
        arguments = "".join(answer.pieces)
        item = {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1",
                "name": answer.call_name, "arguments": arguments}  # fmt: skip
        opened = {**item, "status": "in_progress", "arguments": ""}
        inner = [{"type": "response.function_call_arguments.delta", "item_id": "fc_1",
                  "output_index": 0, "delta": piece} for piece in answer.pieces]  # fmt: skip
        inner.append({"type": "response.function_call_arguments.done", "item_id": "fc_1",
                      "output_index": 0, "name": answer.call_name, "arguments": arguments})  # fmt: skip
    else:
        item, opened, inner = _message_item(answer, wants, defect)
    status = "incomplete" if answer.is_cut else "completed"
    final = _response(status, [item], answer)
    terminal = final
    if defect is Defect.RESPONSES_COMPLETED_WHEN_TRUNCATED and stream:
        terminal = _response("completed", [item], answer)
    start = _response("in_progress", [], answer) | {"usage": None}
    events = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
        {"type": "response.output_item.added", "output_index": 0, "item": opened},
        *inner,
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": f"response.{terminal['status']}", "response": terminal},
    ]
    numbered = [{"type": e["type"], "sequence_number": n} | e for n, e in enumerate(events)]
    return numbered, final


def _message_item(
    answer: Answer, wants_logprobs: bool, defect: Defect
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    text = "".join(answer.pieces)
    entries = [e for piece in answer.entries for e in piece] if wants_logprobs else []
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": entries}
    item = {"id": "msg_1", "type": "message", "status": "incomplete" if answer.is_cut else
            "completed", "role": "assistant", "content": [part]}  # fmt: skip
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    empty = {**part, "text": "", "logprobs": []}
    inner = [{"type": "response.content_part.added", **where, "part": empty}]
    for number, (piece, piece_entries) in enumerate(
        zip(answer.pieces, answer.entries, strict=True)
    ):
        if defect is Defect.RESPONSES_DELTA_LOST and number == 1:
            continue
        inner.append({"type": "response.output_text.delta", **where, "delta": piece,
                      "logprobs": piece_entries if wants_logprobs else []})  # fmt: skip
    inner.append({"type": "response.output_text.done", **where, "text": text, "logprobs": entries})
    inner.append({"type": "response.content_part.done", **where, "part": part})
    opened = {**item, "status": "in_progress", "content": []}
    return item, opened, inner


def _response(status: str, output: list[dict[str, Any]], answer: Answer) -> dict[str, Any]:
    usage = {"input_tokens": answer.input_tokens, "output_tokens": answer.output_tokens,
             "total_tokens": answer.input_tokens + answer.output_tokens}  # fmt: skip
    reason = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {"id": "resp_1", "object": "response", "created_at": 1, "model": MODEL,
            "status": status, "incomplete_details": reason, "output": output, "usage": usage}  # fmt: skip


# --- Messages -------------------------------------------------------------------------------


def messages_events(answer: Answer, defect: Defect) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The events of a stream and the final message."""
    if answer.call_name:
        arguments = "".join(answer.pieces)
        block = {"type": "tool_use", "id": "toolu_1", "name": answer.call_name, "input": {}}
        final_block = {**block, "input": json.loads(arguments) if not answer.is_cut else {}}
        kind = "text_delta" if defect is Defect.MESSAGES_TEXT_DELTA_ON_TOOL_USE else (
            "input_json_delta")  # fmt: skip
        key = "text" if kind == "text_delta" else "partial_json"
        deltas = [{"type": kind, key: piece} for piece in answer.pieces]
    else:
        block = {"type": "text", "text": ""}
        final_block = {"type": "text", "text": "".join(answer.pieces)}
        deltas = [{"type": "text_delta", "text": piece} for piece in answer.pieces]
    reason = "max_tokens" if answer.is_cut else "tool_use" if answer.call_name else "end_turn"
    usage = {"input_tokens": answer.input_tokens, "output_tokens": answer.output_tokens}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL,
               "content": [final_block], "stop_reason": reason, "stop_sequence": None,
               "usage": usage}  # fmt: skip
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events = [
        {"type": "message_start", "message": start},
        {"type": "ping"},
        {"type": "content_block_start", "index": 0, "content_block": block},
        *({"type": "content_block_delta", "index": 0, "delta": delta} for delta in deltas),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None},
         "usage": {"output_tokens": answer.output_tokens}},
        {"type": "message_stop"},
    ]  # fmt: skip
    return events, message


def encode(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, ensure_ascii=False).encode()
    return b"event: " + event["type"].encode() + b"\ndata: " + data + b"\n\n"


# --- Recorded answers, for unit tests of single checks ---------------------------------------


def responses_answer(body: dict[str, Any], defect: Defect = Defect.NONE):
    """(events of the stream, the non-streamed response) for a Responses body."""
    answer = answer_for(str(body["input"]), body.get("max_output_tokens") or 16, body)
    return responses_events(answer, body, defect, body.get("stream") is True)


def messages_answer(body: dict[str, Any], defect: Defect = Defect.NONE):
    """(events of the stream, the non-streamed message) for a Messages body."""
    prompt = " ".join(str(m["content"]) for m in body["messages"])
    return messages_events(answer_for(prompt, body["max_tokens"], body), defect)


def renumbered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses events with their sequence numbers counted again (after an edit)."""
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


def encode_all(events: list[dict[str, Any]]) -> bytes:
    return b"".join(encode(event) for event in events)
