"""A choice's message streamed in any chunking adds up to the parse of its whole
text: same content, reasoning and calls (names, arguments byte for byte)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.tools.calls import ParsedCall
from sluice.tools.message_stream import MessageDelta, MessageStream
from sluice.tools.parsers import (
    named_function_parser,
    parse_hermes,
    parse_llama3_json,
    parse_mistral,
    parse_required,
)
from sluice.tools.reasoning import split_deepseek_r1

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
    "hermes": parse_hermes,
    "llama3_json": parse_llama3_json,
    "mistral": parse_mistral,
    "required": parse_required,
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
    whole = PARSERS[name](text, True)
    _, content, calls = folded(deltas)
    assert content == whole.content
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole.calls]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SAMPLES["hermes"]), st.data())
def test_reasoning_then_calls_in_any_chunking(answer, data):
    text = "<think>\nThe user wants <tool_call> weather.\n</think>\n\n" + answer
    chunks = data.draw(chunkings(text))
    reasoning, content, calls = folded(
        streamed(chunks, MessageStream(parse_hermes, split_deepseek_r1))
    )
    split = split_deepseek_r1(text, True)
    whole = parse_hermes(split.content or "", True)
    assert reasoning == "\nThe user wants <tool_call> weather.\n"
    assert (content, [(c.name, c.arguments) for c in calls]) == (
        whole.content,
        [(c.name, c.arguments) for c in whole.calls],
    )


def test_a_call_goes_out_with_its_id_and_name_then_argument_fragments():
    stream = MessageStream(parse_hermes, None)
    assert stream.push('Hi <tool_call>{"name": "f', False) == MessageDelta(content="Hi")
    first = stream.push('", "arguments": {"a": ', False)
    (call,) = first.tool_calls
    assert (call.index, call.name, call.arguments) == (0, "f", '{"a": ')
    second = stream.push("1}}</tool_call>", True)
    (more,) = second.tool_calls
    assert (more.index, more.id, more.name, more.arguments) == (0, None, None, "1}")
    assert stream.has_tool_calls


def test_parallel_tool_calls_false_keeps_the_first_call_only():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    _, _, calls = folded(streamed([text], MessageStream(parse_hermes, None, max_calls=1)))
    assert [c.name for c in calls] == ["a"]


def test_without_parsers_the_text_is_the_content():
    stream = MessageStream(None, None)
    assert stream.push("<tool_call>{}", False) == MessageDelta(content="<tool_call>{}")
