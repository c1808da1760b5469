"""What a tool-call parser reads from a model's text, and the pieces every
format shares: the content between calls, the calls, and what of them is new.

A parser is an object per choice that takes the text as it grows:
`push(text, is_final) -> ParsedPiece` with only what the text decided since
the last push, in the text's order: new content, a call's name once (with its
first argument text), then argument text that extends what went out. It keeps where it
stopped, so a push costs about the time of its own text (amortized), however
long the message already is. What it sends is never taken back: text that
may still turn out to be a tag, or a call whose name is not known yet, is
held until decided; `is_final=True` decides it (the text is all there is).
So however the text is cut into pushes, the pieces add up to the parse of the
whole text (`parse_text`, one push): for a text t and any prefix p of it,
- `parse_text(p).content` is a prefix of `parse_text(t).content`;
- `parse_text(p).calls` are as many or fewer, each with the same name and an
  `arguments` that is a prefix of the same call's in `parse_text(t)`.

Arguments are the model's own text of the arguments object, verbatim (never
re-serialized; lone surrogate escapes alone become "\\ufffd"): a streamed
call is the non-streamed one byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    # The arguments object's text as the model wrote it (so far): a JSON object
    # once `is_complete`; "{}" when the call closed without arguments.
    arguments: str
    # The call's JSON closed; an incomplete call at the end of a finished
    # generation was cut (max_tokens) or broken.
    is_complete: bool


@dataclass(frozen=True, slots=True)
class ParsedText:
    # Text outside tool calls, whitespace next to a call trimmed.
    content: str
    calls: tuple[ParsedCall, ...] = ()


@dataclass(slots=True)
class CallPiece:
    index: int
    # On the call's first piece only.
    name: str | None
    # Argument text that extends what was sent ("" on a first piece with none yet).
    arguments: str


@dataclass(slots=True)
class ParsedPiece:
    """What one push decided, in the text's order: content (a str) and calls'
    pieces. One push may end a call and begin the content after it (a token
    like `"}}.`), or hold content, a call and more content: a reader that
    builds items in order applies the parts in this order."""

    parts: list[str | CallPiece] = field(default_factory=list)

    @property
    def content(self) -> str:
        return "".join(part for part in self.parts if isinstance(part, str))

    @property
    def calls(self) -> list[CallPiece]:
        return [part for part in self.parts if isinstance(part, CallPiece)]

    def add_content(self, text: str) -> None:
        """Append content, joined to content right before it (never empty)."""
        if not text:
            return
        if self.parts and isinstance(self.parts[-1], str):
            self.parts[-1] += text
        else:
            self.parts.append(text)


class CallSource(Protocol):
    """A call as far as the text goes, named (a call counts once named)."""

    name: str | None

    @property
    def is_complete(self) -> bool: ...

    def arguments_from(self, text: str, is_final: bool, num_sent_chars: int) -> str: ...


class ContentBuilder:
    """The content of a text with calls in it, trimmed next to calls, and the
    calls, in the text's order; what of both went out.

    Content comes in pieces, in order, however the text was cut: whitespace
    before a call or at the very end is held until decided: dropped when a
    call follows (or the text ends after calls), kept when more content
    follows (or the text ends without calls). Whitespace right after a call
    is dropped. Without calls, the content is the text itself.
    """

    def __init__(self) -> None:
        self.calls: list[CallSource] = []
        # Content pieces and calls as the text has them.
        self._parts: list[str | CallSource] = []
        # Trailing whitespace of the content so far, not decided yet.
        self._pending = ""
        self._is_after_call = False
        self._num_sent_parts = 0
        # Per call sent: argument characters sent.
        self._num_sent_chars: list[int] = []

    def add_content(self, text: str) -> None:
        if self._is_after_call:
            text = text.lstrip()
            if not text:
                return
            self._is_after_call = False
        body = text.rstrip()
        if body:
            self._parts.append(self._pending + body)
            self._pending = ""
        self._pending += text[len(body) :]

    def add_call(self, call: CallSource) -> None:
        assert call.name is not None, "a call counts once named"
        self._pending = ""
        self._is_after_call = True
        self.calls.append(call)
        self._parts.append(call)

    def close(self) -> None:
        """The text ended: held whitespace is content if no call came."""
        if not self.calls:
            self._parts.append(self._pending)
            self._pending = ""

    def take(self, text: str, is_final: bool) -> ParsedPiece:
        """What was added since the last take, in the text's order. Only the
        last call sent may still grow, and what was added since comes after
        it: the calls before it ended before it began."""
        piece = ParsedPiece()
        if self._num_sent_chars:
            self._take_arguments(piece, len(self._num_sent_chars) - 1, text, is_final)
        for part in self._parts[self._num_sent_parts :]:
            if isinstance(part, str):
                piece.add_content(part)
                continue
            arguments = part.arguments_from(text, is_final, 0)
            piece.parts.append(CallPiece(len(self._num_sent_chars), part.name, arguments))
            self._num_sent_chars.append(len(arguments))
        self._num_sent_parts = len(self._parts)
        return piece

    def parsed(self, text: str, is_final: bool) -> ParsedText:
        """Everything so far, whole (for reading a text at once)."""
        calls = []
        for call in self.calls:
            assert call.name is not None, "a call counts once named"
            arguments = call.arguments_from(text, is_final, 0)
            calls.append(ParsedCall(call.name, arguments, call.is_complete))
        content = "".join(part for part in self._parts if isinstance(part, str))
        return ParsedText(content, tuple(calls))

    def _take_arguments(self, piece: ParsedPiece, index: int, text: str, is_final: bool) -> None:
        arguments = self.calls[index].arguments_from(text, is_final, self._num_sent_chars[index])
        if arguments:
            piece.parts.append(CallPiece(index, None, arguments))
            self._num_sent_chars[index] += len(arguments)


# A parser's state: reads from where the parser stopped; True when it needs
# more text, False when it moved to another state.
ReadStep = Callable[[str, bool], bool]


class TextParser:
    """The base of tool-call parsers: the text so far, the output, and the
    state, a method that reads on from where the last push stopped."""

    def __init__(self, state: ReadStep) -> None:
        self.text = ""
        self.out = ContentBuilder()
        self._state = state

    def push(self, text: str, is_final: bool) -> ParsedPiece:
        """Take the next text (`is_final`: the last) and return what it decided."""
        self.text += text
        while not self._state(self.text, is_final):
            pass
        if is_final:
            self.out.close()
        return self.out.take(self.text, is_final)


ToolCallParser = Callable[[], TextParser]


def parse_text(parser: ToolCallParser, text: str, is_final: bool = False) -> ParsedText:
    """The parse of a whole text (or of a prefix, not `is_final`)."""
    reader = parser()
    reader.push(text, is_final)
    return reader.out.parsed(reader.text, is_final)


def add_content_before(
    out: ContentBuilder, text: str, tag: str, position: int, is_final: bool
) -> int:
    """Add text[position:] to `out` as content up to the first `tag`, holding
    back a cut beginning of the tag at the end unless `is_final`; return where
    the content stopped: the tag's start when the text holds it (then
    `text.startswith(tag, returned)`), else where reading resumes."""
    start = text.find(tag, position)
    if start < 0:
        held = 0 if is_final else held_tag_prefix(text, tag, position)
        start = len(text) - held
    out.add_content(text[position:start])
    return start


def held_tag_prefix(text: str, tag: str, start: int = 0) -> int:
    """Length of the longest suffix of text[start:] that is a proper prefix of
    `tag` (it may still become the tag: held back like a stop string's prefix)."""
    start = text.find(tag[0], max(start, len(text) - len(tag) + 1))
    while start >= 0:
        if tag.startswith(text[start:]):
            return len(text) - start
        start = text.find(tag[0], start + 1)
    return 0
