"""Tool-call parsers: what each format reads, and the prefix promise (a prefix's
parse is a prefix of the whole text's) on well-formed and broken outputs."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sluice.tools.call_lists import MistralParser, RequiredParser, named_function_parser
from sluice.tools.calls import ParsedCall, ParsedText, parse_text
from sluice.tools.parsers import HermesParser, Llama3JsonParser, guess_tool_call_parser

PARSERS = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
    "required": RequiredParser,
    "named": named_function_parser("get_weather"),
}
NAMES = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,9}", fullmatch=True)
JSON_LEAVES = (
    st.none() | st.booleans() | st.integers(-999, 10**9) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)  # fmt: skip
ARGUMENTS = st.dictionaries(
    st.text(max_size=5),
    st.recursive(
        JSON_LEAVES,
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.text(max_size=4), children, max_size=3)
        ),
        max_leaves=6,
    ),
    max_size=3,
)
SEPARATORS = st.sampled_from([(", ", ": "), (",", ":")])
# Content with characters that begin tags, and tags' look-alikes; never a real tag.
CONTENT = st.lists(
    st.sampled_from(["Hi", " there", "é", "😀", "語", "<", "<tool", "<tool_callx", "</tool_call",
                     "[TOOL", "[TOOL_CALLS", "{", "}", ";", "a < b", "\n", "x"]),
    min_size=1, max_size=5,
).map("".join).filter(lambda text: text.strip() == text and text.strip())  # fmt: skip
# Fragments that make broken and ambiguous outputs.
NOISE = st.lists(
    st.sampled_from(['<tool_call>', '</tool_call>', '<tool_call', '{"name": "f"', '"name"', ': ',
                     ', "arguments": ', ', "parameters": ', '{"a": 1}', '{', '}', '[TOOL_CALLS]',
                     '[', ']', ', ', ';', '<|python_tag|>', '"', '\\', ' ', '\n', 'é', '😀',
                     '1', '.', 'e', 'tru', 'x', '"q"', '\\ud83d', '\\udc00', '\\u', '[ARGS]',
                     '[AR', 'get_weather', 'f']),
    max_size=20,
).map("".join)  # fmt: skip


def assert_prefix_promise(parser, text: str) -> ParsedText:
    """Every prefix parsed as unfinished is a prefix of the whole text's final parse."""
    final = parse_text(parser, text, True)
    for cut in range(len(text) + 1):
        partial = parse_text(parser, text[:cut], False)
        assert final.content.startswith(partial.content), (text[:cut], partial, final)
        assert len(partial.calls) <= len(final.calls), (text[:cut], partial, final)
        for early, late in zip(partial.calls, final.calls, strict=False):
            assert early.name == late.name, (text[:cut], partial, final)
            assert late.arguments.startswith(early.arguments), (text[:cut], partial, final)
    return final


@st.composite
def calls(draw, key: str = "arguments"):
    """(call objects as the model writes them, the calls expected from them)."""
    written, expected = [], []
    for _ in range(draw(st.integers(1, 3))):
        name = draw(NAMES)
        arguments = json.dumps(draw(ARGUMENTS), separators=draw(SEPARATORS),
                               ensure_ascii=draw(st.booleans()))  # fmt: skip
        written.append(f'{{"name": {json.dumps(name)}, "{key}": {arguments}}}')
        expected.append(ParsedCall(name, arguments, True))
    return written, expected


def split_at(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]


def streamed(parser, pieces: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """Content and calls (name, arguments) as the pushes' pieces add up."""
    reader = parser()
    content, calls_so_far = "", []
    for index, piece in enumerate(pieces):
        out = reader.push(piece, index == len(pieces) - 1)
        content += out.content
        for call in out.calls:
            if call.name is not None:
                assert call.index == len(calls_so_far), "calls are announced in order, once"
                calls_so_far.append([call.name, ""])
            calls_so_far[call.index][1] += call.arguments
    return content, [(name, arguments) for name, arguments in calls_so_far]


def streamed_whole(parser, text: str) -> tuple[str, list[tuple[str, str]]]:
    whole = parse_text(parser, text, True)
    return whole.content, [(call.name, call.arguments) for call in whole.calls]


# -- what each format reads ---------------------------------------------------


def test_hermes_reads_content_then_calls():
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n'
        '</tool_call>\n<tool_call>\n{"arguments": {}, "name": "now"}\n</tool_call>'
    )
    assert parse_text(HermesParser, text, True) == ParsedText(
        "Let me check.",
        (ParsedCall("get_weather", '{"city": "Zürich"}', True), ParsedCall("now", "{}", True)),
    )


def test_hermes_holds_a_cut_tag_and_a_call_without_its_name():
    assert parse_text(HermesParser, "Sure <tool_ca", False) == ParsedText("Sure")
    assert parse_text(HermesParser, 'Sure <tool_call>{"name": "get_w', False) == ParsedText("Sure")
    assert parse_text(HermesParser, 'Sure <tool_call>{"name": "get_w', True) == ParsedText(
        'Sure <tool_call>{"name": "get_w'
    )


