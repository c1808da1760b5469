"""Anthropic Messages responses, streamed and not, from the same choice deltas.

A message is a list of content blocks (`thinking`, `text`, `tool_use`); a
stream opens each block (`content_block_start`), extends it
(`content_block_delta`: `thinking_delta`, `text_delta`, `input_json_delta`)
and closes it (`content_block_stop`) before the next one opens, between
`message_start` (with the input usage) and `message_delta` (stop reason,
output usage), `message_stop`. Each event is `event: <type>\\ndata: <json>\\n\\n`.

Both forms go through `_Blocks.add` (one `MessageDelta` -> block events, the
blocks updated); a stream writes the events, the body keeps the blocks, so
they never disagree. Invariants:
- Which block a piece of text goes to depends on the tokens alone, never on
  how the deltas were cut (a lagging reader's are merged): with a tool-call
  parser, the text is pushed into the `MessageStream` token by token, so text
  after a call lands in a block after it even when both come in one delta;
  a token that ends a call and begins text (`"}}.`) is applied in the
  text's order (`MessageDelta.parts`).
- No empty delta, no text delta on a `tool_use` block; the deltas of a block
  concatenate to the block of the body (a `tool_use` block's `input_json_delta`
  pieces are the model's argument text, which the body carries parsed).
- `message_start` and one `ping` go out with the first delta's events (the
  cached tokens are known then); a later delta whose text is all held back
  makes no event (None). Tool ids are `toolu_…`, the same in stream and message.
"""

from __future__ import annotations

import json
from typing import Any

import jiter
import orjson

from sluice.errors import anthropic_error_of
from sluice.frontend.deltas import ChoiceDelta
from sluice.frontend.logprob_format import TokenStrings
from sluice.frontend.request import GenerationRequest
from sluice.frontend.text_pieces import token_pieces, whole_piece
from sluice.frontend.usage import UsageCounter
from sluice.tools.message_stream import MessageDelta, ToolCallDelta

TOOL_ID_PREFIX = "toolu_"


def encode_event(payload: dict[str, Any]) -> bytes:
    """One event as Anthropic frames it: its type on an `event:` line, then the data."""
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class MessagesEvents:
    """The events of one /v1/messages request, or its body (one choice)."""

    def __init__(self, request: GenerationRequest, strings: TokenStrings):
        assert request.num_choices == 1, "a message is one choice"
        self._request = request
        self.usage = UsageCounter(request)
        parsing = request.output_parsing
        self._stream = None if parsing is None else parsing.message_stream()
        # Calls cut into the stream token by token (see the module docstring).
        self._is_cut_per_token = parsing is not None and parsing.reads_tool_calls
        self._blocks = _Blocks()
        self._num_cached_tokens = 0
        self._has_started = False
        self._finish_reason: str | None = None
        self._stop_string: str | None = None

    # -- streamed -------------------------------------------------------------

    def opening_events(self) -> list[bytes]:
        # message_start goes with the first delta, which knows the cached tokens.
        return []

    def delta_event(self, index: int, delta: ChoiceDelta) -> bytes | None:
        events = [] if self._has_started else self._start_events(delta)
        events += self._add(delta)
        if not events:
            return None
        return b"".join(encode_event(event) for event in events)

    def closing_events(self) -> list[bytes]:
        events = [] if self._has_started else self._start_events(ChoiceDelta())
        events += [self._message_delta(), {"type": "message_stop"}]
        return [encode_event(event) for event in events]

    def error_events(self, error: Exception) -> list[bytes]:
        return [encode_event(anthropic_error_of(error))]

    def _start_events(self, delta: ChoiceDelta) -> list[dict[str, Any]]:
        self._has_started = True
        self._num_cached_tokens = delta.num_cached_tokens
        message = self._message([])
        message["usage"] = self._usage(0)
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def _message_delta(self) -> dict[str, Any]:
        return {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop_reason(), "stop_sequence": self._stop_string},
            "usage": self._usage(self.usage.num_completion_tokens(0)),
        }

    # -- non-streamed ----------------------------------------------------------

    def fold(self, index: int, delta: ChoiceDelta) -> None:
        if not self._has_started:
            self._has_started = True
            self._num_cached_tokens = delta.num_cached_tokens
        self._add(delta)

    def body(self) -> bytes:
        message = self._message(self._blocks.final_blocks())
        message["stop_reason"] = self._stop_reason()
        message["stop_sequence"] = self._stop_string
        message["usage"] = self._usage(self.usage.num_completion_tokens(0))
        return orjson.dumps(message)

    # -- shared -----------------------------------------------------------------

    def _add(self, delta: ChoiceDelta) -> list[dict[str, Any]]:
        """The block events of `delta`; records the finish."""
        events: list[dict[str, Any]] = []
        if self._stream is None:
            events += self._blocks.add(MessageDelta.of_content(delta.text))
        else:
            pieces = token_pieces(delta) if self._is_cut_per_token else [whole_piece(delta)]
            for piece in pieces:
                events += self._blocks.add(self._stream.push(piece.text, piece.is_final))
        events = _merged(events)
        if delta.is_finished:
            events += self._blocks.close()
            self._finish_reason = delta.finish_reason
            if delta.finish_reason == "stop" and isinstance(delta.stop_reason, str):
                self._stop_string = delta.stop_reason
        return events

    def _stop_reason(self) -> str | None:
        if self._finish_reason is None:
            return None
        if self._finish_reason == "length":
            return "max_tokens"
        if self._blocks.has_tool_use:
            return "tool_use"
        return "stop_sequence" if self._stop_string is not None else "end_turn"

    def _message(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self._request.response_id,
            "type": "message",
            "role": "assistant",
            "model": self._request.model_name,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
        }

    def _usage(self, num_output_tokens: int) -> dict[str, int]:
        # Anthropic's input_tokens leave out the tokens read from the cache.
        num_prompt_tokens = len(self._request.prompts[0].token_ids)
        return {
            "input_tokens": num_prompt_tokens - self._num_cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self._num_cached_tokens,
            "output_tokens": num_output_tokens,
        }


