"""Single tokens across every boundary of a parsed output, through every
projection that parses (chat, Responses, Messages; completions read no tools),
streamed and folded, however the tokens are coalesced into deltas.

A model's vocabulary has tokens like `"}}.`, `"}},`, `"}}].` and
`</think>\\n\\n`: one token ends a call (or the reasoning) and begins what
follows. Outputs are written per format (every tool-call parser, the forced
`required` list, with and without a reasoning parser) as a sequence of known
parts; the tokens are cut at random with every boundary (text->call,
call->text, call->call, reasoning->text, reasoning->call) maybe inside one
token (gpt-oss's harmony messages likewise); the deltas merge tokens at
random, as a lagging reader's do. Each
projection must give the written parts, in order, streamed and folded alike.
Random fragments (broken calls, cut tags) must never fail a projection.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.apis.chat.chunks import ChatChunks
from sluice.apis.messages.events import MessagesEvents
from sluice.apis.responses.events import ResponsesEvents
from sluice.engine.sampling_params import SamplingParams
from sluice.frontend.deltas import ChoiceDelta, SampledLogprob
from sluice.frontend.logprob_format import TokenStrings
from sluice.frontend.request import GenerationRequest, PromptInput, ResponsesSettings
from sluice.frontend.serving import delivered_event, delivered_fold
from sluice.testing import FakeTokenizer
from sluice.testing.messages_stream import read_message_stream
from sluice.testing.responses_contract import check_responses_stream, parse_events
from sluice.tools.harmony import HARMONY
from sluice.tools.output_parsing import REQUIRED_FORMAT, OutputParsing
from sluice.tools.parsers import TOOL_CALL_PARSERS
from sluice.tools.reasoning import REASONING_PARSERS

STRINGS = TokenStrings(FakeTokenizer())
FORMATS = (*TOOL_CALL_PARSERS, "mistral_named", REQUIRED_FORMAT)
NAMES = st.sampled_from(["get_weather", "f", "now_2"])
ARGUMENTS = st.sampled_from(['{"city": "Paris"}', "{}", '{"a": [1, {"b": "}]"}], "c": "é😀"}',
                             '{"q":"\\"x\\""}', '{"n": 1.5e3, "t": true}'])  # fmt: skip
# Content that starts and ends without whitespace (trimmed next to calls) and
# never with "{" or ";" (which continue a llama3_json call list).
TEXTS = st.sampled_from(["Sure.", ". Done", ", then", "a < b", "é😀語", "x", "[1] ok", "]."])
REASONING = st.sampled_from(["hm", "weather, so a call", " spaced ", "a<b"])
# Whitespace a format drops between parts.
GAPS = st.sampled_from(["", "\n", " "])
# Fragments of broken and ambiguous outputs.
NOISE = st.lists(
    st.sampled_from(['<tool_call>', '</tool_call>', '{"name": "f"', ', "arguments": ', '"}}.',
                     ', "parameters": ', '{"a": 1}', '{', '}', '[TOOL_CALLS]', '[ARGS]', '[', ']',
                     ', ', ';', '<|python_tag|>', '"', '\\', ' ', '\n', 'é', '😀', '.', 'x',
                     '<think>', '</think>', '\\ud83d', 'f', '"}},', '"}}].']),
    max_size=24,
).map("".join)  # fmt: skip


@dataclass(slots=True)
class Output:
    """A model's output written part by part, with where the parts meet."""

    text: str = ""
    # ("reasoning", text) | ("text", text) | ("call", name, arguments), in order.
    parts: list[tuple] = field(default_factory=list)
    # Offsets where one part ends or the next begins.
    boundaries: list[int] = field(default_factory=list)

    def write(self, text: str, part: tuple | None = None) -> None:
        self.boundaries.append(len(self.text))
        self.text += text
        if part is not None:
            self.parts.append(part)
        self.boundaries.append(len(self.text))


def call_object(name: str, arguments: str, key: str = "arguments") -> str:
    return f'{{"name": {json.dumps(name)}, "{key}": {arguments}}}'


@st.composite
def part_kinds(draw, min_calls: int = 0) -> list[str]:
    """Texts and calls in some order, no two texts in a row."""
    kinds = draw(st.lists(st.sampled_from(["text", "call"]), min_size=1, max_size=5))
    kinds = [kind for i, kind in enumerate(kinds) if not (kind == "text" == kinds[i - 1] and i)]
    return kinds if kinds.count("call") >= min_calls else [*kinds, "call"]