def test_hermes_streams_a_call_once_named_and_its_arguments_as_they_come():
    parsed = parse_text(HermesParser, '<tool_call>{"name": "f", "arguments": {"q": "ab', False)
    assert parsed == ParsedText("", (ParsedCall("f", '{"q": "ab', False),))


def test_hermes_text_that_only_looks_like_a_call_is_content():
    text = "<tool_call> no json </tool_call> and <tool_callx>"
    assert parse_text(HermesParser, text, True) == ParsedText(text)
    unnamed = '<tool_call>{"city": "Paris"}</tool_call>'
    assert parse_text(HermesParser, unnamed, True) == ParsedText(unnamed)


def test_hermes_a_tag_inside_a_json_string_is_text():
    text = '<tool_call>{"name": "echo", "arguments": {"s": "</tool_call><tool_call>"}}</tool_call>'
    assert parse_text(HermesParser, text, True).calls == (
        ParsedCall("echo", '{"s": "</tool_call><tool_call>"}', True),
    )


def test_hermes_a_call_broken_after_its_name_keeps_what_came_before_the_break():
    text = '<tool_call>{"name": "f", "arguments": {"a": 1,}}</tool_call> after'
    assert parse_text(HermesParser, text, True) == ParsedText(
        "after", (ParsedCall("f", '{"a": 1,', False),)
    )


def test_llama3_reads_calls_separated_by_semicolons_or_content():
    text = '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}'
    assert parse_text(Llama3JsonParser, text, True) == ParsedText(
        "", (ParsedCall("a", '{"x": 1}', True), ParsedCall("b", "{}", True))
    )
    assert parse_text(Llama3JsonParser, "The answer is {x}.", True) == ParsedText(
        "The answer is {x}."
    )
    assert parse_text(Llama3JsonParser, '{"answer": 42}', True) == ParsedText('{"answer": 42}')
    assert parse_text(Llama3JsonParser, '{"answer": 4', False) == ParsedText("")


def test_mistral_reads_the_array_after_its_tag():
    text = 'Calling. [TOOL_CALLS] [{"name": "a", "arguments": {"x": [1, 2]}}, {"name": "b"}]'
    assert parse_text(MistralParser, text, True) == ParsedText(
        "Calling.", (ParsedCall("a", '{"x": [1, 2]}', True), ParsedCall("b", "{}", True))
    )
    assert parse_text(MistralParser, "Text [TOOL_CA", False) == ParsedText("Text")


def test_mistral_reads_the_newer_form_of_named_calls_one_after_another():
    text = 'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]now[ARGS]{}'
    assert parse_text(MistralParser, text, True) == ParsedText(
        "Sure.",
        (ParsedCall("get_weather", '{"city": "Paris"}', True), ParsedCall("now", "{}", True)),
    )
    between = '[TOOL_CALLS]a[ARGS]{"x": 1} then [TOOL_CALLS]b.c-d[ARGS] {"y": 2}\nDone.'
    # Whitespace next to a call is trimmed, as in every format (calls.ContentBuilder).
    assert parse_text(MistralParser, between, True) == ParsedText(
        "thenDone.", (ParsedCall("a", '{"x": 1}', True), ParsedCall("b.c-d", '{"y": 2}', True))
    )


def test_mistral_holds_a_name_until_its_args_tag_and_streams_the_arguments():
    assert parse_text(MistralParser, "[TOOL_CALLS]get_wea", False) == ParsedText("")
    assert parse_text(MistralParser, "[TOOL_CALLS]get_weather[AR", False) == ParsedText("")
    assert parse_text(MistralParser, "[TOOL_CALLS]get_weather[AR", True) == ParsedText(
        "[TOOL_CALLS]get_weather[AR"
    )
    cut = parse_text(MistralParser, '[TOOL_CALLS]f[ARGS]{"q": "ab', False)
    assert cut == ParsedText("", (ParsedCall("f", '{"q": "ab', False),))


def test_mistral_a_tag_followed_by_no_name_is_content():
    for text in ("[TOOL_CALLS] hello world", "[TOOL_CALLS]f(x)", "[TOOL_CALLS]f[ARG]{}"):
        assert parse_text(MistralParser, text, True) == ParsedText(text)


def test_mistral_arguments_that_are_no_object_end_the_call_where_they_break():
    parsed = parse_text(MistralParser, "[TOOL_CALLS]f[ARGS]oops", True)
    assert parsed == ParsedText("oops", (ParsedCall("f", "", False),))


def test_required_and_named_read_constrained_json():
    text = '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {"y": "é"}}]'
    assert parse_text(RequiredParser, text, True).calls == (
        ParsedCall("a", '{"x": 1}', True),
        ParsedCall("b", '{"y": "é"}', True),
    )
    named = named_function_parser("get_weather")
    assert parse_text(named, ' {"city": "Oslo"}', True) == ParsedText(
        "", (ParsedCall("get_weather", '{"city": "Oslo"}', True),)
    )
    assert parse_text(named, '{"city": "Os', False).calls[0].arguments == '{"city": "Os'


