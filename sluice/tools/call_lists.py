"""Tool-call formats whose calls are a JSON list, and the named `tool_choice`.

- mistral: content, then `[TOOL_CALLS]` and a JSON array of call objects (or
  one object: Mistral 7B v0.3, Mistral Nemo), or, in the newer form (Mistral
  Small 3.2, Devstral, Magistral, Ministral 3: tokenizers v11+), each call as
  `[TOOL_CALLS]name[ARGS]{...}`, one after another (content may come between).
  What follows the tag tells the forms apart (a "[" or "{" cannot begin a
  name). The tags are special tokens, so this parser needs the text with
  special tokens kept (`parsers.KEEPS_SPECIAL_TOKENS`).
- required / named: what `tool_choice` forces through constrained decoding:
  a JSON array of `{"name": ..., "parameters": {...}}`, or the arguments object
  of one named function (`sluice/tools/schema.py` builds the schemas).
Read as the text grows, as every parser is (`sluice/tools/calls.py`).
"""

from __future__ import annotations

import re

from sluice.tools.call_object import CallObject
from sluice.tools.calls import TextParser, ToolCallParser, add_content_before
from sluice.tools.json_scan import Scan, Status, ValueScanner, skip_whitespace
from sluice.tools.surrogates import mend_escapes

MISTRAL_TAG = "[TOOL_CALLS]"
# The newer form's tag between a call's name and its arguments.
MISTRAL_ARGS_TAG = "[ARGS]"
# What a function name is made of (OpenAI's [a-zA-Z0-9_-], and dots).
_NAME = re.compile(r"[\w.\-]*")


class CallListParser(TextParser):
    """The list part: from a "[" (or, for one call, a "{") at `_position`, call
    objects; text from `_start` is content if no call comes of it, and what
    follows the list is content too. Subclasses read up to the list."""

    def __init__(self) -> None:
        super().__init__(self._read_prefix)
        # Where reading resumes; in a list, where the element begins.
        self._position = 0
        # Where content begins if no call comes of the list.
        self._start = 0
        # A "[" list, or one call object.
        self._is_array = True
        self._call = CallObject(0)

    def _read_prefix(self, text: str, is_final: bool) -> bool:
        raise NotImplementedError

    def _open_list(self, start: int, position: int, is_array: bool) -> None:
        self._start, self._is_array = start, is_array
        if is_array:  # past the "["
            self._position, self._state = position + 1, self._read_list_open
        else:
            self._position, self._state = position, self._read_element

    def _read_list_open(self, text: str, is_final: bool) -> bool:
        position = self._position = skip_whitespace(text, self._position)
        if position < len(text) and text[position] == "]":
            return self._to_content(self._start)
        self._state = self._read_element
        return False

    def _read_element(self, text: str, is_final: bool) -> bool:
        # Whitespace after a "," may come in a later delta than the ",".
        self._position = skip_whitespace(text, self._position)
        if self._position == len(text):
            return True
        if text[self._position] != "{":
            return self._to_content(self._content_start)
        self._call, self._state = CallObject(self._position), self._read_call
        return False

    def _read_call(self, text: str, is_final: bool) -> bool:
        call = self._call
        was_named = call.name is not None
        scan = call.advance(text)
        if call.name is None:
            if scan.status is not Status.INCOMPLETE:
                return self._to_content(self._content_start)
            if is_final:
                self.out.add_content(text[self._content_start :])
            return True
        if not was_named:
            self.out.add_call(call)
        if scan.status is Status.INCOMPLETE:
            return True
        if scan.status is Status.INVALID or not self._is_array:  # what follows is content
            return self._to_content(scan.end)
        self._position, self._state = scan.end, self._read_after_element
        return False

    def _read_after_element(self, text: str, is_final: bool) -> bool:
        position = self._position = skip_whitespace(text, self._position)
        if position == len(text):
            return True
        if text[position] == "]":
            return self._to_content(position + 1)
        if text[position] != ",":
            return self._to_content(position)
        self._position = skip_whitespace(text, position + 1)
        self._state = self._read_element
        return False

    def _read_content(self, text: str, is_final: bool) -> bool:
        self.out.add_content(text[self._position :])
        self._position = len(text)
        return True

    @property
    def _content_start(self) -> int:
        """Where content begins if the element at `_position` is no call."""
        return self._start if not self.out.calls else self._position

    def _to_content(self, position: int) -> bool:
        self._position, self._state = position, self._read_content
        return False


