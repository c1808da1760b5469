"""/v1/responses, streamed and not, from the same choice deltas (one choice).

`ResponsesEvents` is the Responses API's `ResponseChunks`: each choice delta
goes through the choice's `ParsedChoice` (reasoning and tool calls, when the
request reads them) into `OutputItems` (items.py), whose events a
stream sends and whose items a non-streamed body returns. Invariants:
- Every event is `event: <type>` + `data: <json>` with `type` and a
  `sequence_number` counting from 0, one more per event, across the stream.
- The stream opens with `response.created` and `response.in_progress` (sent
  with the first tokens, like chat's role chunk) and ends with exactly one
  terminal event: `response.completed`, `response.incomplete` (max_output_tokens:
  `incomplete_details.reason` "max_output_tokens", the open item
  "incomplete") or, after an error, an `error` event and `response.failed`.
- The terminal event's `response` is the object a non-streamed request gets
  (same builder, same items, same usage), and what the store keeps.
- Usage counts the tokens delivered: `input_tokens` (with
  `input_tokens_details.cached_tokens`), `output_tokens` (with
  `output_tokens_details.reasoning_tokens`: tokens of deltas that ended
  inside reasoning).
- Logprob entries (include `message.output_text.logprobs`) ride on the
  `output_text.delta` that carries their text; entries of tokens whose text
  is still held back wait for the next one, and tokens of reasoning or of a
  trailing tool call carry none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from sluice.apis.responses.items import ItemEvent, OutputItems
from sluice.errors import SluiceError, openai_error_of
from sluice.frontend.chat_message import ParsedChoice
from sluice.frontend.deltas import ChoiceDelta
from sluice.frontend.logprob_format import TokenStrings, chat_logprobs
from sluice.frontend.request import GenerationRequest
from sluice.frontend.text_pieces import token_pieces
from sluice.frontend.usage import UsageCounter
from sluice.tools.message_stream import MessageDelta

_TEXT_DELTA = "response.output_text.delta"
# Delta events that merge: a run of them to one item becomes one event.
_MERGED_DELTAS = frozenset(
    {_TEXT_DELTA, "response.reasoning_text.delta", "response.function_call_arguments.delta"}
)

# The final response object of a request, for the store (called once, at the end).
OnResponse = Callable[[dict[str, Any]], None]


class ResponsesEvents:
    def __init__(
        self,
        request: GenerationRequest,
        strings: TokenStrings,
        on_response: OnResponse | None = None,
    ):
        assert request.num_choices == 1, "a Responses request has one choice"
        assert request.responses is not None, "kind responses carries its settings"
        self._request = request
        self._strings = strings
        self._on_response = on_response
        self._echoed: dict[str, Any] = orjson.loads(request.responses.echoed_json)
        self.usage = UsageCounter(request)
        self._num_reasoning_tokens = 0
        # Logprob entries of tokens whose text is still held back (parsing).
        self._pending_entries: list[dict[str, Any]] = []
        self._parsed: ParsedChoice | None = None
        if request.output_parsing is not None:
            self._parsed = ParsedChoice(request.output_parsing)
        self._items = OutputItems(request.responses.custom_tool_names)
        self._num_events = 0
        self._finish_reason: str | None = None
        self._error: dict[str, Any] | None = None

    # -- streamed -------------------------------------------------------------

    def opening_events(self) -> list[bytes]:
        created = self._response("in_progress")
        return [
            self._encode(ItemEvent("response.created", {"response": created})),
            self._encode(ItemEvent("response.in_progress", {"response": created})),
        ]

    def delta_event(self, index: int, delta: ChoiceDelta) -> bytes | None:
        events = self._take(delta)
        if not events:
            return None
        return b"".join(self._encode(event) for event in events)

    def closing_events(self) -> list[bytes]:
        name = "response.incomplete" if self._finish_reason == "length" else "response.completed"
        return [self._encode(ItemEvent(name, {"response": self._final_response()}))]

    def error_events(self, error: Exception) -> list[bytes]:
        message = openai_error_of(error)["error"]
        code = message.get("code") or ("server_error" if not isinstance(error, SluiceError)
                                       else message["type"])  # fmt: skip
        self._error = {"code": code, "message": message["message"]}
        events = self._items.close("incomplete")
        events.append(ItemEvent("error", {"code": code, "message": message["message"],
                                          "param": message.get("param")}))  # fmt: skip
        events.append(ItemEvent("response.failed", {"response": self._final_response()}))
        return [self._encode(event) for event in events]

    # -- non-streamed ----------------------------------------------------------

    def fold(self, index: int, delta: ChoiceDelta) -> None:
        self._take(delta)

    def body(self) -> bytes:
        return orjson.dumps(self._final_response())

    # -- shared -----------------------------------------------------------------

    def _take(self, delta: ChoiceDelta) -> list[ItemEvent]:
        """The item events of `delta`."""
        entries = None
        if self._request.params.logprobs is not None and delta.token_ids:
            entries = chat_logprobs(delta, self._strings)
        if self._parsed is None:
            events = self._items.push(MessageDelta.of_content(delta.text), entries)
        else:
            events = self._parsed_events(delta, entries)
        if delta.is_finished:
            self._finish_reason = delta.finish_reason
            events += self._items.close("incomplete" if delta.finish_reason == "length"
                                        else "completed")  # fmt: skip
        return events

    def _parsed_events(
        self, delta: ChoiceDelta, entries: list[dict[str, Any]] | None
    ) -> list[ItemEvent]:
        """Token by token through the parsers (text_pieces.py), so the items
        and their logprobs do not depend on how a lagging reader's deltas were
        merged; then one delta event per item the delta touched."""
        assert self._parsed is not None, "with output parsing"
        events: list[ItemEvent] = []
        num_reasoning_tokens, offset = 0, 0
        for piece in token_pieces(delta):
            message = self._parsed.push(piece.text, piece.is_final)
            piece_entries = None
            if entries is not None:
                piece_entries = self._entries_of(
                    message, entries[offset : offset + piece.num_tokens]
                )
            offset += piece.num_tokens
            events += self._items.push(message, piece_entries)
            if self._items.is_in_reasoning:
                num_reasoning_tokens += piece.num_tokens
        self._num_reasoning_tokens += num_reasoning_tokens
        return _merged(events)

    def _entries_of(
        self, message: MessageDelta, entries: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The logprob entries that go with `message`'s content: a token's own
        and those of held-back tokens before it. Tokens read as reasoning or
        as a call carry none, and neither do held tokens that became those."""
        if message.content:
            sent, self._pending_entries = self._pending_entries + entries, []
            return sent
        if message.reasoning or message.tool_calls:
            self._pending_entries = []
        else:
            self._pending_entries += entries
        return []

    def _final_response(self) -> dict[str, Any]:
        if self._error is not None:
            status = "failed"
        elif self._finish_reason == "length":
            status = "incomplete"
        else:
            status = "completed"
        response = self._response(status)
        if self._on_response is not None:
            self._on_response(response)
            self._on_response = None
        return response

    def _response(self, status: str) -> dict[str, Any]:
        request = self._request
        is_final = status != "in_progress"
        response: dict[str, Any] = {
            "id": request.response_id,
            "object": "response",
            "created_at": request.created,
            "status": status,
            "background": False,
            "error": self._error,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "model": request.model_name,
            "output": self._items.output() if is_final else [],
            "usage": self._usage_json() if is_final else None,
        }
        return response | self._echoed

    def _usage_json(self) -> dict[str, Any]:
        usage = self.usage.total()
        return {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": usage["prompt_tokens_details"],
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": self._num_reasoning_tokens},
            "total_tokens": usage["total_tokens"],
        }

    def _encode(self, event: ItemEvent) -> bytes:
        payload = {"type": event.type, "sequence_number": self._num_events} | event.fields
        self._num_events += 1
        return b"event: " + event.type.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _merged(events: list[ItemEvent]) -> list[ItemEvent]:
    """`events` with each run of delta events to one item as one event (their
    texts and logprobs joined)."""
    merged: list[ItemEvent] = []
    for event in events:
        last = merged[-1] if merged else None
        if (
            last is not None
            and event.type == last.type
            and event.type in _MERGED_DELTAS
            and event.fields["item_id"] == last.fields["item_id"]
        ):
            fields = last.fields | {"delta": last.fields["delta"] + event.fields["delta"]}
            if "logprobs" in fields:
                fields["logprobs"] = last.fields["logprobs"] + event.fields["logprobs"]
            merged[-1] = ItemEvent(last.type, fields)
        else:
            merged.append(event)
    return merged