@st.composite
def outputs(draw, tool_format: str, reasoning: bool) -> Output:
    out = Output()
    if reasoning:
        text = draw(REASONING)
        out.write(f"<think>{text}</think>", ("reasoning", text))
        out.write(draw(GAPS))
    write_body = {"hermes": hermes, "llama3_json": llama3_json, "mistral": mistral_list,
                  "mistral_named": mistral_named, REQUIRED_FORMAT: required}  # fmt: skip
    draw(write_body[tool_format](out))
    return out


@st.composite
def hermes(draw, out: Output) -> None:
    for index, kind in enumerate(draw(part_kinds())):
        out.write(draw(GAPS) if index else "")
        if kind == "text":
            text = draw(TEXTS)
            out.write(text, ("text", text))
        else:
            name, arguments, gap = draw(NAMES), draw(ARGUMENTS), draw(GAPS)
            body = f"<tool_call>{gap}{call_object(name, arguments)}{gap}</tool_call>"
            out.write(body, ("call", name, arguments))


@st.composite
def llama3_json(draw, out: Output) -> None:
    calls = draw(st.lists(st.tuples(NAMES, ARGUMENTS), max_size=3))
    if calls and draw(st.booleans()):
        out.write("<|python_tag|>")
    for index, (name, arguments) in enumerate(calls):
        if index:
            out.write(draw(st.sampled_from([";", "; ", ";\n"])))
        out.write(call_object(name, arguments, "parameters"), ("call", name, arguments))
    if not calls or draw(st.booleans()):
        out.write(draw(GAPS) if calls else "")
        text = draw(TEXTS)
        out.write(text, ("text", text))


@st.composite
def mistral_list(draw, out: Output) -> None:
    if draw(st.booleans()):
        text = draw(TEXTS)
        out.write(text, ("text", text))
        out.write(draw(GAPS))
    calls = draw(st.lists(st.tuples(NAMES, ARGUMENTS), min_size=1, max_size=3))
    is_array = len(calls) > 1 or draw(st.booleans())
    out.write("[TOOL_CALLS][" if is_array else "[TOOL_CALLS]")
    for index, (name, arguments) in enumerate(calls):
        out.write(", " if index else "")
        out.write(call_object(name, arguments), ("call", name, arguments))
    out.write("]" if is_array else "")
    if draw(st.booleans()):
        out.write(draw(GAPS))
        text = draw(TEXTS)
        out.write(text, ("text", text))


@st.composite
def mistral_named(draw, out: Output) -> None:
    for index, kind in enumerate(draw(part_kinds())):
        out.write(draw(GAPS) if index else "")
        if kind == "text":
            text = draw(TEXTS)
            out.write(text, ("text", text))
        else:
            name, arguments = draw(NAMES), draw(ARGUMENTS)
            out.write(f"[TOOL_CALLS]{name}[ARGS]{arguments}", ("call", name, arguments))


@st.composite
def required(draw, out: Output) -> None:
    calls = draw(st.lists(st.tuples(NAMES, ARGUMENTS), min_size=1, max_size=3))
    out.write("[")
    for index, (name, arguments) in enumerate(calls):
        out.write(draw(st.sampled_from([",", ", "])) if index else "")
        out.write(call_object(name, arguments, "parameters"), ("call", name, arguments))
    out.write("]")


def parsing_of(
    tool_format: str, reasoning_parser: str | None, max_calls: int | None = None
) -> OutputParsing:
    name = "mistral" if tool_format == "mistral_named" else tool_format
    return OutputParsing(name, reasoning_parser=reasoning_parser, max_calls=max_calls)


def kept_parts(parts: list[tuple], max_calls: int | None) -> list[tuple]:
    """The parts a client gets: calls past `max_calls` (parallel_tool_calls
    false) are not read, and the texts around one become one."""
    kept: list[tuple] = []
    num_calls = 0
    for part in parts:
        if part[0] == "call":
            num_calls += 1
            if max_calls is not None and num_calls > max_calls:
                continue
        if part[0] == "text" and kept and kept[-1][0] == "text":
            kept[-1] = ("text", kept[-1][1] + part[1])
        else:
            kept.append(part)
    return kept


# -- tokens and deltas -----------------------------------------------------------


def tokens_of(draw, text: str, boundaries: list[int]) -> list[str]:
    """`text` cut into tokens of 1-8 characters, each boundary maybe inside a
    token reaching up to 16 characters before it and 4 after."""
    cuts, position = set(), 0
    while position < len(text):
        position += draw(st.integers(1, 8))
        cuts.add(position)
    for boundary in boundaries:
        if draw(st.booleans()):
            before, after = draw(st.integers(0, 16)), draw(st.integers(0, 4))
            cuts -= set(range(boundary - before, boundary + after + 1))
    bounds = [0, *sorted(cut for cut in cuts if 0 < cut < len(text)), len(text)]
    return [text[start:stop] for start, stop in itertools.pairwise(bounds)]


