"""gpt-oss's harmony format, read as the text grows: the `analysis` channel
is reasoning, a message to a recipient (`to=functions.NAME`) is a tool call,
and the `final` channel (and a `commentary` message to no one: a preamble)
is content.

The output, its special tokens kept, is a run of messages:

    [<|start|>assistant] <|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY END

with END one of `<|end|>`, `<|call|>`, `<|return|>` or the end of the text
(the engine stops on `<|call|>` and `<|return|>`); the first message's
`<|start|>assistant` is the prompt's. The recipient may also stand before the
channel (`<|start|>assistant to=functions.f<|channel|>commentary json`, as
gpt-oss's template writes past calls). Text outside any header is content.

`HarmonyReader` keeps the promise of the other readers (`sluice/tools/calls.py`):
each push reads only what is new (a marker cut at the end is held until
decided), returns only what the new text decided, and never takes back what
it sent, so any chunking of a text gives the reasoning, content and calls of
the whole text read at once (`parse_harmony`). A call's arguments are the
message body, verbatim. A header cut off by the end of the text is format,
not content: it is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sluice.tools.calls import CallPiece, held_tag_prefix

# The name `--reasoning-parser` and `--tool-call-parser` give this format.
HARMONY = "harmony"
START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
# What begins a header: text anywhere else is content up to the next one.
HEADER_OPENINGS = (START, CHANNEL)
_LONGEST_OPENING = max(map(len, HEADER_OPENINGS))
RECIPIENT, FUNCTIONS = "to=", "functions."
REASONING_CHANNEL = "analysis"

BodyKind = Literal["reasoning", "content", "call", "loose"]


def is_harmony_template(chat_template: str | None) -> bool:
    """A chat template that writes harmony messages (gpt-oss's)."""
    return chat_template is not None and CHANNEL in chat_template and MESSAGE in chat_template


@dataclass(slots=True)
class HarmonyPiece:
    """What one push decided: reasoning, then content and calls' pieces in
    the text's order (`calls.ParsedPiece`'s parts)."""

    reasoning: str = ""
    parts: list[str | CallPiece] = field(default_factory=list)

    def add(self, kind: BodyKind, text: str, call_index: int) -> None:
        if not text:
            return
        last = self.parts[-1] if self.parts else None
        if kind == "reasoning":
            self.reasoning += text
        elif kind == "call" and isinstance(last, CallPiece) and last.index == call_index:
            last.arguments += text
        elif kind == "call":
            self.parts.append(CallPiece(call_index, None, text))
        elif isinstance(last, str):
            self.parts[-1] = last + text
        else:
            self.parts.append(text)


class HarmonyReader:
    """One choice's harmony text, read as it grows. `reads_calls` False
    (tool_choice none, no tools): a call's body is content."""

    def __init__(self, reads_calls: bool = True) -> None:
        self.text = ""
        self._reads_calls = reads_calls
        # Where the header or body being read starts (a body: resumes).
        self._position = 0
        # Where the search for the header's or body's end resumes.
        self._search = 0
        # None while reading a header.
        self._kind: BodyKind | None = None
        self._num_calls = 0

    def push(self, text: str, is_final: bool) -> HarmonyPiece:
        self.text += text
        piece = HarmonyPiece()
        while True:
            read = self._read_header if self._kind is None else self._read_body
            if not read(piece, is_final):
                return piece

    def _read_header(self, piece: HarmonyPiece, is_final: bool) -> bool:
        """True when a body begins (read on), False when more text is needed."""
        text, start = self.text, self._position
        rest = text[start : start + _LONGEST_OPENING]
        if not rest:
            return False
        if not rest.startswith(HEADER_OPENINGS):
            if not is_final and any(opening.startswith(rest) for opening in HEADER_OPENINGS):
                return False  # maybe an opening, cut
            self._begin_body("loose", start)
            return True
        end = text.find(MESSAGE, max(self._search, start))
        if end < 0:
            self._search = max(start, len(text) - len(MESSAGE) + 1)
            if is_final:
                self._position = len(text)  # a cut header: dropped
            return False
        kind, name = _header_kind(text[start:end])
        if kind == "call" and not self._reads_calls:
            kind = "content"
        if kind == "call":
            piece.parts.append(CallPiece(self._num_calls, name, ""))
            self._num_calls += 1
        self._begin_body(kind, end + len(MESSAGE))
        return True

    def _begin_body(self, kind: BodyKind, start: int) -> None:
        self._kind, self._position, self._search = kind, start, start

    def _read_body(self, piece: HarmonyPiece, is_final: bool) -> bool:
        """True when the body ended (a header follows), False when more text is needed."""
        assert self._kind is not None, "reading a body"
        text, kind = self.text, self._kind
        markers = (*ENDS, *HEADER_OPENINGS) if kind == "loose" else ENDS
        end, marker = _first_of(text, markers, max(self._search, self._position))
        call_index = self._num_calls - 1
        if marker is None:
            held = 0 if is_final else max(held_tag_prefix(text, m, self._search) for m in markers)
            stop = len(text) - held
            piece.add(_emitted(kind), text[self._position : stop], call_index)
            self._position = stop
            self._search = max(stop, len(text) - max(map(len, markers)) + 1)
            return False
        piece.add(_emitted(kind), text[self._position : end], call_index)
        # A header opening that ends loose text is the next header's.
        self._position = end if marker in HEADER_OPENINGS else end + len(marker)
        self._kind, self._search = None, self._position
        return True


def _emitted(kind: BodyKind) -> BodyKind:
    return "content" if kind == "loose" else kind


def _first_of(text: str, markers: tuple[str, ...], start: int) -> tuple[int, str | None]:
    """The earliest of `markers` in text[start:]: (its index, it), or (-1, None)."""
    found = [(index, marker) for marker in markers if (index := text.find(marker, start)) >= 0]
    if not found:
        return -1, None
    return min(found)


def _header_kind(header: str) -> tuple[BodyKind, str | None]:
    """What a message's body is, from its header (and the call's name)."""
    recipient = _word_after(header, RECIPIENT)
    if recipient:
        return "call", recipient.removeprefix(FUNCTIONS)
    if _word_after(header, CHANNEL) == REASONING_CHANNEL:
        return "reasoning", None
    return "content", None


def _word_after(header: str, key: str) -> str | None:
    """The text after `key` up to whitespace or the next special token."""
    start = header.find(key)
    if start < 0:
        return None
    word = header[start + len(key) :].split(maxsplit=1)
    return word[0].split("<|", 1)[0] if word else ""


@dataclass(frozen=True, slots=True)
class HarmonyMessage:
    """A whole harmony text's parse."""

    reasoning: str
    content: str
    # (name, arguments) per call, in order.
    calls: tuple[tuple[str, str], ...]


def parse_harmony(text: str, reads_calls: bool = True) -> HarmonyMessage:
    """A whole text read at once (one push)."""
    piece = HarmonyReader(reads_calls).push(text, is_final=True)
    calls: list[list[str]] = []
    content = ""
    for part in piece.parts:
        if isinstance(part, str):
            content += part
        elif part.name is not None:
            calls.append([part.name, part.arguments])
        else:
            calls[part.index][1] += part.arguments
    return HarmonyMessage(piece.reasoning, content, tuple((n, a) for n, a in calls))
