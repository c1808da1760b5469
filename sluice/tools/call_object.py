"""One `{"name": ..., "arguments": {...}}` call object read from a growing text.

`CallObject` is the object's scan, resumed as the text grows (as
`json_scan.ValueScanner` is): member by member, each key and value read by its
own resumable scanner, so a call streamed in many pieces costs about what it
costs read whole. The name must be a string and the arguments an object;
other members are skipped. The name counts once its string closed (then the
call is committed); the arguments are the model's own text, verbatim but for
lone surrogate escapes (`sluice/tools/surrogates.py`).
"""

from __future__ import annotations

import json
from collections.abc import Collection

from sluice.tools.json_scan import Scan, Status, ValueScanner, skip_whitespace
from sluice.tools.surrogates import mend_decoded, mend_escapes

# The keys a call object's arguments may have (hermes and mistral write
# "arguments", llama3_json and the forced formats "parameters").
ARGUMENT_KEYS = ("arguments", "parameters")


class CallObject:
    """The call object starting at `start` (a "{") in a growing text."""

    def __init__(self, start: int, arguments_keys: Collection[str] = ARGUMENT_KEYS):
        assert arguments_keys, "a call has a key for its arguments"
        self._arguments_keys = arguments_keys
        # How far the object is valid: INCOMPLETE while the text ends inside it.
        self.scan = Scan(Status.INCOMPLETE, start)
        # Decoded once its string closed.
        self.name: str | None = None
        # Where the arguments value starts and its scan, once its key was read.
        self.arguments_start: int | None = None
        self.arguments_scan: Scan | None = None
        # Where reading resumes, what is expected there ("first": a key or the
        # close, "key", "colon", "value", "after": "," or the close), and the
        # scanner of the key or value being read.
        self._position = start + 1
        self._expect = "first"
        self._scanner: ValueScanner | None = None
        self._key = ""

    @property
    def is_complete(self) -> bool:
        return self.scan.is_complete

    def advance(self, text: str) -> Scan:
        """Read what `text` adds since the last call; the object's scan."""
        if self.scan.status is Status.INCOMPLETE:
            self.scan = self._read(text)
        return self.scan

    def arguments_from(self, text: str, is_final: bool, num_sent_chars: int) -> str:
        """The arguments' text (so far) past their first `num_sent_chars`: a JSON
        object once complete, "{}" when the call closed without arguments. An
        escape still undecided at its end is held back unless `is_final`."""
        if self.arguments_start is None or self.arguments_scan is None:
            return "{}"[num_sent_chars:] if self.scan.is_complete else ""
        is_decided = is_final or self.arguments_scan.status is not Status.INCOMPLETE
        start = self.arguments_start + num_sent_chars
        return mend_escapes(text[start : self.arguments_scan.end], is_decided)

    def _read(self, text: str) -> Scan:
        while True:
            if self._scanner is not None:
                scan = self._read_member(text, self._scanner)
                if scan is not None:
                    return scan
                continue
            position = skip_whitespace(text, self._position)
            self._position = position
            if position == len(text):
                return Scan(Status.INCOMPLETE, len(text))
            char = text[position]
            if char == "}" and self._expect in ("first", "after"):
                return Scan(Status.COMPLETE, position + 1)
            if self._expect in ("first", "key") and char == '"':
                self._scanner = ValueScanner(position)
            elif self._expect == "after" and char == ",":
                self._position, self._expect = position + 1, "key"
            elif self._expect == "colon" and char == ":":
                self._position, self._expect = position + 1, "value"
            elif self._expect == "value":
                if not self._starts_member_value(char):
                    return Scan(Status.INVALID, position)
                self._scanner = ValueScanner(position)
            else:
                return Scan(Status.INVALID, position)

    def _starts_member_value(self, char: str) -> bool:
        """Whether a value starting with `char` may be the current key's; the
        arguments' scan starts with it."""
        if self._key == "name" and self.name is None:
            return char == '"'
        if self._key in self._arguments_keys and self.arguments_start is None:
            if char != "{":
                return False
            self.arguments_start = self._position
            self.arguments_scan = Scan(Status.INCOMPLETE, self._position)
        return True

    def _read_member(self, text: str, scanner: ValueScanner) -> Scan | None:
        """Go on with the key or value being read: the object's scan when it
        stops there (the text ends inside it, or it breaks), else None."""
        start = self._position
        scan = scanner.scan(text)
        is_arguments = self._expect == "value" and self.arguments_start == start
        if is_arguments:
            self.arguments_scan = scan
        if not scan.is_complete:
            return scan
        self._scanner = None
        if self._expect != "value":
            self._key = json.loads(text[start : scan.end])
            self._position, self._expect = scan.end, "colon"
            return None
        if self._key == "name" and self.name is None:
            self.name = mend_decoded(json.loads(text[start : scan.end]))
        self._position, self._expect, self._key = scan.end, "after", ""
        return None