def deltas_of(draw, tokens: list[str]) -> list[ChoiceDelta]:
    """The tokens merged into deltas at random (a lagging reader's), the last finishing."""
    cuts = draw(st.sets(st.integers(1, max(1, len(tokens) - 1)), max_size=len(tokens)))
    bounds = [0, *sorted(cut for cut in cuts if cut < len(tokens)), len(tokens)]
    deltas = []
    for start, stop in itertools.pairwise(bounds):
        pieces = tokens[start:stop]
        logprobs = [
            SampledLogprob(-(start + i + 1) / 64, (1,), (-0.5,)) for i in range(len(pieces))
        ]
        deltas.append(ChoiceDelta("".join(pieces), [300] * len(pieces), pieces, logprobs,
                                  num_prompt_tokens=4))  # fmt: skip
    deltas[-1].finish_reason = "stop"
    return deltas


def make_request(kind: str, parsing: OutputParsing, stream: bool) -> GenerationRequest:
    responses = None
    if kind == "responses":
        responses = ResponsesSettings(orjson.dumps({"tools": []}))
    return GenerationRequest(kind=kind, response_id="id_1", created=5, model_name="tiny",  # type: ignore[arg-type]
                             prompts=(PromptInput((5, 6, 7, 8), "<chat>"),), n=1,
                             params=SamplingParams(logprobs=0), stream=stream,
                             output_parsing=parsing, responses=responses)  # fmt: skip


# -- each projection, streamed and folded ---------------------------------------


def streamed_bytes(chunks, deltas: list[ChoiceDelta]) -> bytes:
    written = list(chunks.opening_events())
    written += [delivered_event(chunks, 0, delta) or b"" for delta in deltas]
    return b"".join(written + chunks.closing_events())


def folded_body(chunks, deltas: list[ChoiceDelta]) -> dict:
    for delta in deltas:
        delivered_fold(chunks, 0, delta)
    return orjson.loads(chunks.body())


def responses_parts(parsing, stream_deltas, fold_deltas) -> tuple[list, list]:
    def parts(output: list[dict]) -> list[tuple]:
        read = {"reasoning": lambda i: ("reasoning", i["content"][0]["text"]),
                "message": lambda i: ("text", i["content"][0]["text"]),
                "function_call": lambda i: ("call", i["name"], i["arguments"])}  # fmt: skip
        return [read[item["type"]](item) for item in output]

    streamed = ResponsesEvents(make_request("responses", parsing, True), STRINGS)
    events = parse_events(streamed_bytes(streamed, stream_deltas))
    assert events[-1]["type"] == "response.completed", events[-1]
    final = check_responses_stream(events)
    body = folded_body(ResponsesEvents(make_request("responses", parsing, False), STRINGS),
                       fold_deltas)  # fmt: skip
    assert body["status"] == "completed", body
    return parts(final["output"]), parts(body["output"])


def messages_parts(parsing, stream_deltas, fold_deltas) -> tuple[list, list]:
    def parts(content: list[dict]) -> list[tuple]:
        read = {"thinking": lambda b: ("reasoning", b["thinking"]),
                "text": lambda b: ("text", b["text"]),
                "tool_use": lambda b: ("call", b["name"], b["input"])}  # fmt: skip
        return [read[block["type"]](block) for block in content]

    streamed = MessagesEvents(make_request("messages", parsing, True), STRINGS)
    message = read_message_stream(streamed_bytes(streamed, stream_deltas)).message
    body = folded_body(MessagesEvents(make_request("messages", parsing, False), STRINGS),
                       fold_deltas)  # fmt: skip
    return parts(message["content"]), parts(body["content"])


def chat_messages(parsing, stream_deltas, fold_deltas) -> tuple[dict, dict]:
    """The message a client accumulates from the stream, and the body's."""
    raw = streamed_bytes(ChatChunks(make_request("chat", parsing, True), STRINGS), stream_deltas)
    reasoning, content, calls = "", "", []
    for line in raw.decode().split("\n\n"):
        if not line.startswith("data: {"):
            continue
        delta = json.loads(line[len("data: ") :])["choices"][0]["delta"]
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
        for call in delta.get("tool_calls", []):
            if "id" in call:
                calls.append([call["function"]["name"], ""])
            calls[call["index"]][1] += call["function"]["arguments"]
    body = folded_body(ChatChunks(make_request("chat", parsing, False), STRINGS), fold_deltas)
    message = body["choices"][0]["message"]
    folded_calls = [[c["function"]["name"], c["function"]["arguments"]]
                    for c in message.get("tool_calls", [])]  # fmt: skip
    streamed = {"reasoning": reasoning, "content": content, "calls": calls}
    folded = {"reasoning": message.get("reasoning_content") or "",
              "content": message["content"] or "", "calls": folded_calls}  # fmt: skip
    return streamed, folded


