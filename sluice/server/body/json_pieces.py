"""JSON parsed in pieces, so that no single call holds the GIL for long.

`loads(data)` returns what `orjson.loads(data)` returns, but orjson only ever
parses pieces of about `piece_bytes`: runs of whole elements of an array or
members of an object (parsed inside brackets of their own), single values,
and slices of a long string cut between characters and escapes. Where a piece
ends is found with `bytes.find` and regex searches over at most
`SCAN_WINDOW_BYTES`. Between any two of these calls another thread can take
the GIL: one `orjson.loads` of a 4 MB body held it for 30 ms and more, and
the event loop with it, even from a worker thread.

How a container is cut: from the start of an element, the first comma after
`piece_bytes` that follows the byte the previous element ended with (`},` in
a list of objects, a digit and a comma in a list of numbers) is tried as the
end of a run. orjson parses `[` + run + `]`; that succeeds only when the
comma separates two elements of this very container: a comma inside a string
leaves the string open, one inside a nested value leaves it unclosed, and a
comma past the container's end leaves what follows it trailing. When the try
fails, the elements of the next piece are parsed one by one, each found by a
scan of its strings and brackets, and a run is tried again after them. An
element larger than a piece is parsed the same way, recursively.

Invariants: for every document orjson accepts (nested at most `MAX_DEPTH`
containers larger than a piece deep), the value equals `orjson.loads(data)`:
each piece is parsed by orjson and parsing a piece does not depend on what
surrounds it. Every byte outside the pieces is checked here (brackets, commas,
colons, whitespace), so a document orjson refuses raises `JSONPiecesError`
(a ValueError; the message is this module's, not orjson's).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

# Bytes orjson parses in one call: ~0.3-1 ms for dense JSON on a loaded machine.
PIECE_BYTES = 64 * 1024
# Bytes one search scans at most (a byte-class search runs at ~1 GB/s).
SCAN_WINDOW_BYTES = 256 * 1024
# Containers larger than a piece nested in each other; far above what any
# request body needs (orjson itself refuses 1,024 levels).
MAX_DEPTH = 200

_QUOTE, _BACKSLASH, _COMMA, _COLON = b'"', b"\\", b",", b":"
_OPENERS = frozenset(b"[{")
_CLOSER_OF = {ord("["): ord("]"), ord("{"): ord("}")}
_WHITESPACE = re.compile(rb"[ \t\n\r]*")
_STRUCTURE = re.compile(rb'["\[\]{}]')
_SCALAR_END = re.compile(rb"[,\]} \t\n\r]")
# Where a long string may be cut: before a character (not a UTF-8
# continuation byte, not a backslash) with no backslash in the 6 bytes before
# it, so not inside an escape; or before a backslash that starts an escape
# (none right before it), unless that escape is a surrogate pair's low half.
_STRING_CUT = re.compile(rb"(?<=[^\\]{6})[^\x80-\xbf\\]|(?<!\\)\\(?!u[dD][c-fC-F])")


def _run_end(last_byte: bytes) -> re.Pattern[bytes]:
    return re.compile(last_byte + rb"[ \t\n\r]*,")


# The byte an element ends with -> the comma that may end a run of such elements.
_RUN_ENDS = {
    **{digit: _run_end(rb"[0-9]") for digit in b"0123456789"},
    **{letter: _run_end(rb"[el]") for letter in b"el"},  # true, false, null
    ord('"'): _run_end(rb'"'),
    ord("]"): _run_end(rb"\]"),
    ord("}"): _run_end(rb"\}"),
}


class JSONPiecesError(ValueError):
    """The document is not valid JSON (or nests too deep)."""


def loads(data: bytes | bytearray, piece_bytes: int = PIECE_BYTES) -> Any:
    """`orjson.loads(data)`, in pieces of about `piece_bytes`."""
    if len(data) <= piece_bytes:
        return _loads(data, 0, len(data))
    return _Parser(data, piece_bytes).document()


def _loads(data: bytes | bytearray, start: int, end: int) -> Any:
    try:
        return orjson.loads(data[start:end])
    except orjson.JSONDecodeError as exc:
        raise JSONPiecesError(f"{exc} (in bytes {start}-{end})") from None


class _Parser:
    """One document; positions are byte offsets into it."""

    def __init__(self, data: bytes | bytearray, piece_bytes: int):
        self.data = data
        self.piece_bytes = piece_bytes

    def document(self) -> Any:
        value, end = self._value(self._skip_whitespace(0), depth=0)
        end = self._skip_whitespace(end)
        if end != len(self.data):
            raise self._error("data after the document", end)
        return value

    # -- values ------------------------------------------------------------------

    def _value(self, start: int, depth: int) -> tuple[Any, int]:
        """The value starting at `start`, and where it ends."""
        first = self._byte(start)
        if first in _OPENERS:
            end = self._container_end(start, start + self.piece_bytes)
            if end is not None:
                return _loads(self.data, start, end), end
            return self._container(start, depth + 1)
        if first == ord(_QUOTE):
            end = self._string_end(start)
            return self._string(start, end), end
        end = self._scalar_end(start)
        if end == start:
            raise self._error("a value was expected", start)
        return _loads(self.data, start, end), end

    def _container(self, start: int, depth: int) -> tuple[list | dict, int]:
        """A container larger than a piece: runs of elements, or one at a time."""
        if depth > MAX_DEPTH:
            raise self._error(f"more than {MAX_DEPTH} large containers nested", start)
        is_object = self.data[start] == ord("{")
        closer = _CLOSER_OF[self.data[start]]
        result: list | dict = {} if is_object else []
        position = self._skip_whitespace(start + 1)
        if self._byte(position) == closer:
            return result, position + 1
        run_end: re.Pattern[bytes] | None = None
        # After a run that failed, elements up to here are parsed one at a time.
        one_at_a_time_until = position
        while True:
            if run_end is not None and position >= one_at_a_time_until:
                cut = self._run_cut(run_end, position)
                run = None if cut is None else self._run(position, cut, is_object)
                if run is not None and cut is not None:
                    if isinstance(result, dict):
                        result.update(run)
                    else:
                        result.extend(run)
                    position = self._skip_whitespace(cut + 1)
                    continue
                one_at_a_time_until = position + self.piece_bytes
            position = self._element(position, result, depth)
            run_end = _RUN_ENDS.get(self.data[position - 1])
            position = self._skip_whitespace(position)
            separator = self._byte(position)
            if separator == closer:
                return result, position + 1
            if separator != ord(_COMMA):
                raise self._error("',' or the container's end was expected", position)
            position = self._skip_whitespace(position + 1)

    def _element(self, start: int, result: list | dict, depth: int) -> int:
        """Parse one element (or member) into `result`; where it ends."""
        if isinstance(result, list):
            value, end = self._value(start, depth)
            result.append(value)
            return end
        if self._byte(start) != ord(_QUOTE):
            raise self._error("a member name was expected", start)
        name_end = self._string_end(start)
        name = self._string(start, name_end)
        colon = self._skip_whitespace(name_end)
        if self._byte(colon) != ord(_COLON):
            raise self._error("':' was expected", colon)
        value, end = self._value(self._skip_whitespace(colon + 1), depth)
        result[name] = value
        return end

    def _run(self, start: int, cut: int, is_object: bool) -> list | dict | None:
        """The elements in [start, cut) if they are whole elements of this container."""
        open_, close = (b"{", b"}") if is_object else (b"[", b"]")
        try:
            return orjson.loads(open_ + self.data[start:cut] + close)
        except orjson.JSONDecodeError:
            return None

    def _run_cut(self, run_end: re.Pattern[bytes], start: int) -> int | None:
        """The comma that may end a run starting at `start`: one to two pieces later."""
        begin = start + self.piece_bytes
        match = run_end.search(self.data, begin, begin + self.piece_bytes)
        return None if match is None else match.end() - 1

    # -- strings -----------------------------------------------------------------

    def _string(self, start: int, end: int) -> str:
        """The string in [start, end), quotes included; a long one in slices."""
        if end - start <= self.piece_bytes:
            return _loads(self.data, start, end)
        slices = []
        low, high = start + 1, end - 1
        while high - low > self.piece_bytes:
            cut = self._string_cut(low + self.piece_bytes, high)
            if cut is None:
                break
            slices.append(self._string_slice(low, cut))
            low = cut
        slices.append(self._string_slice(low, high))
        return "".join(slices)

    def _string_slice(self, start: int, end: int) -> str:
        try:
            return orjson.loads(_QUOTE + self.data[start:end] + _QUOTE)
        except orjson.JSONDecodeError as exc:
            raise JSONPiecesError(f"{exc} (in the string at bytes {start}-{end})") from None

    def _string_cut(self, start: int, end: int) -> int | None:
        """A place to cut the string's content in [start, end), if any."""
        position = start
        while position < end:
            # 8 bytes more, so the look-ahead for a low surrogate sees it whole.
            window_end = min(position + SCAN_WINDOW_BYTES, end)
            match = _STRING_CUT.search(self.data, position, window_end + 8)
            if match is not None and match.start() < window_end:
                return match.start()
            position = window_end
        return None

    def _string_end(self, start: int, limit: int | None = None) -> int:
        """Where the string starting (with its quote) at `start` ends, after its
        quote; -1 if that is after `limit`."""
        data = self.data
        position = start + 1
        search_end = len(data) if limit is None else limit
        while True:
            quote = data.find(_QUOTE, position, search_end)
            if quote < 0 and search_end < len(data):
                return -1
            if quote < 0:
                raise self._error("unterminated string", start)
            num_backslashes = 0
            while data[quote - 1 - num_backslashes] == ord(_BACKSLASH):
                num_backslashes += 1
            if num_backslashes % 2 == 0:
                return quote + 1
            position = quote + 1

    # -- scanning ----------------------------------------------------------------

    def _container_end(self, start: int, limit: int) -> int | None:
        """Where the container at `start` ends, if it ends by `limit`."""
        depth = 0
        position = start
        while position <= limit:
            match = _STRUCTURE.search(self.data, position, limit + 1)
            if match is None:
                return None
            found = match.start()
            if self.data[found] == ord(_QUOTE):
                position = self._string_end(found, limit)
                if position < 0:
                    return None
                continue
            depth += 1 if self.data[found] in _OPENERS else -1
            position = found + 1
            if depth == 0:
                return position
        return None

    def _scalar_end(self, start: int) -> int:
        position = start
        while position < len(self.data):
            window_end = position + SCAN_WINDOW_BYTES
            match = _SCALAR_END.search(self.data, position, window_end)
            if match is not None:
                return match.start()
            position = window_end
        return len(self.data)

    def _skip_whitespace(self, start: int) -> int:
        position = start
        while True:
            window_end = position + SCAN_WINDOW_BYTES
            end = _WHITESPACE.match(self.data, position, window_end).end()  # type: ignore[union-attr]
            if end < window_end or end >= len(self.data):
                return end
            position = end

    def _byte(self, position: int) -> int:
        if position >= len(self.data):
            raise self._error("unexpected end of the document", position)
        return self.data[position]

    def _error(self, message: str, position: int) -> JSONPiecesError:
        return JSONPiecesError(f"{message} at byte {position}")
