"""The harmony reader (gpt-oss): analysis as reasoning, calls to
`functions.NAME` as tool calls, final and preambles as content; any chunking
of a text gives the parse of the whole text, and every prefix's parse is a
prefix of it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.tools.calls import CallPiece
from sluice.tools.harmony import (
    HarmonyMessage,
    HarmonyReader,
    is_harmony_template,
    parse_harmony,
)

# Outputs as gpt-oss writes them after its prompt's `<|start|>assistant`.
WEATHER_CALL = (
    "<|channel|>analysis<|message|>User asks weather in SF. Use get_weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"location":"San Francisco, CA"}<|call|>'
)
ANSWER = (
    "<|channel|>analysis<|message|>Simple: 2+2=4.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>2 + 2 = **4**.<|return|>"
)
PREAMBLE_AND_TWO_CALLS = (
    "<|channel|>analysis<|message|>Two lookups.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Checking both cities.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{"q": "a<b"}<|call|>'
    '<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{"q": "|>"}<|call|>'
)
CUT_BY_MAX_TOKENS = "<|channel|>analysis<|message|>Thinking about <|end of"
OUTPUTS = [WEATHER_CALL, ANSWER, PREAMBLE_AND_TWO_CALLS, CUT_BY_MAX_TOKENS, "no markup at all"]


def test_a_call_after_analysis():
    assert parse_harmony(WEATHER_CALL) == HarmonyMessage(
        "User asks weather in SF. Use get_weather.",
        "",
        (("get_weather", '{"location":"San Francisco, CA"}'),),
    )


def test_an_answer_after_analysis():
    assert parse_harmony(ANSWER) == HarmonyMessage("Simple: 2+2=4.", "2 + 2 = **4**.", ())


def test_a_preamble_is_content_and_a_recipient_may_stand_before_the_channel():
    parsed = parse_harmony(PREAMBLE_AND_TWO_CALLS)
    assert parsed.content == "Checking both cities."
    assert parsed.calls == (("lookup", '{"q": "a<b"}'), ("lookup", '{"q": "|>"}'))


def test_a_text_cut_in_a_message_keeps_what_was_written():
    assert parse_harmony(CUT_BY_MAX_TOKENS).reasoning == "Thinking about <|end of"


def test_a_cut_header_is_dropped_and_loose_text_is_content():
    assert parse_harmony("<|channel|>final<|message|>Hi<|end|><|start|>assistant<|chan") == (
        HarmonyMessage("", "Hi", ())
    )
    assert parse_harmony("hello") == HarmonyMessage("", "hello", ())


def test_without_calls_read_a_calls_body_is_content():
    assert parse_harmony(WEATHER_CALL, reads_calls=False).content == (
        '{"location":"San Francisco, CA"}'
    )


def test_harmony_templates_are_known_by_their_tokens():
    assert is_harmony_template("<|start|>system<|message|>{{ x }}<|channel|>")
    assert not is_harmony_template("<|im_start|>{{ x }}") and not is_harmony_template(None)


def streamed(text: str, cuts: list[int], reads_calls: bool = True) -> HarmonyMessage:
    """The pieces of a chunked read, put together (a call's first piece names it)."""
    reader = HarmonyReader(reads_calls)
    bounds = [0, *sorted(set(cuts)), len(text)]
    pieces = [reader.push(text[a:b], False) for a, b in zip(bounds, bounds[1:], strict=False)]
    pieces.append(reader.push("", True))
    reasoning, content, calls = "", "", []
    for piece in pieces:
        reasoning += piece.reasoning
        for part in piece.parts:
            if isinstance(part, str):
                content += part
            elif part.name is not None:
                assert part.index == len(calls), "calls are named in order, once"
                calls.append([part.name, part.arguments])
            else:
                calls[part.index][1] += part.arguments
    return HarmonyMessage(reasoning, content, tuple((n, a) for n, a in calls))


# Random harmony outputs: messages of any channel, recipients, bodies with
# marker-like text, and a possibly cut end.
BODY = st.lists(st.sampled_from([*'ab <|>{}"\n', "<|end", "|>", "<|", "<|start"]), max_size=12).map(
    "".join
)
HEADER = st.sampled_from([
    "<|channel|>analysis", "<|channel|>final", "<|channel|>commentary",
    "<|channel|>commentary to=functions.f <|constrain|>json", " to=functions.g<|channel|>commentary json",
])  # fmt: skip
MESSAGES = st.lists(
    st.tuples(HEADER, BODY, st.sampled_from(["<|end|>", "<|call|>", "<|return|>"])), max_size=4
)


@st.composite
def harmony_texts(draw) -> str:
    text = ""
    for index, (header, body, end) in enumerate(draw(MESSAGES)):
        opening = "" if index == 0 and draw(st.booleans()) else "<|start|>assistant"
        text += f"{opening}{header}<|message|>{body}{end}"
    return text[: draw(st.integers(0, len(text)))] if draw(st.booleans()) else text


@settings(max_examples=400, deadline=None)
@given(
    text=st.sampled_from(OUTPUTS) | harmony_texts(),
    cuts=st.lists(st.integers(0, 400), max_size=12),
    reads_calls=st.booleans(),
)
def test_any_chunking_gives_the_whole_texts_parse(text, cuts, reads_calls):
    cuts = [cut % (len(text) + 1) for cut in cuts]
    assert streamed(text, cuts, reads_calls) == parse_harmony(text, reads_calls)


@settings(max_examples=300, deadline=None)
@given(text=st.sampled_from(OUTPUTS) | harmony_texts(), cut=st.integers(0, 400))
def test_a_prefix_parses_to_a_prefix_of_the_whole(text, cut):
    prefix = text[: cut % (len(text) + 1)]
    reader = HarmonyReader()
    piece = reader.push(prefix, False)
    whole = parse_harmony(text)
    reasoning = piece.reasoning
    content = "".join(part for part in piece.parts if isinstance(part, str))
    calls = [part for part in piece.parts if isinstance(part, CallPiece)]
    assert whole.reasoning.startswith(reasoning)
    assert whole.content.startswith(content)
    for call in calls:
        if call.name is not None:
            name, arguments = whole.calls[call.index]
            assert call.name == name and arguments.startswith(call.arguments)


@pytest.mark.parametrize("text", OUTPUTS)
def test_one_character_at_a_time_is_the_whole(text):
    assert streamed(text, list(range(len(text)))) == parse_harmony(text)
