"""Ollama's NDJSON lines and bodies from hand-built choice deltas: one object a
line, the final line's counts equal the tokens sent, the lines concatenate to
the body, tool calls go out whole, and merging deltas changes none of it."""

from __future__ import annotations

import itertools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.apis.ollama.lines import OllamaLines, Route, load_body
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import QueueFullError
from sluice.frontend.deltas import ChoiceDelta
from sluice.frontend.request import GenerationRequest, PromptInput
from sluice.frontend.serving import delivered_event, delivered_fold
from sluice.tools.output_parsing import OutputParsing

HERMES = OutputParsing("hermes")
THINKING = OutputParsing(None, reasoning_parser="deepseek_r1")
ARGUMENTS = '{"city": "Zürich 😀", "nested": {"list": [1, 2.5, null]}}'
CALL = f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGUMENTS}}}\n</tool_call>'
TOOL_OUTPUT = f"Let me check, a < b.\n{CALL}\nDone."
PROMPT_IDS = (5, 6, 7, 8, 9)


def make_request(parsing: OutputParsing | None = None, stream: bool = True) -> GenerationRequest:
    return GenerationRequest(
        kind="chat",
        response_id="chatcmpl-1",
        created=5,
        model_name="tiny:latest",
        prompts=(PromptInput(PROMPT_IDS, "<chat>"),),
        n=1,
        params=SamplingParams(),
        stream=stream,
        output_parsing=parsing,
    )


