"""Tool-call parsers, one pure function per format: `parse(text, is_final) -> ParsedText`.

Formats (`--tool-call-parser`):
- hermes (Qwen2.5, Hermes): content, then any number of
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, content between.
  Text after a call's JSON up to `</tool_call>` belongs to the call and is
  dropped; a `<tool_call>` whose JSON is not a named object is content.
- llama3_json (Llama 3.1+): the whole output is calls when it starts (after
  whitespace and `<|python_tag|>`) with `{`: `{"name": ..., "parameters": {...}}`
  objects separated by `;`. Anything else is content.
- mistral: content, then `[TOOL_CALLS]` and a JSON array of call objects (or
  one object); the tag is a special token, so this parser needs the text
  with special tokens kept (`KEEPS_SPECIAL_TOKENS`).
- required / named: what `tool_choice` forces through constrained decoding:
  a JSON array of `{"name": ..., "parameters": {...}}`, or the arguments object
  of one named function (`sluice/tools/schema.py` builds the schemas).
Every parser keeps the prefix promise of `sluice/tools/calls.py`. When a
call's JSON breaks after its name was read, the call keeps the arguments up
to the break (a model error, passed on as it is); what follows is content,
except in hermes, where the call's tags delimit it.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.tools.calls import (
    ContentBuilder,
    ParsedCall,
    ParsedText,
    held_tag_prefix,
    scan_call_object,
)
from sluice.tools.json_scan import Status, scan_value, skip_whitespace
from sluice.tools.surrogates import mend_escapes

ToolCallParser = Callable[[str, bool], ParsedText]

HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_TAG = "[TOOL_CALLS]"
ARGUMENT_KEYS = ("arguments", "parameters")


def parse_hermes(text: str, is_final: bool = False) -> ParsedText:
    out = ContentBuilder()
    position = 0
    while (start := text.find(HERMES_START, position)) >= 0:
        out.add_content(text[position:start])
        body = skip_whitespace(text, start + len(HERMES_START))
        if body == len(text) or text[body] != "{":
            if body == len(text):  # the tag and nothing else yet
                return _held(out, text, start, is_final)
            out.add_content(text[start:body])  # not a call: the tag is text
            position = body
            continue
        found = scan_call_object(text, body, ARGUMENT_KEYS)
        if found.name is None:
            if found.scan.status is Status.INCOMPLETE:
                return _held(out, text, start, is_final)
            out.add_content(text[start : found.scan.end])
            position = found.scan.end
            continue
        out.add_call(found.call(text, is_final))
        if found.scan.status is Status.INCOMPLETE:
            return out.parsed(is_final)
        position = _after_hermes_call(text, found.scan.end)
        if position < 0:
            return out.parsed(is_final)
    held = 0 if is_final else held_tag_prefix(text, HERMES_START, position)
    out.add_content(text[position : len(text) - held])
    return out.parsed(is_final)


def _after_hermes_call(text: str, position: int) -> int:
    """Where content resumes after a call's JSON: past its `</tool_call>`, or at
    the next `<tool_call>` if that comes first; -1 while neither is there."""
    close = text.find(HERMES_END, position)
    following = text.find(HERMES_START, position)
    if following >= 0 and (close < 0 or following < close):
        return following
    return -1 if close < 0 else close + len(HERMES_END)


def parse_llama3_json(text: str, is_final: bool = False) -> ParsedText:
    out = ContentBuilder()
    position = skip_whitespace(text, 0)
    if text.startswith(PYTHON_TAG, position):
        position = skip_whitespace(text, position + len(PYTHON_TAG))
    elif PYTHON_TAG.startswith(text[position : position + len(PYTHON_TAG)]):
        # Nothing yet, or part of the tag.
        return _held(out, text, 0, is_final)
    if position == len(text):
        return _held(out, text, 0, is_final)
    content_start = 0  # where content begins if this object is no call
    while True:
        if text[position] != "{":
            out.add_content(text[content_start:])
            return out.parsed(is_final)
        found = scan_call_object(text, position, ARGUMENT_KEYS)
        if found.name is None:
            if found.scan.status is Status.INCOMPLETE:
                return _held(out, text, content_start, is_final)
            out.add_content(text[content_start:])
            return out.parsed(is_final)
        out.add_call(found.call(text, is_final))
        if not found.scan.is_complete:
            return _rest_after_break(out, text, found.scan.status, found.scan.end, is_final)
        position = skip_whitespace(text, found.scan.end)
        if position < len(text) and text[position] == ";":
            position = skip_whitespace(text, position + 1)
        if position == len(text):
            return out.parsed(is_final)
        content_start = position


def parse_mistral(text: str, is_final: bool = False) -> ParsedText:
    out = ContentBuilder()
    start = text.find(MISTRAL_TAG)
    if start < 0:
        held = 0 if is_final else held_tag_prefix(text, MISTRAL_TAG)
        out.add_content(text[: len(text) - held])
        return out.parsed(is_final)
    out.add_content(text[:start])
    body = skip_whitespace(text, start + len(MISTRAL_TAG))
    if body == len(text):
        return _held(out, text, start, is_final)
    if text[body] == "{":
        return _call_list(out, text, body, start, is_final, is_array=False)
    if text[body] == "[":
        return _call_list(out, text, body, start, is_final, is_array=True)
    out.add_content(text[start:])
    return out.parsed(is_final)


def parse_required(text: str, is_final: bool = False) -> ParsedText:
    """The output of `tool_choice: "required"`: a JSON array of calls."""
    out = ContentBuilder()
    position = skip_whitespace(text, 0)
    if position == len(text):
        return _held(out, text, 0, is_final)
    if text[position] != "[":
        out.add_content(text)
        return out.parsed(is_final)
    return _call_list(out, text, position, 0, is_final, is_array=True)


def named_function_parser(name: str) -> ToolCallParser:
    """The parser of a `tool_choice` naming `name`: the output is its arguments."""

    def parse_named(text: str, is_final: bool = False) -> ParsedText:
        position = skip_whitespace(text, 0)
        if position == len(text) or text[position] != "{":
            end, is_complete, is_decided = position, False, True
        else:
            scan = scan_value(text, position)
            end, is_complete = scan.end, scan.is_complete
            is_decided = scan.status is not Status.INCOMPLETE
        arguments = mend_escapes(text[position:end], is_final or is_decided)
        return ParsedText("", (ParsedCall(name, arguments, is_complete),))

    return parse_named


def _call_list(
    out: ContentBuilder, text: str, position: int, start: int, is_final: bool, *, is_array: bool
) -> ParsedText:
    """Call objects from `position` (a "[" or, not `is_array`, one "{"). Text
    from `start` is content if no call comes of it; what follows the list too."""
    if is_array:
        position = skip_whitespace(text, position + 1)
        if position < len(text) and text[position] == "]":
            out.add_content(text[start:])
            return out.parsed(is_final)
    while position < len(text):
        if text[position] != "{":
            out.add_content(text[start if not out.calls else position :])
            return out.parsed(is_final)
        found = scan_call_object(text, position, ARGUMENT_KEYS)
        if found.name is None:
            if found.scan.status is Status.INCOMPLETE:
                return _held(out, text, start if not out.calls else position, is_final)
            out.add_content(text[start if not out.calls else position :])
            return out.parsed(is_final)
        out.add_call(found.call(text, is_final))
        if not found.scan.is_complete:
            return _rest_after_break(out, text, found.scan.status, found.scan.end, is_final)
        position = skip_whitespace(text, found.scan.end)
        if not is_array or position == len(text):
            break
        if text[position] == "]":
            position += 1
            break
        if text[position] != ",":
            break
        position = skip_whitespace(text, position + 1)
    out.add_content(text[position:])
    return out.parsed(is_final)


def _held(out: ContentBuilder, text: str, start: int, is_final: bool) -> ParsedText:
    """Text from `start` is undecided: held, or content once the text is final."""
    if is_final:
        out.add_content(text[start:])
    return out.parsed(is_final)


def _rest_after_break(
    out: ContentBuilder, text: str, status: Status, end: int, is_final: bool
) -> ParsedText:
    """After a call cut by the end of the text, or broken at `end`: what follows
    a break is content."""
    if status is Status.INVALID:
        out.add_content(text[end:])
    return out.parsed(is_final)


TOOL_CALL_PARSERS: dict[str, ToolCallParser] = {
    "hermes": parse_hermes,
    "llama3_json": parse_llama3_json,
    "mistral": parse_mistral,
}
# Parsers whose tags are special tokens: the text they read keeps special tokens.
KEEPS_SPECIAL_TOKENS = frozenset({"mistral"})


def guess_tool_call_parser(chat_template: str | None) -> str | None:
    """The parser a chat template's own tool-call format calls for; None when
    the template shows none of the formats (then tool_choice "auto" is a 400)."""
    if not chat_template:
        return None
    if HERMES_START in chat_template:
        return "hermes"
    if MISTRAL_TAG in chat_template:
        return "mistral"
    if PYTHON_TAG in chat_template or '{"name": function name, "parameters"' in chat_template:
        return "llama3_json"
    return None
