"""Ollama's responses, streamed (NDJSON lines) and not, from the same choice deltas.

A stream is one JSON object a line: `done: false` lines carrying what a delta
adds (`/api/chat`: `message.content`, `message.thinking`,
`message.tool_calls`; `/api/generate`: `response`, `thinking`), then one
final line, `done: true`, with `done_reason` ("stop", "length"), the counts
(`prompt_eval_count`: the prompt's tokens, `eval_count`: the tokens sent),
the durations in nanoseconds and, on /api/generate, `context` (the prompt's
tokens and the answer's, which a next request may send back). Without
`stream` the body is one object: the final line with the whole message.

Both forms go through `_Reply.add` (one choice delta -> one `MessageDelta`
per token piece, as `apis/messages/events.py` reads them); a stream writes what
each delta added, the body keeps the sum, so they never disagree:
- the `content` (and `thinking`) of the lines concatenate to the body's;
- a tool call goes out whole, in Ollama's shape (`{"function": {"index",
  "name", "arguments": {object}}}`), on the line where it is complete (a
  later part of the text began, or the choice finished), as Ollama sends it;
- no line is empty: a delta whose text is all held back (a cut tag, a call
  still growing) makes none (None), and its tokens count with the next;
- a lagging reader's merged delta makes one line: fewer, larger lines,
  nothing lost or reordered (`frontend/stream_output.py` merges them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

import jiter
import orjson

from sluice.errors import openai_error_of
from sluice.frontend.deltas import ChoiceDelta
from sluice.frontend.request import GenerationRequest
from sluice.frontend.text_pieces import token_pieces, whole_piece
from sluice.frontend.usage import UsageCounter
from sluice.tools.message_stream import MessageDelta, ToolCallDelta

NDJSON_MEDIA_TYPE = "application/x-ndjson"
# Which route's shapes: /api/chat's `message` or /api/generate's `response`.
Route = Literal["chat", "generate"]
# Nanoseconds of a monotonic clock (time.perf_counter_ns).
NanosecondClock = Callable[[], int]


def encode_line(payload: dict[str, Any]) -> bytes:
    return orjson.dumps(payload) + b"\n"


def created_at() -> str:
    """Now, as Ollama writes it: RFC 3339 in UTC, "Z"."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def load_body(model_name: str, route: Route) -> dict[str, Any]:
    """Ollama's answer to a request with nothing to generate (no messages, no
    prompt): the model is loaded (here: always), `done_reason` "load"."""
    body: dict[str, Any] = {"model": model_name, "created_at": created_at()}
    body |= (
        {"message": {"role": "assistant", "content": ""}} if route == "chat" else {"response": ""}
    )
    return body | {"done": True, "done_reason": "load"}


class OllamaLines:
    """The lines of one /api/chat or /api/generate request, or its body (one choice)."""

    def __init__(
        self,
        request: GenerationRequest,
        route: Route,
        clock: NanosecondClock = time.perf_counter_ns,
    ):
        assert request.num_choices == 1, "an Ollama answer is one choice"
        self._request = request
        self._route = route
        self._clock = clock
        self._started_ns = clock()
        self._first_token_ns: int | None = None
        self._reply = _Reply(request)
        # Delivered tokens (`eval_count`), counted by the frontend.
        self.usage = UsageCounter(request)

    # -- streamed -------------------------------------------------------------

    def opening_events(self) -> list[bytes]:
        return []

    def delta_event(self, index: int, delta: ChoiceDelta) -> bytes | None:
        self._time(delta)
        piece = self._reply.add(delta)
        if piece.is_empty:
            return None
        return encode_line(self._line(piece, is_done=False))

    def closing_events(self) -> list[bytes]:
        return [encode_line(self._final(_Piece()))]

    def error_events(self, error: Exception) -> list[bytes]:
        return [encode_line({"error": openai_error_of(error)["error"]["message"]})]

    # -- non-streamed ----------------------------------------------------------

    def fold(self, index: int, delta: ChoiceDelta) -> None:
        self._time(delta)
        self._reply.add(delta)

    def body(self) -> bytes:
        return orjson.dumps(self._final(self._reply.whole()))

    # -- shared -----------------------------------------------------------------

    def _time(self, delta: ChoiceDelta) -> None:
        if self._first_token_ns is None and delta.token_ids:
            self._first_token_ns = self._clock()

    def _line(self, piece: _Piece, *, is_done: bool) -> dict[str, Any]:
        line: dict[str, Any] = {"model": self._request.model_name, "created_at": created_at()}
        if self._route == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": piece.content}
            if piece.thinking:
                message["thinking"] = piece.thinking
            if piece.tool_calls:
                message["tool_calls"] = piece.tool_calls
            line["message"] = message
        else:
            line["response"] = piece.content
            if piece.thinking:
                line["thinking"] = piece.thinking
        line["done"] = is_done
        return line

    def _final(self, piece: _Piece) -> dict[str, Any]:
        line = self._line(piece, is_done=True)
        reply = self._reply
        now_ns = self._clock()
        first_ns = now_ns if self._first_token_ns is None else self._first_token_ns
        line["done_reason"] = reply.finish_reason or "stop"
        if self._route == "generate":
            line["context"] = [*self._request.prompts[0].token_ids, *reply.token_ids]
        line |= {
            "total_duration": now_ns - self._started_ns,
            # One model, loaded with the server: nothing loads per request.
            "load_duration": 0,
            "prompt_eval_count": len(self._request.prompts[0].token_ids),
            "prompt_eval_duration": first_ns - self._started_ns,
            "eval_count": self.usage.num_completion_tokens(0),
            # At least 1: clients divide by it (tokens per second).
            "eval_duration": max(now_ns - first_ns, 1),
        }
        return line


