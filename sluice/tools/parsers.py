"""Tool-call parsers, one class per format, each read as the text grows
(`sluice/tools/calls.py`: push(text, is_final) -> what is new).

Formats (`--tool-call-parser`):
- hermes (Qwen2.5, Hermes): content, then any number of
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, content between.
  Text after a call's JSON up to `</tool_call>` belongs to the call and is
  dropped; a `<tool_call>` whose JSON is not a named object is content.
- llama3_json (Llama 3.1+): the whole output is calls when it starts (after
  whitespace and `<|python_tag|>`) with `{`: `{"name": ..., "parameters": {...}}`
  objects separated by `;`. Anything else is content.
- mistral, and what `tool_choice` forces ("required" / named):
  `sluice/tools/call_lists.py`.
- harmony (gpt-oss): `sluice/tools/harmony.py`, one reader of reasoning,
  content and calls (`TOOL_CALL_PARSER_NAMES`).
Every parser keeps the prefix promise of `sluice/tools/calls.py`. When a
call's JSON breaks after its name was read, the call keeps the arguments up
to the break (a model error, passed on as it is); what follows is content,
except in hermes, where the call's tags delimit it. Each state of a parser is
a method that reads on from where the last push stopped (a position it
keeps), so no text is read twice but a tag's cut beginning.
"""

from __future__ import annotations

from sluice.tools.call_lists import MISTRAL_TAG, MistralParser
from sluice.tools.call_object import CallObject
from sluice.tools.calls import TextParser, ToolCallParser, add_content_before
from sluice.tools.harmony import HARMONY, is_harmony_template
from sluice.tools.json_scan import Status, skip_whitespace

HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


class HermesParser(TextParser):
    def __init__(self) -> None:
        super().__init__(self._read_content)
        # Content: where it resumes. Tag: where its whitespace skip resumes.
        # After a call: where the search for its end resumes.
        self._position = 0
        # Where the current `<tool_call>` starts.
        self._start = 0
        self._call = CallObject(0)

    def _read_content(self, text: str, is_final: bool) -> bool:
        start = add_content_before(self.out, text, HERMES_START, self._position, is_final)
        if not text.startswith(HERMES_START, start):
            self._position = start
            return True
        self._start, self._position = start, start + len(HERMES_START)
        self._state = self._read_tag
        return False

    def _read_tag(self, text: str, is_final: bool) -> bool:
        body = self._position = skip_whitespace(text, self._position)
        if body == len(text):  # the tag and nothing else yet
            if is_final:
                self.out.add_content(text[self._start :])
            return True
        if text[body] != "{":  # not a call: the tag is text
            self.out.add_content(text[self._start : body])
            self._state = self._read_content
            return False
        self._call, self._state = CallObject(body), self._read_call
        return False

    def _read_call(self, text: str, is_final: bool) -> bool:
        call = self._call
        was_named = call.name is not None
        scan = call.advance(text)
        if call.name is None:
            if scan.status is Status.INCOMPLETE:
                if is_final:
                    self.out.add_content(text[self._start :])
                return True
            self.out.add_content(text[self._start : scan.end])
            self._position, self._state = scan.end, self._read_content
            return False
        if not was_named:
            self.out.add_call(call)
        if scan.status is Status.INCOMPLETE:
            return True
        self._position, self._state = scan.end, self._read_after_call
        return False

    def _read_after_call(self, text: str, is_final: bool) -> bool:
        """Content resumes past the call's `</tool_call>`, or at the next
        `<tool_call>` if that comes first."""
        close = text.find(HERMES_END, self._position)
        following = text.find(HERMES_START, self._position)
        if following >= 0 and (close < 0 or following < close):
            self._position, self._state = following, self._read_content
            return False
        if close < 0:  # either tag may still begin in the last characters
            self._position = max(self._position, len(text) - len(HERMES_END) + 1)
            return True
        self._position, self._state = close + len(HERMES_END), self._read_content
        return False


class Llama3JsonParser(TextParser):
    def __init__(self) -> None:
        super().__init__(self._read_start)
        # Where reading resumes.
        self._position = 0
        # Where content begins if the object at `_position` is no call.
        self._content_start = 0
        self._call = CallObject(0)

    def _read_start(self, text: str, is_final: bool) -> bool:
        position = self._position = skip_whitespace(text, self._position)
        if text.startswith(PYTHON_TAG, position):
            self._position, self._state = position + len(PYTHON_TAG), self._read_after_tag
            return False
        if PYTHON_TAG.startswith(text[position : position + len(PYTHON_TAG)]):
            return self._held(text, is_final)  # nothing yet, or part of the tag
        self._state = self._read_object
        return False

    def _read_after_tag(self, text: str, is_final: bool) -> bool:
        self._position = skip_whitespace(text, self._position)
        if self._position == len(text):
            return self._held(text, is_final)
        self._state = self._read_object
        return False

    def _read_object(self, text: str, is_final: bool) -> bool:
        if text[self._position] != "{":
            self._position, self._state = self._content_start, self._read_content
            return False
        self._call, self._state = CallObject(self._position), self._read_call
        return False

    def _read_call(self, text: str, is_final: bool) -> bool:
        call = self._call
        was_named = call.name is not None
        scan = call.advance(text)
        if call.name is None:
            if scan.status is Status.INCOMPLETE:
                return self._held(text, is_final)
            self._position, self._state = self._content_start, self._read_content
            return False
        if not was_named:
            self.out.add_call(call)
        if scan.status is Status.INCOMPLETE:
            return True
        # After a break, the rest is content.
        is_broken = scan.status is Status.INVALID
        self._position = scan.end
        self._state = self._read_content if is_broken else self._read_between
        return False

    def _read_between(self, text: str, is_final: bool) -> bool:
        """After a call: whitespace, maybe a ";", whitespace, then the next."""
        position = self._position = skip_whitespace(text, self._position)
        if position == len(text):
            return True
        if text[position] == ";":
            self._position, self._state = position + 1, self._read_after_semicolon
            return False
        self._content_start, self._state = position, self._read_object
        return False

    def _read_after_semicolon(self, text: str, is_final: bool) -> bool:
        position = self._position = skip_whitespace(text, self._position)
        if position == len(text):
            return True
        self._content_start, self._state = position, self._read_object
        return False

    def _read_content(self, text: str, is_final: bool) -> bool:
        self.out.add_content(text[self._position :])
        self._position = len(text)
        return True

    def _held(self, text: str, is_final: bool) -> bool:
        """Text from `_content_start` is undecided: content once the text is final."""
        if is_final:
            self.out.add_content(text[self._content_start :])
        return True


TOOL_CALL_PARSERS: dict[str, ToolCallParser] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
}
# Parsers whose tags are special tokens: the text they read keeps special tokens.
KEEPS_SPECIAL_TOKENS = frozenset({"mistral", HARMONY})
# What `--tool-call-parser` takes: these parsers, and harmony's reader
# (`sluice/tools/harmony.py`, which reads the reasoning too).
TOOL_CALL_PARSER_NAMES = (*TOOL_CALL_PARSERS, HARMONY)


def guess_tool_call_parser(chat_template: str | None) -> str | None:
    """The parser a chat template's own tool-call format calls for; None when
    the template shows none of the formats (then the server shows its default:
    `sluice/tools/tool_format.py`)."""
    if not chat_template:
        return None
    if is_harmony_template(chat_template):
        return HARMONY
    if HERMES_START in chat_template:
        return "hermes"
    if MISTRAL_TAG in chat_template:
        return "mistral"
    if PYTHON_TAG in chat_template or '{"name": function name, "parameters"' in chat_template:
        return "llama3_json"
    return None
