"""A choice's message streamed in any chunking adds up to the parse of its whole
text: same content, reasoning and calls (names, arguments byte for byte)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.tools import json_scan
from sluice.tools.call_lists import MistralParser, RequiredParser, named_function_parser
from sluice.tools.calls import ParsedCall, parse_text
from sluice.tools.message_stream import MessageDelta, MessageStream
from sluice.tools.parsers import HermesParser, Llama3JsonParser
from sluice.tools.reasoning import DeepSeekR1Splitter, split_deepseek_r1

ARGUMENTS = [
    {"city": "Zürich", "unit": "celsius"},
    {"query": "naïve café 😀 語", "nested": {"deep": [1, 2.5, {"x": None}], "ok": True}},
    {},
    {"text": 'quote " backslash \\ tag </tool_call> <tool_call> [TOOL_CALLS]'},
]
SAMPLES = {
    "hermes": [
        "Plain answer, no calls. a < b and <tool_callx> too.",
        "I'll check.\n<tool_call>\n"
        + json.dumps({"name": "get_weather", "arguments": ARGUMENTS[0]})
        + "\n</tool_call>\n<tool_call>\n"
        + json.dumps({"name": "search", "arguments": ARGUMENTS[1]}, ensure_ascii=False)
        + "\n</tool_call>",
        '<tool_call>{"name": "echo", "arguments": '
        + json.dumps(ARGUMENTS[3])
        + "}</tool_call> Done <tool_call",
        '<tool_call>{"name": "broken", "arguments": {"a": 1,]}}</tool_call>after',
    ],
    "llama3_json": [
        "<|python_tag|>"
        + json.dumps({"name": "get_weather", "parameters": ARGUMENTS[0]})
        + "; "
        + json.dumps({"name": "noop", "parameters": ARGUMENTS[2]}),
        "Just text {with braces}.",
        json.dumps({"name": "cut", "parameters": ARGUMENTS[1]}, ensure_ascii=False)[:-7],
    ],
    "mistral": [
        "Calling tools. [TOOL_CALLS]"
        + json.dumps(
            [
                {"name": "get_weather", "arguments": ARGUMENTS[0]},
                {"name": "search", "arguments": ARGUMENTS[1]},
            ],
            ensure_ascii=False,
        ),
        "No calls but [TOOL_CALL and [TOOL_CALLS look-alikes.",
    ],
    "required": [
        json.dumps(
            [
                {"name": "get_weather", "parameters": ARGUMENTS[0]},
                {"name": "echo", "parameters": ARGUMENTS[3]},
            ]
        ),
    ],
    "named": [json.dumps(ARGUMENTS[1], ensure_ascii=False, indent=2)],
}
PARSERS = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
    "required": RequiredParser,
    "named": named_function_parser("search"),
}
CASES = [(name, text) for name, texts in SAMPLES.items() for text in texts]


@st.composite
def chunkings(draw, text: str) -> list[str]:
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=len(text))))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a] or [""]


def folded(deltas: list[MessageDelta]) -> tuple[str, str, list[ParsedCall]]:
    """What a client accumulates: reasoning, content and calls, from the deltas."""
    reasoning = "".join(delta.reasoning for delta in deltas)
    content = "".join(delta.content for delta in deltas)
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for delta in deltas:
        for call in delta.tool_calls:
            if call.id is not None:
                assert call.index == len(names), "calls are announced in order, once"
                assert call.id.startswith("call_") and call.name is not None
                names[call.index] = call.name
                arguments[call.index] = ""
            else:
                assert call.name is None, "the name goes out once"
            arguments[call.index] += call.arguments
    calls = [ParsedCall(names[i], arguments[i], True) for i in range(len(names))]
    return reasoning, content, calls


def streamed(chunks: list[str], stream: MessageStream) -> list[MessageDelta]:
    return [stream.push(chunk, i == len(chunks) - 1) for i, chunk in enumerate(chunks)]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(CASES), st.data())
def test_any_chunking_gives_the_calls_and_content_of_the_whole_text(case, data):
    name, text = case
    chunks = data.draw(chunkings(text))
    deltas = streamed(chunks, MessageStream(PARSERS[name], None))
    whole = parse_text(PARSERS[name], text, True)
    _, content, calls = folded(deltas)
    assert content == whole.content
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole.calls]


@pytest.mark.parametrize(("name", "text"), CASES)
def test_every_cut_in_two_gives_the_calls_and_content_of_the_whole_text(name, text):
    # Random chunkings rarely cut at one exact place (a required list whose
    # ", {" was split after the comma lost its second call to content).
    whole = parse_text(PARSERS[name], text, True)
    expected = (whole.content, [(c.name, c.arguments) for c in whole.calls])
    for cut in range(1, len(text)):
        deltas = streamed([text[:cut], text[cut:]], MessageStream(PARSERS[name], None))
        _, content, calls = folded(deltas)
        assert (content, [(c.name, c.arguments) for c in calls]) == expected, cut


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SAMPLES["hermes"]), st.data())
def test_reasoning_then_calls_in_any_chunking(answer, data):
    text = "<think>\nThe user wants <tool_call> weather.\n</think>\n\n" + answer
    chunks = data.draw(chunkings(text))
    reasoning, content, calls = folded(
        streamed(chunks, MessageStream(HermesParser, DeepSeekR1Splitter))
    )
    split = split_deepseek_r1(text, True)
    whole = parse_text(HermesParser, split.content or "", True)
    assert reasoning == "\nThe user wants <tool_call> weather.\n"
    assert (content, [(c.name, c.arguments) for c in calls]) == (
        whole.content,
        [(c.name, c.arguments) for c in whole.calls],
    )


def test_a_call_goes_out_with_its_id_and_name_then_argument_fragments():
    stream = MessageStream(HermesParser, None)
    assert stream.push('Hi <tool_call>{"name": "f', False) == MessageDelta.of_content("Hi")
    first = stream.push('", "arguments": {"a": ', False)
    (call,) = first.tool_calls
    assert (call.index, call.name, call.arguments) == (0, "f", '{"a": ')
    second = stream.push("1}}</tool_call>", True)
    (more,) = second.tool_calls
    assert (more.index, more.id, more.name, more.arguments) == (0, None, None, "1}")
    assert stream.has_tool_calls


def test_parallel_tool_calls_false_keeps_the_first_call_only():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    _, _, calls = folded(streamed([text], MessageStream(HermesParser, None, max_calls=1)))
    assert [c.name for c in calls] == ["a"]


def test_without_parsers_the_text_is_the_content():
    stream = MessageStream(None, None)
    assert stream.push("<tool_call>{}", False) == MessageDelta.of_content("<tool_call>{}")


# -- each delta costs the time of its own text -------------------------------------


class CountingPattern:
    """A compiled pattern that counts the characters its matches examine."""

    def __init__(self, pattern: re.Pattern[str]):
        self._pattern = pattern
        self.num_chars = 0

    def match(self, text: str, position: int = 0) -> re.Match[str] | None:
        match = self._pattern.match(text, position)
        self.num_chars += 1 + (0 if match is None else match.end() - position)
        return match


def long_call(name: str, num_members: int) -> str:
    arguments = json.dumps({f"key_{i}": [i, "value", {"ok": True}] for i in range(num_members)})
    return {
        "hermes": f'Sure.\n<tool_call>\n{{"name": "search", "arguments": {arguments}}}\n</tool_call>',
        "llama3_json": f'<|python_tag|>{{"name": "search", "parameters": {arguments}}}',
        "mistral": f'[TOOL_CALLS] [{{"name": "search", "arguments": {arguments}}}]',
        "required": f'[{{"name": "search", "parameters": {arguments}}}]',
        "named": arguments,
    }[name]


def scanner_work(monkeypatch, name: str, num_members: int) -> int:
    """Characters the JSON scanner examines while a long call streams in
    deltas of 3 characters, as a model's tokens come."""
    patterns = [CountingPattern(json_scan._WHITESPACE), CountingPattern(json_scan._STRING_BODY)]
    monkeypatch.setattr(json_scan, "_WHITESPACE", patterns[0])
    monkeypatch.setattr(json_scan, "_STRING_BODY", patterns[1])
    text = long_call(name, num_members)
    chunks = [text[i : i + 3] for i in range(0, len(text), 3)]
    _, _, calls = folded(streamed(chunks, MessageStream(PARSERS[name], None)))
    assert [call.name for call in calls] == ["search"]
    return sum(pattern.num_chars for pattern in patterns)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_streaming_a_call_four_times_as_long_costs_about_four_times_as_much(monkeypatch, name):
    # Re-reading the text so far on each delta would cost about 16 times.
    short, long = scanner_work(monkeypatch, name, 40), scanner_work(monkeypatch, name, 160)
    assert long < 6 * short, (short, long)