class _Piece:
    """What one delta adds to the reply (or the whole reply)."""

    __slots__ = ("content", "thinking", "tool_calls")

    def __init__(self) -> None:
        self.content = ""
        self.thinking = ""
        self.tool_calls: list[dict[str, Any]] = []

    @property
    def is_empty(self) -> bool:
        return not (self.content or self.thinking or self.tool_calls)


class _Reply:
    """One choice's answer as it grows: its parse, its tokens, the calls not yet sent."""

    def __init__(self, request: GenerationRequest):
        parsing = request.output_parsing
        self._stream = None if parsing is None else parsing.message_stream()
        # Calls cut into the stream token by token (apis/messages/events.py's reason).
        self._is_cut_per_token = parsing is not None and parsing.reads_tool_calls
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self._whole = _Piece()
        # The call still growing: [name, argument text]; sent once complete.
        self._open_call: list[str] | None = None
        self._num_calls = 0

    def add(self, delta: ChoiceDelta) -> _Piece:
        """What `delta` adds (also kept in the whole reply)."""
        self.token_ids += delta.token_ids
        piece = _Piece()
        if self._stream is None:
            piece.content = delta.text
        else:
            pieces = token_pieces(delta) if self._is_cut_per_token else [whole_piece(delta)]
            for text_piece in pieces:
                self._apply(self._stream.push(text_piece.text, text_piece.is_final), piece)
        if delta.is_finished:
            self._close_call(piece)
            self.finish_reason = delta.finish_reason
        self._whole.content += piece.content
        self._whole.thinking += piece.thinking
        self._whole.tool_calls += piece.tool_calls
        return piece

    def whole(self) -> _Piece:
        return self._whole

    def _apply(self, delta: MessageDelta, piece: _Piece) -> None:
        piece.thinking += delta.reasoning
        for part in delta.parts:  # in the text's order
            if isinstance(part, str):
                if part:
                    self._close_call(piece)
                piece.content += part
            else:
                self._grow_call(part, piece)

    def _grow_call(self, call: ToolCallDelta, piece: _Piece) -> None:
        if call.id is not None:
            assert call.name is not None, "a call's first delta names it"
            self._close_call(piece)
            self._open_call = [call.name, ""]
        assert self._open_call is not None, "a call's arguments follow its name"
        self._open_call[1] += call.arguments

    def _close_call(self, piece: _Piece) -> None:
        if self._open_call is None:
            return
        name, arguments = self._open_call
        function = {"index": self._num_calls, "name": name, "arguments": _arguments(arguments)}
        piece.tool_calls.append({"function": function})
        self._open_call = None
        self._num_calls += 1


def _arguments(text: str) -> dict[str, Any]:
    """A call's arguments as the object Ollama sends: the text parsed; a call
    cut before its arguments closed (num_predict) keeps its complete members
    (jiter's partial mode); {} where even that is no JSON object."""
    try:
        value = json.loads(text)
    except ValueError:
        try:
            value = jiter.from_json(text.encode(), partial_mode=True)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}
