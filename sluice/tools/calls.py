"""What a tool-call parser reads from a model's text, and the pieces every
format shares: one call object and the content between calls.

A parser is a pure function `parse(text, is_final) -> ParsedText` over all the
text generated so far. The streaming path calls it after every delta and sends
what grew, so each parser keeps one promise (checked by the stream's owner,
`sluice/tools/message_stream.py`): for a text t and any prefix p of it parsed
with `is_final=False`,
- `parse(p).content` is a prefix of `parse(t).content`;
- `parse(p).calls` are as many or fewer, each with the same name and an
  `arguments` that is a prefix of the same call's in `parse(t)`.
So a parser commits to nothing that more text could undo: text that may still
turn out to be a tag, or a call whose name is not known yet, is held (left
out) until it is decided; `is_final=True` decides it (the text is all there is).

Arguments are the model's own text of the arguments object, verbatim (never
re-serialized): a prefix of it is a prefix of the final string, and a
streamed call is the non-streamed one byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field

from sluice.tools.json_scan import Scan, Status, scan_string, scan_value, skip_whitespace
from sluice.tools.surrogates import mend_decoded, mend_escapes


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
class CallObject:
    """One `{"name": ..., "arguments": {...}}` object as far as the text goes."""

    scan: Scan
    # Decoded once its string closed: then the call is committed.
    name: str | None = None
    # Where the arguments value starts and its scan, once its key was read.
    arguments_start: int | None = None
    arguments_scan: Scan | None = None

    def call(self, text: str, is_final: bool) -> ParsedCall:
        assert self.name is not None, "only a named object is a call"
        arguments = self._arguments(text, is_final)
        return ParsedCall(self.name, arguments, self.scan.is_complete)

    def _arguments(self, text: str, is_final: bool) -> str:
        if self.arguments_start is None or self.arguments_scan is None:
            return "{}" if self.scan.is_complete else ""
        is_decided = is_final or self.arguments_scan.status is not Status.INCOMPLETE
        raw = text[self.arguments_start : self.arguments_scan.end]
        return mend_escapes(raw, is_decided)


def scan_call_object(text: str, position: int, arguments_keys: Collection[str]) -> CallObject:
    """The call object starting at `position` (a "{"): its name, where its
    arguments are, and how far it is valid. The name must be a string and the
    arguments an object; other members are skipped."""
    assert text[position] == "{", "a call object starts with a brace"
    found = CallObject(Scan(Status.INCOMPLETE, len(text)))
    position += 1
    is_first = True
    while True:
        position = skip_whitespace(text, position)
        if position == len(text):
            return found
        if is_first and text[position] == "}":
            found.scan = Scan(Status.COMPLETE, position + 1)
            return found
        member = _scan_member(text, position, found, arguments_keys)
        if not member.is_complete:
            found.scan = member
            return found
        position = skip_whitespace(text, member.end)
        if position == len(text):
            return found
        if text[position] == "}":
            found.scan = Scan(Status.COMPLETE, position + 1)
            return found
        if text[position] != ",":
            found.scan = Scan(Status.INVALID, position)
            return found
        position += 1
        is_first = False


def _scan_member(
    text: str, position: int, found: CallObject, arguments_keys: Collection[str]
) -> Scan:
    """One `"key": value` member; records the name and the arguments in `found`."""
    if text[position] != '"':
        return Scan(Status.INVALID, position)
    key_scan = scan_string(text, position)
    if not key_scan.is_complete:
        return key_scan
    key = json.loads(text[position : key_scan.end])
    position = skip_whitespace(text, key_scan.end)
    if position == len(text):
        return Scan(Status.INCOMPLETE, position)
    if text[position] != ":":
        return Scan(Status.INVALID, position)
    position = skip_whitespace(text, position + 1)
    if position == len(text):
        return Scan(Status.INCOMPLETE, position)
    is_name = key == "name" and found.name is None
    is_arguments = key in arguments_keys and found.arguments_start is None
    if is_name and text[position] != '"':
        return Scan(Status.INVALID, position)
    if is_arguments and text[position] != "{":
        return Scan(Status.INVALID, position)
    value = scan_value(text, position)
    if is_name and value.is_complete:
        found.name = mend_decoded(json.loads(text[position : value.end]))
    if is_arguments:
        found.arguments_start, found.arguments_scan = position, value
    return value


@dataclass(slots=True)
class ContentBuilder:
    """The content of a text with calls in it, trimmed next to calls.

    Whitespace before a call or at the very end is held until decided: dropped
    when a call follows (or the text ends after calls), kept when more content
    follows (or the text ends without calls). Whitespace right after a call
    is dropped. Without calls, the content is the text itself.
    """

    parts: list[str] = field(default_factory=list)
    calls: list[ParsedCall] = field(default_factory=list)
    # Trailing whitespace of the content so far, not decided yet.
    _pending: str = ""
    _is_after_call: bool = False

    def add_content(self, text: str) -> None:
        if self._is_after_call:
            text = text.lstrip()
            if not text:
                return
            self._is_after_call = False
        body = text.rstrip()
        if body:
            self.parts.append(self._pending + body)
            self._pending = ""
        self._pending += text[len(body) :]

    def add_call(self, call: ParsedCall) -> None:
        self._pending = ""
        self._is_after_call = True
        self.calls.append(call)

    def parsed(self, is_final: bool, max_calls: int | None = None) -> ParsedText:
        if is_final and not self.calls:
            self.parts.append(self._pending)
        calls = self.calls if max_calls is None else self.calls[:max_calls]
        return ParsedText("".join(self.parts), tuple(calls))


def held_tag_prefix(text: str, tag: str, start: int = 0) -> int:
    """Length of the longest suffix of text[start:] that is a proper prefix of
    `tag` (it may still become the tag: held back like a stop string's prefix)."""
    start = text.find(tag[0], max(start, len(text) - len(tag) + 1))
    while start >= 0:
        if tag.startswith(text[start:]):
            return len(text) - start
        start = text.find(tag[0], start + 1)
    return 0