def _merged(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`events` with each run of deltas to one block as one delta: a merged
    choice delta (a lagging reader's) makes one event per block it touches."""
    merged: list[dict[str, Any]] = []
    for event in events:
        last = merged[-1] if merged else None
        if (
            last is not None
            and event["type"] == last["type"] == "content_block_delta"
            and event["index"] == last["index"]
        ):
            piece, key = dict(last["delta"]), _DELTA_KEYS[event["delta"]["type"]]
            piece[key] += event["delta"][key]
            merged[-1] = {**last, "delta": piece}
        else:
            merged.append(event)
    return merged


# A block as content_block_start opens it; the key named as its type grows.
_EMPTY_BLOCKS = {
    "thinking": {"type": "thinking", "thinking": "", "signature": ""},
    "text": {"type": "text", "text": ""},
}
_DELTA_KEYS = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "input_json_delta": "partial_json",
}


class _Blocks:
    """The content blocks of a message as they grow; one open at a time."""

    def __init__(self) -> None:
        self._blocks: list[dict[str, Any]] = []
        # Per tool_use block index: its argument text so far.
        self._arguments: dict[int, str] = {}
        # Per call index of the MessageStream: its block index.
        self._call_blocks: list[int] = []
        self._open: int | None = None

    @property
    def has_tool_use(self) -> bool:
        return bool(self._call_blocks)

    def add(self, delta: MessageDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if delta.reasoning:
            events += self._extend(
                "thinking", {"type": "thinking_delta", "thinking": delta.reasoning}
            )
        for part in delta.parts:  # in the text's order
            if isinstance(part, str):
                events += self._extend("text", {"type": "text_delta", "text": part})
            else:
                events += self._add_call(part)
        return events

    def _add_call(self, call: ToolCallDelta) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if call.id is not None:
            assert call.name is not None, "a call's first delta names it"
            events += self._start(_tool_use_block(call.id, call.name))
            self._call_blocks.append(self._open)  # type: ignore[arg-type]
            self._arguments[self._open] = ""  # type: ignore[index]
        if call.arguments:
            block_index = self._call_blocks[call.index]
            assert block_index == self._open, "a call's arguments grow while it is open"
            self._arguments[block_index] += call.arguments
            piece = {"type": "input_json_delta", "partial_json": call.arguments}
            events.append(_delta_event(block_index, piece))
        return events

    def close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        index, self._open = self._open, None
        return [{"type": "content_block_stop", "index": index}]

    def final_blocks(self) -> list[dict[str, Any]]:
        blocks = [dict(block) for block in self._blocks]
        for index, arguments in self._arguments.items():
            blocks[index]["input"] = _tool_input(arguments)
        return blocks

    def _extend(self, block_type: str, piece: dict[str, Any]) -> list[dict[str, Any]]:
        """Events adding `piece` to the open block of `block_type` (opened if need be)."""
        events: list[dict[str, Any]] = []
        if self._open is None or self._blocks[self._open]["type"] != block_type:
            events += self._start(dict(_EMPTY_BLOCKS[block_type]))
        self._blocks[self._open][block_type] += piece[block_type]  # type: ignore[index]
        events.append(_delta_event(self._open, piece))  # type: ignore[arg-type]
        return events

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.close()
        self._open = len(self._blocks)
        self._blocks.append(block)
        start = {"type": "content_block_start", "index": self._open, "content_block": dict(block)}
        return [*events, start]


def _tool_use_block(call_id: str, name: str) -> dict[str, Any]:
    # The MessageStream's "call_<hex>" id, renamed as Anthropic spells its ids.
    tool_id = TOOL_ID_PREFIX + call_id.removeprefix("call_")
    return {"type": "tool_use", "id": tool_id, "name": name, "input": {}}


def _delta_event(index: int, piece: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": piece}


def _tool_input(arguments: str) -> dict[str, Any]:
    """A call's input: its argument text parsed. A call cut before its
    arguments closed (max_tokens) gets what Anthropic's SDK accumulates from
    the same stream: the text parsed in jiter's partial mode (complete
    members kept, a cut string or literal dropped), so the body equals the
    streamed message; {} where even that is no JSON object."""
    try:
        value = json.loads(arguments)
    except ValueError:
        try:
            value = jiter.from_json(arguments.encode(), partial_mode=True)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}
