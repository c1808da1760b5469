"""Server-sent events on the wire: each event is exactly b"data: " + compact JSON
+ b"\\n\\n", serialized once with orjson; the last is `DONE_EVENT`.

`ChunkEvents` encodes the chunks of one response: the envelope every chunk
shares (id, object, created, model) is encoded once, and each chunk only
serializes its choice (and usage). The usual chunk, one unfinished choice
with text only, is spliced from bytes spelled once around its text
(`TextChoice`). The bytes are exactly those of `encode_event` on the whole
chunk dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from sluice.errors import openai_error_of

DONE_EVENT = b"data: [DONE]\n\n"


def encode_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def openai_error_events(error: Exception) -> list[bytes]:
    """How a chat or completions stream ends when it fails after its first
    event: one `data: {"error": ...}` event, then [DONE]."""
    return [encode_event(openai_error_of(error)), DONE_EVENT]


class ChunkEvents:
    """The SSE events of one streamed response's chunks."""

    __slots__ = ("_head",)

    def __init__(self, response_id: str, object_name: str, created: int, model_name: str):
        envelope = orjson.dumps(
            {
                "id": response_id,
                "object": object_name,
                "created": created,
                "model": model_name,
                "choices": [],
            }
        )
        assert envelope.endswith(b"[]}"), "choices is the envelope's last key"
        # Everything up to and including the "[" of choices.
        self._head = b"data: " + envelope[: -len(b"]}")]

    def text_event(self, choice: TextChoice, text: str) -> bytes:
        """The event of a chunk of one `choice` carrying `text`, no usage."""
        return b"".join((self._head, choice.head, orjson.dumps(text), choice.tail, b"]}\n\n"))

    def event(self, choice: dict[str, Any] | None, usage: dict[str, int] | None = None) -> bytes:
        """The event of one chunk: one choice (None: `choices: []`), then `usage` if given."""
        choice_json = b"" if choice is None else orjson.dumps(choice)
        if usage is None:
            return b"".join((self._head, choice_json, b"]}\n\n"))
        return b"".join((self._head, choice_json, b'],"usage":', orjson.dumps(usage), b"}\n\n"))


# Stands for the text in a choice dict given to `TextChoice.around`.
TEXT_PLACEHOLDER = "\x00text\x00"


@dataclass(frozen=True, slots=True)
class TextChoice:
    """The JSON of an unfinished choice whose only varying value is one text:
    the bytes before and after that text's JSON string."""

    head: bytes
    tail: bytes

    @classmethod
    def around(cls, choice: dict[str, Any]) -> TextChoice:
        """From the choice dict with `TEXT_PLACEHOLDER` for the text: the bytes
        around it are exactly what orjson writes for the dict."""
        head, placeholder, tail = orjson.dumps(choice).partition(orjson.dumps(TEXT_PLACEHOLDER))
        assert placeholder and TEXT_PLACEHOLDER.encode() not in tail, "exactly one placeholder"
        return cls(head, tail)