def chat_expected(parts: list[tuple]) -> dict:
    return {
        "reasoning": "".join(p[1] for p in parts if p[0] == "reasoning"),
        "content": "".join(p[1] for p in parts if p[0] == "text"),
        "calls": [[p[1], p[2]] for p in parts if p[0] == "call"],
    }


# -- the properties --------------------------------------------------------------


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tool_format=st.sampled_from(FORMATS),
       reasoning_parser=st.sampled_from([None, *REASONING_PARSERS]),
       max_calls=st.sampled_from([None, 1]), data=st.data())  # fmt: skip
def test_tokens_across_boundaries_give_the_written_parts_in_every_projection(
    tool_format, reasoning_parser, max_calls, data
):
    output = data.draw(outputs(tool_format, reasoning=reasoning_parser is not None))
    tokens = tokens_of(data.draw, output.text, output.boundaries)
    stream_deltas, fold_deltas = deltas_of(data.draw, tokens), deltas_of(data.draw, tokens)
    parsing = parsing_of(tool_format, reasoning_parser, max_calls)
    expected = kept_parts(output.parts, max_calls)

    assert responses_parts(parsing, stream_deltas, fold_deltas) == (expected, expected)
    as_input = [(*p[:2], json.loads(p[2])) if p[0] == "call" else p for p in expected]
    assert messages_parts(parsing, stream_deltas, fold_deltas) == (as_input, as_input)
    assert chat_messages(parsing, stream_deltas, fold_deltas) == (
        chat_expected(expected),
        chat_expected(expected),
    )


@st.composite
def harmony_outputs(draw) -> Output:
    """gpt-oss's harmony: maybe an analysis message, then final messages
    (or preambles) and commentary calls, each after `<|start|>assistant`."""
    out = Output()
    opening = ""
    if draw(st.booleans()):
        text = draw(REASONING)
        out.write("<|channel|>analysis<|message|>")
        out.write(text, ("reasoning", text))
        out.write("<|end|>")
        opening = "<|start|>assistant"
    for kind in draw(part_kinds()):
        if kind == "text":
            text, channel = draw(TEXTS), draw(st.sampled_from(["final", "commentary"]))
            out.write(f"{opening}<|channel|>{channel}<|message|>")
            out.write(text, ("text", text))
            out.write(draw(st.sampled_from(["<|end|>", "<|return|>"])))
        else:
            name, arguments = draw(NAMES), draw(ARGUMENTS)
            header = f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
            out.write(opening + header)
            out.write(arguments, ("call", name, arguments))
            out.write("<|call|>")
        opening = "<|start|>assistant"
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(max_calls=st.sampled_from([None, 1]), data=st.data())
def test_harmony_tokens_across_boundaries_give_the_written_parts_in_every_projection(
    max_calls, data
):
    output = data.draw(harmony_outputs())
    tokens = tokens_of(data.draw, output.text, output.boundaries)
    stream_deltas, fold_deltas = deltas_of(data.draw, tokens), deltas_of(data.draw, tokens)
    parsing = OutputParsing(HARMONY, reasoning_parser=HARMONY, max_calls=max_calls)
    expected = kept_parts(output.parts, max_calls)

    assert responses_parts(parsing, stream_deltas, fold_deltas) == (expected, expected)
    as_input = [(*p[:2], json.loads(p[2])) if p[0] == "call" else p for p in expected]
    assert messages_parts(parsing, stream_deltas, fold_deltas) == (as_input, as_input)
    assert chat_messages(parsing, stream_deltas, fold_deltas) == (
        chat_expected(expected),
        chat_expected(expected),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tool_format=st.sampled_from(FORMATS),
       reasoning_parser=st.sampled_from([None, *REASONING_PARSERS]), text=NOISE,
       data=st.data())  # fmt: skip
def test_broken_outputs_never_fail_a_projection_and_stream_as_they_fold(
    tool_format, reasoning_parser, text, data
):
    tokens = tokens_of(data.draw, text or "x", [])
    stream_deltas, fold_deltas = deltas_of(data.draw, tokens), deltas_of(data.draw, tokens)
    parsing = parsing_of(tool_format, reasoning_parser)
    streamed, folded = responses_parts(parsing, stream_deltas, fold_deltas)
    assert streamed == folded
    streamed, folded = messages_parts(parsing, stream_deltas, fold_deltas)
    assert streamed == folded
    streamed, folded = chat_messages(parsing, stream_deltas, fold_deltas)
    assert streamed == folded