# Mistral Small 3.2's (and Devstral's) chat template, where it writes calls.
MISTRAL_SMALL_3_2_TOOL_CALLS = """
{%- for tool in message['tool_calls'] %}
    {%- set arguments = tool['function']['arguments'] %}
    {%- if arguments is not string %}
        {%- set arguments = arguments|tojson|safe %}
    {%- elif arguments == '' %}
        {%- set arguments = '{}' %}
    {%- endif %}
    {{- '[TOOL_CALLS]' + tool['function']['name'] + '[ARGS]' + arguments }}
{%- endfor %}
"""


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{% for tool in tools %}<tool_call>{{ tool | tojson }}</tool_call>", "hermes"),
        ("{{ '[AVAILABLE_TOOLS]' }}[TOOL_CALLS]", "mistral"),
        (MISTRAL_SMALL_3_2_TOOL_CALLS, "mistral"),
        ("{{- '<|python_tag|>' + tool_call.name }}", "llama3_json"),
        ("<|im_start|>{{ message['content'] }}", None),
        (None, None),
    ],
)
def test_the_parser_is_guessed_from_the_chat_template(template, expected):
    assert guess_tool_call_parser(template) == expected


# -- the prefix promise, and well-formed outputs read exactly ----------------------


@settings(deadline=None)
@given(calls(), st.data())
def test_hermes_reads_generated_outputs_exactly(drawn, data):
    written, expected = drawn
    maybe_content = st.just("") | CONTENT
    contents = [data.draw(maybe_content) for _ in range(len(written) + 1)]
    text = "".join(
        f"{content}\n<tool_call>\n{call}\n</tool_call>\n"
        for content, call in zip(contents, written, strict=False)
    )
    text += contents[-1]
    final = assert_prefix_promise(HermesParser, text)
    assert final == ParsedText("".join(contents), tuple(expected))


@settings(deadline=None)
@given(calls(key="parameters"), st.booleans())
def test_llama3_reads_generated_outputs_exactly(drawn, with_tag):
    written, expected = drawn
    text = ("<|python_tag|>" if with_tag else "") + "; ".join(written)
    assert assert_prefix_promise(Llama3JsonParser, text) == ParsedText("", tuple(expected))


@settings(deadline=None)
@given(CONTENT, calls())
def test_mistral_reads_generated_outputs_exactly(content, drawn):
    written, expected = drawn
    text = f"{content} [TOOL_CALLS] [{', '.join(written)}]"
    assert assert_prefix_promise(MistralParser, text) == ParsedText(content, tuple(expected))


@settings(deadline=None)
@given(CONTENT, calls(), st.data())
def test_mistral_reads_generated_outputs_of_the_newer_form_exactly_however_streamed(
    content, drawn, data
):
    _, expected = drawn
    text = content + "".join(f"[TOOL_CALLS]{c.name}[ARGS]{c.arguments}" for c in expected)
    assert assert_prefix_promise(MistralParser, text) == ParsedText(content, tuple(expected))
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    assert streamed(MistralParser, split_at(text, cuts)) == streamed_whole(MistralParser, text)
    assert streamed(MistralParser, list(text)) == streamed_whole(MistralParser, text)


@settings(deadline=None)
@given(calls(key="parameters"))
def test_required_reads_generated_outputs_exactly(drawn):
    written, expected = drawn
    text = "[" + ", ".join(written) + "]"
    assert assert_prefix_promise(RequiredParser, text) == ParsedText("", tuple(expected))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(PARSERS)), NOISE)
def test_every_parser_keeps_the_prefix_promise_on_broken_outputs(name, text):
    assert_prefix_promise(PARSERS[name], text)


@given(st.sampled_from(["hermes", "llama3_json", "mistral"]), CONTENT)
def test_plain_text_is_content_unchanged(name, text):
    # The format's own ambiguity: in llama3_json, a leading brace starts a call.
    assume(name != "llama3_json" or not text.startswith("{"))
    assert parse_text(PARSERS[name], text, True) == ParsedText(text)


@pytest.mark.parametrize(
    ("parser", "head", "boundary_token"),
    [
        ("llama3_json", '{"name": "f", "parameters": {"a": "b', '"}}.'),
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"a": "b', '"}}].'),
        ("hermes", '<tool_call>{"name": "f", "arguments": {"a": "b', '"}}</tool_call>.'),
    ],
)
def test_a_push_that_ends_a_call_and_begins_text_gives_them_in_the_texts_order(
    parser, head, boundary_token
):
    reader = PARSERS[parser]()
    reader.push(head, False)
    piece = reader.push(boundary_token + " Done", True)
    assert [type(part).__name__ for part in piece.parts] == ["CallPiece", "str"]
    assert piece.parts[0].arguments == '"}' and piece.parts[1] == ". Done"
