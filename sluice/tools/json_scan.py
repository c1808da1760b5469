"""Where a JSON value in a growing text ends, or that it has not ended yet.

Tool-call parsers take a call's arguments verbatim from the model's text, so
what they need of JSON is its extent: from a start position, is the value
complete (and where does it end), still open at the end of the text, or
broken (and where)? `scan_value` answers that without building the value.

Invariant (what makes parsing a prefix safe): the answer for a text is
consistent with the answer for any of its prefixes.
- `Scan.end` of an INVALID scan is the length of the longest valid beginning:
  text[start:end] begins some JSON value, the character at `end` cannot follow
  it. So a prefix that stops before `end` scans as INCOMPLETE, and every
  prefix that reaches past it scans as INVALID at the same `end`.
- A value is COMPLETE only when no character could extend it: a number at
  the very end of the text is INCOMPLETE ("1" may become "12"), and so is
  "1." or "1e" (a valid beginning of "1.5", "1e3").
Strings, numbers and literals are matched with regular expressions (C speed);
the Python loop runs once per structural token. `ValueScanner` scans a value
in a growing text, resuming where it stopped: streamed in any number of
pieces, a value costs about what it costs scanned whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

_WHITESPACE = re.compile(r"[ \t\n\r]*+")
# A string's body after the opening quote: plain runs and complete escapes.
_STRING_BODY = re.compile(r'(?:[^"\\\x00-\x1f]++|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*+')
# An escape cut by the end of the text: "\" or "\u" with fewer than 4 hex digits.
_PARTIAL_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{0,3})?\Z")
_HEX_DIGITS = re.compile(r"[0-9a-fA-F]{0,3}")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*+)(\.[0-9]++)?([eE][+-]?[0-9]++)?")
_PARTIAL_EXPONENT = re.compile(r"[eE][+-]?\Z")
_LITERALS = ("true", "false", "null")


class Status(Enum):
    COMPLETE = "complete"
    # The text ends inside the value: all of it so far is a valid beginning.
    INCOMPLETE = "incomplete"
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class Scan:
    status: Status
    # COMPLETE: just after the value. INCOMPLETE: len(text). INVALID: the first
    # position that cannot continue a valid beginning.
    end: int

    @property
    def is_complete(self) -> bool:
        return self.status is Status.COMPLETE


def skip_whitespace(text: str, position: int) -> int:
    """The first position at or after `position` that is not JSON whitespace."""
    match = _WHITESPACE.match(text, position)
    assert match is not None, "the whitespace pattern matches the empty string"
    return match.end()


def scan_string(text: str, position: int) -> Scan:
    """A JSON string starting at `position` (which must hold a quote)."""
    assert text[position] == '"', "a string starts with a quote"
    return _string_rest(text, position + 1)[0]


def _string_rest(text: str, position: int) -> tuple[Scan, int]:
    """A string's body from `position` (just after the quote, or between two
    of its units) and where to resume while it is INCOMPLETE: before an escape
    cut by the end of the text, so no unit is read twice."""
    body = _STRING_BODY.match(text, position)
    assert body is not None, "the string body pattern matches the empty string"
    end = body.end()
    if end == len(text):
        return Scan(Status.INCOMPLETE, end), end
    if text[end] == '"':
        return Scan(Status.COMPLETE, end + 1), end
    if _PARTIAL_ESCAPE.match(text, end):
        return Scan(Status.INCOMPLETE, len(text)), end
    if text[end] == "\\":
        # A bad escape: "\x" breaks at x, "\u12g" at g.
        if text[end + 1] != "u":
            return Scan(Status.INVALID, end + 1), end
        hex_digits = _HEX_DIGITS.match(text, end + 2)
        assert hex_digits is not None, "the pattern matches the empty string"
        return Scan(Status.INVALID, hex_digits.end()), end
    return Scan(Status.INVALID, end), end  # a control character


def scan_value(text: str, position: int) -> Scan:
    """The JSON value starting at `position` (no leading whitespace)."""
    return ValueScanner(position).scan(text)


class ValueScanner:
    """The scan of one JSON value from `start` in a text that only grows between
    calls (each `scan` gets the same text with more at its end).

    A loop over structural tokens with a stack of the closers still expected
    ("}" or "]"); it keeps where it stopped, so each call reads only what the
    last one did not: amortized, the time of a scan is that of the new text.
    It resumes inside a string between two units; a number or a literal cut
    by the end of the text is read again from its start (a few characters,
    read at C speed). A COMPLETE or INVALID answer is final."""

    __slots__ = ("_position", "_expect", "_closers", "_is_in_string", "_final")

    def __init__(self, start: int):
        # Where the next scan resumes, and what is expected there.
        self._position = start
        self._expect = "value"
        self._closers: list[str] = []
        # `_position` is inside a string that began where `_expect` held.
        self._is_in_string = False
        self._final: Scan | None = None

    def scan(self, text: str) -> Scan:
        if self._final is None:
            scan = self._resume(text)
            if scan.status is not Status.INCOMPLETE:
                self._final = scan
            return scan
        return self._final

    def _resume(self, text: str) -> Scan:
        position, expect, closers = self._position, self._expect, self._closers
        while True:
            if self._is_in_string:
                scan, resume = _string_rest(text, position)
                if scan.status is Status.INCOMPLETE:
                    self._position, self._expect = resume, expect
                    return scan
                self._is_in_string = False
                if scan.is_complete and expect in ("key", "key_or_close"):
                    position, expect = scan.end, "colon"
                    continue
            else:
                if closers:
                    position = skip_whitespace(text, position)
                if position >= len(text):
                    self._position, self._expect = position, expect
                    return Scan(Status.INCOMPLETE, len(text))
                step = self._token(text, position, expect)
                if isinstance(step, tuple):
                    position, expect = step
                    continue
                scan = step
                if scan.status is Status.INCOMPLETE:  # a number or a literal, cut
                    self._position, self._expect = position, expect
                    return scan
            if not scan.is_complete or not closers:
                return scan
            position, expect = scan.end, "after_value"

    def _token(self, text: str, position: int, expect: str) -> Scan | tuple[int, str]:
        """The token at `position`: where to go next and what to expect there,
        or the scan of a value (or a close) it ends."""
        char = text[position]
        if expect == "value" or expect == "value_or_close":
            if expect == "value_or_close" and char == "]":
                return self._close(text, position)
            if char in "{[":
                self._closers.append("}" if char == "{" else "]")
                return position + 1, "key_or_close" if char == "{" else "value_or_close"
            if char == '"':
                self._is_in_string = True
                return position + 1, expect
            return scan_scalar(text, position)
        if expect == "key" or expect == "key_or_close":
            if expect == "key_or_close" and char == "}":
                return self._close(text, position)
            if char != '"':
                return Scan(Status.INVALID, position)
            self._is_in_string = True
            return position + 1, expect
        if expect == "colon":
            if char != ":":
                return Scan(Status.INVALID, position)
            return position + 1, "value"
        if char == ",":  # after a value inside a container
            return position + 1, "key" if self._closers[-1] == "}" else "value"
        return self._close(text, position)

    def _close(self, text: str, position: int) -> Scan:
        if text[position] != self._closers[-1]:
            return Scan(Status.INVALID, position)
        self._closers.pop()
        return Scan(Status.COMPLETE, position + 1)


def scan_scalar(text: str, position: int) -> Scan:
    """A string, number, true, false or null starting at `position`."""
    char = text[position]
    if char == '"':
        return scan_string(text, position)
    if char == "-" or char.isdigit():
        return _scan_number(text, position)
    for literal in _LITERALS:
        if literal[0] == char:
            return _scan_literal(text, position, literal)
    return Scan(Status.INVALID, position)


def _scan_number(text: str, position: int) -> Scan:
    number = _NUMBER.match(text, position)
    if number is None:  # "-" then something else, or the end
        end = position + 1
        return Scan(Status.INCOMPLETE if end == len(text) else Status.INVALID, end)
    end = number.end()
    if end == len(text):
        return Scan(Status.INCOMPLETE, end)
    has_fraction, has_exponent = number.group(1) is not None, number.group(2) is not None
    if not has_fraction and not has_exponent and text[end] == ".":
        return Scan(Status.INCOMPLETE if end + 1 == len(text) else Status.INVALID, end + 1)
    if not has_exponent and _PARTIAL_EXPONENT.match(text, end):
        return Scan(Status.INCOMPLETE, len(text))
    if not has_exponent and text[end] in "eE":
        sign = 1 if end + 1 < len(text) and text[end + 1] in "+-" else 0
        return Scan(Status.INVALID, end + 1 + sign)
    return Scan(Status.COMPLETE, end)


def _scan_literal(text: str, position: int, literal: str) -> Scan:
    for offset, expected in enumerate(literal):
        if position + offset == len(text):
            return Scan(Status.INCOMPLETE, len(text))
        if text[position + offset] != expected:
            return Scan(Status.INVALID, position + offset)
    return Scan(Status.COMPLETE, position + len(literal))