def tokens_of(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def deltas_of(tokens: list[str], cuts: list[int], finish_reason: str = "stop") -> list[ChoiceDelta]:
    """The tokens (ids 100, 101, ...) merged into deltas at `cuts`, the last finishing."""
    bounds = [0, *cuts, len(tokens)]
    deltas = [
        ChoiceDelta(
            text="".join(tokens[start:stop]),
            token_ids=list(range(100 + start, 100 + stop)),
            token_texts=tokens[start:stop],
            num_prompt_tokens=len(PROMPT_IDS),
        )
        for start, stop in itertools.pairwise(bounds)
    ]
    deltas[-1].finish_reason = finish_reason
    return deltas


class Ticks:
    """A nanosecond clock that moves 10 ns a reading."""

    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        self.now_ns += 10
        return self.now_ns


def stream_lines(
    route: Route, deltas: list[ChoiceDelta], parsing: OutputParsing | None = None
) -> list[dict]:
    lines = OllamaLines(make_request(parsing), route, clock=Ticks())
    raw = [delivered_event(lines, 0, delta) for delta in deltas]
    raw += lines.closing_events()
    body = b"".join(line for line in raw if line is not None)
    assert body.endswith(b"\n") and all(part for part in body.split(b"\n")[:-1])
    return [orjson.loads(line) for line in body.split(b"\n")[:-1]]


def folded_body(
    route: Route, deltas: list[ChoiceDelta], parsing: OutputParsing | None = None
) -> dict:
    lines = OllamaLines(make_request(parsing, stream=False), route, clock=Ticks())
    for delta in deltas:
        delivered_fold(lines, 0, delta)
    return orjson.loads(lines.body())


def test_a_chat_stream_is_done_false_lines_then_one_final_line_with_the_counts():
    tokens = tokens_of("Hello there, how are you?")
    lines = stream_lines("chat", deltas_of(tokens, [2, 5], "length"))
    assert [line["done"] for line in lines] == [False, False, False, True]
    assert all(
        line["model"] == "tiny:latest" and line["created_at"].endswith("Z") for line in lines
    )
    assert "".join(line["message"]["content"] for line in lines) == "Hello there, how are you?"
    final = lines[-1]
    assert final["message"] == {"role": "assistant", "content": ""}
    assert final["done_reason"] == "length"
    assert final["eval_count"] == len(tokens)
    assert final["prompt_eval_count"] == len(PROMPT_IDS)
    durations = ("total_duration", "prompt_eval_duration", "eval_duration", "load_duration")
    assert all(isinstance(final[name], int) and final[name] >= 0 for name in durations)
    assert final["total_duration"] >= final["prompt_eval_duration"] + final["eval_duration"]
    assert "context" not in final


def test_a_generate_stream_carries_response_text_and_the_context_of_prompt_and_answer():
    tokens = tokens_of("one two three")
    deltas = deltas_of(tokens, [1])
    lines = stream_lines("generate", deltas)
    assert "".join(line["response"] for line in lines) == "one two three"
    assert all("message" not in line for line in lines)
    final = lines[-1]
    assert final["context"] == [*PROMPT_IDS, *range(100, 100 + len(tokens))]
    assert final["eval_count"] == len(tokens) and final["done_reason"] == "stop"


@pytest.mark.parametrize("route", ["chat", "generate"])
def test_the_body_is_the_final_line_with_the_whole_answer(route):
    tokens = tokens_of("The whole answer, once.")
    body = folded_body(route, deltas_of(tokens, [3]))
    text = body["message"]["content"] if route == "chat" else body["response"]
    assert text == "The whole answer, once."
    assert body["done"] is True and body["eval_count"] == len(tokens)
    assert body["prompt_eval_count"] == len(PROMPT_IDS)


def test_a_tool_call_goes_out_whole_in_ollamas_shape_on_the_line_that_completes_it():
    lines = stream_lines("chat", deltas_of(tokens_of(TOOL_OUTPUT), [4, 9, 20]), HERMES)
    calls = [call for line in lines for call in line["message"].get("tool_calls", [])]
    assert calls == [
        {"function": {"index": 0, "name": "get_weather", "arguments": orjson.loads(ARGUMENTS)}}
    ]
    content = "".join(line["message"]["content"] for line in lines)
    assert content == "Let me check, a < b.Done."
    body = folded_body("chat", deltas_of(tokens_of(TOOL_OUTPUT), [4]), HERMES)
    assert body["message"]["tool_calls"] == calls and body["message"]["content"] == content


def test_a_call_cut_by_num_predict_keeps_its_complete_arguments():
    cut = '<tool_call>\n{"name": "f", "arguments": {"a": 1, "b": "unfini'
    lines = stream_lines("chat", deltas_of(tokens_of(cut), [5], "length"), HERMES)
    calls = [call for line in lines for call in line["message"].get("tool_calls", [])]
    assert calls == [{"function": {"index": 0, "name": "f", "arguments": {"a": 1}}}]


def test_reasoning_goes_to_thinking_and_the_answer_to_content():
    text = "I should greet.</think>Hello!"
    lines = stream_lines("chat", deltas_of(tokens_of(text, 2), [3, 8]), THINKING)
    assert "".join(line["message"].get("thinking", "") for line in lines) == "I should greet."
    assert "".join(line["message"]["content"] for line in lines) == "Hello!"
    generate = stream_lines("generate", deltas_of(tokens_of(text, 2), [3, 8]), THINKING)
    assert "".join(line.get("thinking", "") for line in generate) == "I should greet."
    body = folded_body("chat", deltas_of(tokens_of(text, 2), []), THINKING)
    assert (
        body["message"]["thinking"] == "I should greet." and body["message"]["content"] == "Hello!"
    )


def test_a_delta_whose_text_is_all_held_back_makes_no_line():
    lines = OllamaLines(make_request(HERMES), "chat")
    held = ChoiceDelta(text="<tool_", token_ids=[1], token_texts=["<tool_"])
    assert lines.delta_event(0, held) is None


def test_an_error_after_the_first_line_is_one_error_line():
    lines = OllamaLines(make_request(), "chat")
    (line,) = lines.error_events(QueueFullError("the queue is full"))
    assert orjson.loads(line) == {"error": "the queue is full"} and line.endswith(b"\n")


def test_the_load_answer_says_done_reason_load():
    assert load_body("m", "chat")["message"] == {"role": "assistant", "content": ""}
    body = load_body("m", "generate")
    assert body["done"] is True and body["done_reason"] == "load" and body["response"] == ""


@settings(max_examples=60, deadline=None)
@given(
    text=st.sampled_from([TOOL_OUTPUT, "plain words that go on", "a</think>b"]),
    size=st.integers(1, 7),
    data=st.data(),
)
def test_however_deltas_merge_the_lines_add_up_to_the_body(text, size, data):
    tokens = tokens_of(text, size)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(tokens) - 1)), max_size=6)))
    cuts = [cut for cut in cuts if cut < len(tokens)]
    parsing = HERMES if "tool_call" in text else THINKING if "think" in text else None
    lines = stream_lines("chat", deltas_of(tokens, cuts), parsing)
    body = folded_body("chat", deltas_of(tokens, []), parsing)
    message = body["message"]
    assert "".join(line["message"]["content"] for line in lines) == message["content"]
    thinking = "".join(line["message"].get("thinking", "") for line in lines)
    assert thinking == message.get("thinking", "")
    calls = [call for line in lines for call in line["message"].get("tool_calls", [])]
    assert calls == message.get("tool_calls", [])
    assert lines[-1]["eval_count"] == body["eval_count"] == len(tokens)
    assert len(lines) <= len(cuts) + 2