class MistralParser(CallListParser):
    def __init__(self) -> None:
        super().__init__()
        # The newer form's call being read, once named.
        self._named: NamedArguments | None = None

    def _read_prefix(self, text: str, is_final: bool) -> bool:
        """Content up to the tag, then a list or a named call after it."""
        start = add_content_before(self.out, text, MISTRAL_TAG, self._position, is_final)
        if not text.startswith(MISTRAL_TAG, start):
            self._position = start
            return True
        self._start, self._position = start, start + len(MISTRAL_TAG)
        self._state = self._read_tag
        return False

    def _read_tag(self, text: str, is_final: bool) -> bool:
        body = self._position = skip_whitespace(text, self._position)
        if body == len(text):
            return self._held(text, is_final)
        if text[body] in "{[":
            self._open_list(self._start, body, is_array=text[body] == "[")
        else:
            self._state = self._read_name
        return False

    def _read_name(self, text: str, is_final: bool) -> bool:
        """The newer form: `name[ARGS]`, then the arguments object."""
        name = _NAME.match(text, self._position)
        assert name is not None, "the name pattern matches the empty string"
        rest = text[name.end() : name.end() + len(MISTRAL_ARGS_TAG)]
        if name.end() > self._position and rest == MISTRAL_ARGS_TAG:
            self._named = NamedArguments(name.group(), name.end() + len(MISTRAL_ARGS_TAG))
            self.out.add_call(self._named)
            self._state = self._read_arguments
            return False
        if MISTRAL_ARGS_TAG.startswith(rest) and name.end() + len(rest) == len(text):
            return self._held(text, is_final)  # the name or its tag may go on
        return self._to_content(self._start)  # not a call: the tag is text

    def _read_arguments(self, text: str, is_final: bool) -> bool:
        """Once the object closes, content (or the next call) follows; a
        broken object ends the call where it broke."""
        assert self._named is not None, "named before its arguments"
        self._named.read(text)
        scan = self._named.scan
        if scan.status is Status.INCOMPLETE:
            return True
        self._position, self._state = scan.end, self._read_prefix
        return False

    def _held(self, text: str, is_final: bool) -> bool:
        """Text from the tag is undecided: content once the text is final."""
        if is_final:
            self.out.add_content(text[self._start :])
        return True


class RequiredParser(CallListParser):
    """The output of `tool_choice: "required"`: a JSON array of calls."""

    def _read_prefix(self, text: str, is_final: bool) -> bool:
        position = self._position = skip_whitespace(text, self._position)
        if position == len(text):
            if is_final:
                self.out.add_content(text)
            return True
        if text[position] != "[":
            return self._to_content(0)
        self._open_list(0, position, is_array=True)
        return False


class NamedArguments:
    """The one call of a `tool_choice` naming a function: the output is its
    arguments object (nothing, if the output is no object)."""

    def __init__(self, name: str, position: int = 0):
        self.name: str | None = name
        # Where the object starts once seen, and its scan; `position`: where
        # the text after the name begins (whitespace may precede the object).
        self._start: int | None = None
        self._position = position
        self._scanner = ValueScanner(position)
        self._scan = Scan(Status.INCOMPLETE, position)

    @property
    def is_complete(self) -> bool:
        return self._scan.is_complete

    @property
    def scan(self) -> Scan:
        """The object's scan: INVALID where no object starts or where it broke."""
        return self._scan

    def read(self, text: str) -> None:
        if self._start is None:
            self._position = skip_whitespace(text, self._position)
            if self._position == len(text):
                return
            self._start = self._position
            if text[self._start] != "{":  # never an object: no arguments
                self._scan = Scan(Status.INVALID, self._start)
                return
            self._scanner = ValueScanner(self._start)
        if self._scan.status is Status.INCOMPLETE:
            self._scan = self._scanner.scan(text)

    def arguments_from(self, text: str, is_final: bool, num_sent_chars: int) -> str:
        if self._start is None:
            return ""
        is_decided = is_final or self._scan.status is not Status.INCOMPLETE
        return mend_escapes(text[self._start + num_sent_chars : self._scan.end], is_decided)


class NamedFunctionParser(TextParser):
    def __init__(self, name: str):
        super().__init__(self._read_arguments)
        self._call = NamedArguments(name)
        self.out.add_call(self._call)

    def _read_arguments(self, text: str, is_final: bool) -> bool:
        self._call.read(text)
        return True


def named_function_parser(name: str) -> ToolCallParser:
    """The parser of a `tool_choice` naming `name`: the output is its arguments."""
    return lambda: NamedFunctionParser(name)
