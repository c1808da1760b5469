"""The Responses API's events and body from hand-built choice deltas: items
in order, deltas that add up, one terminal event, the same items however a
lagging reader's deltas were merged."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.apis.responses.events import ResponsesEvents
from sluice.engine.sampling_params import SamplingParams
from sluice.frontend.deltas import ChoiceDelta, SampledLogprob
from sluice.frontend.logprob_format import TokenStrings
from sluice.frontend.request import GenerationRequest, PromptInput, ResponsesSettings
from sluice.frontend.serving import delivered_event, delivered_fold
from sluice.testing import FakeTokenizer
from sluice.testing.responses_contract import check_responses_stream, parse_events
from sluice.tools.output_parsing import OutputParsing

TOKENIZER = FakeTokenizer()
T = TOKENIZER.token_id
ECHOED = {"instructions": None, "tools": [], "tool_choice": "auto"}


def make_request(
    parsing: OutputParsing | None = None, logprobs: int | None = None, **overrides
) -> GenerationRequest:
    fields = {
        "kind": "responses",
        "response_id": "resp_1",
        "created": 5,
        "model_name": "tiny",
        "prompts": (PromptInput((5, 6, 7, 8), "<chat>"),),
        "n": 1,
        "params": SamplingParams(logprobs=logprobs),
        "stream": True,
        "output_parsing": parsing,
        "responses": ResponsesSettings(orjson.dumps(ECHOED), frozenset({"apply_patch"})),
    }
    return GenerationRequest(**(fields | overrides))


def delta(*pieces: str, finish: str | None = None, with_logprobs: bool = False) -> ChoiceDelta:
    return ChoiceDelta(
        text="".join(pieces),
        token_ids=[T("a")] * len(pieces),
        token_texts=list(pieces),
        logprobs=(
            [SampledLogprob(-(i + 1) / 8, (T("a"),), (-0.25,)) for i in range(len(pieces))]
            if with_logprobs
            else None
        ),
        finish_reason=finish,
    )


def run(request: GenerationRequest, deltas: list[ChoiceDelta]) -> tuple[list[dict], dict]:
    """The streamed events (checked) and the non-streamed body of `deltas`."""
    streamed = ResponsesEvents(request, TokenStrings(TOKENIZER))
    folded = ResponsesEvents(request, TokenStrings(TOKENIZER))
    body = b"".join(streamed.opening_events())
    for item in deltas:
        body += delivered_event(streamed, 0, item) or b""
        delivered_fold(folded, 0, item)
    events = parse_events(body + b"".join(streamed.closing_events()))
    check_responses_stream(events)
    return events, orjson.loads(folded.body())


def without_ids(output: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in output]


def test_plain_text_is_one_message_item_and_the_stream_ends_completed():
    events, body = run(make_request(), [delta("Hel", "lo"), delta(" you", finish="stop")])
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    final = events[-1]["response"]
    assert without_ids(final["output"]) == without_ids(body["output"])
    assert body["status"] == "completed" and body["output"][0]["content"][0]["text"] == "Hello you"
    assert body["usage"]["input_tokens"] == 4 and body["usage"]["output_tokens"] == 3
    assert body["tool_choice"] == "auto"  # the request's fields echo


def test_a_length_finish_is_incomplete_with_its_reason_and_an_incomplete_item():
    events, body = run(make_request(), [delta("a", "b", finish="length")])
    assert events[-1]["type"] == "response.incomplete"
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"


def test_reasoning_then_a_call_are_two_items_whose_deltas_add_up():
    parsing = OutputParsing("hermes", reasoning_parser="deepseek_r1")
    text = ["<think>", "hm", "</think>", "<tool_call>", '{"name": "f", ', '"arguments": {"a": 1}}',
            "</tool_call>"]  # fmt: skip
    events, body = run(make_request(parsing), [delta(*text[:3]), delta(*text[3:], finish="stop")])
    kinds = [item["type"] for item in body["output"]]
    assert kinds == ["reasoning", "function_call"]
    assert body["output"][0]["content"] == [{"type": "reasoning_text", "text": "hm"}]
    assert body["output"][1]["name"] == "f" and body["output"][1]["arguments"] == '{"a": 1}'
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    assert any(e["type"] == "response.function_call_arguments.done" for e in events)


def test_a_custom_tools_call_is_one_item_with_its_decoded_input():
    text = ['<tool_call>{"name": "apply_patch", ', '"arguments": {"input": "*** Begin\\n"}}',
            "</tool_call>"]  # fmt: skip
    events, body = run(make_request(OutputParsing("hermes")), [delta(*text, finish="stop")])
    (item,) = body["output"]
    assert item["type"] == "custom_tool_call" and item["input"] == "*** Begin\n"
    deltas = [e for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    assert [e["delta"] for e in deltas] == ["*** Begin\n"]


def test_logprobs_ride_on_the_text_deltas_and_add_up_to_the_item():
    request = make_request(logprobs=0)
    deltas = [delta("a", "b", with_logprobs=True), delta("c", finish="stop", with_logprobs=True)]
    events, body = run(request, deltas)
    sent = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [len(e["logprobs"]) for e in sent] == [2, 1]
    (part,) = body["output"][0]["content"]
    assert [entry["token"] for entry in part["logprobs"]] == ["a", "b", "c"]


def test_an_error_after_the_start_ends_with_an_error_event_and_failed():
    events = ResponsesEvents(make_request(), TokenStrings(TOKENIZER))
    body = b"".join(events.opening_events()) + (events.delta_event(0, delta("x")) or b"")
    body += b"".join(events.error_events(RuntimeError("boom")))
    parsed = parse_events(body)
    check_responses_stream(parsed)
    assert [e["type"] for e in parsed[-2:]] == ["error", "response.failed"]
    assert parsed[-1]["response"]["status"] == "failed"
    assert parsed[-1]["response"]["output"][0]["status"] == "incomplete"


TOKENS = ["<think>", "a", "b", "</think>", "Sure", ". ", "<tool_call>", '{"name": "f", ',
          '"arguments": {"x": ', "1}}", "</tool_call>", "\n", "done"]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(cuts=st.sets(st.integers(min_value=1, max_value=len(TOKENS) - 1)))
def test_merged_deltas_give_the_same_items_as_one_token_a_step(cuts):
    parsing = OutputParsing("hermes", reasoning_parser="deepseek_r1")
    bounds = [0, *sorted(cuts), len(TOKENS)]
    merged = [delta(*TOKENS[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    merged[-1].finish_reason = "stop"
    steps = [delta(token) for token in TOKENS]
    steps[-1].finish_reason = "stop"
    _, merged_body = run(make_request(parsing), merged)
    _, steps_body = run(make_request(parsing), steps)
    assert without_ids(merged_body["output"]) == without_ids(steps_body["output"])
    assert [item["type"] for item in steps_body["output"]] == [
        "reasoning", "message", "function_call", "message",
    ]  # fmt: skip
