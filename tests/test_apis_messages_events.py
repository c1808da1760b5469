"""Anthropic Messages events and bodies from hand-built choice deltas: blocks in
order, no empty delta, the same message however the deltas were merged."""

from __future__ import annotations

import itertools

import jiter
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.apis.messages.events import MessagesEvents
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import InvalidRequestError, QueueFullError
from sluice.frontend.deltas import ChoiceDelta
from sluice.frontend.logprob_format import TokenStrings
from sluice.frontend.request import GenerationRequest, PromptInput
from sluice.frontend.serving import delivered_event, delivered_fold
from sluice.testing import FakeTokenizer
from sluice.testing.messages_stream import parse_events, read_message_stream
from sluice.tools.output_parsing import NAMED_FORMAT, OutputParsing

STRINGS = TokenStrings(FakeTokenizer())
HERMES = OutputParsing("hermes")
THINKING_HERMES = OutputParsing("hermes", reasoning_parser="deepseek_r1")
ARGUMENTS = '{"city": "Zürich 😀", "nested": {"list": [1, 2.5, null]}}'
CALL = f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGUMENTS}}}\n</tool_call>'
TOOL_OUTPUT = f"Let me check, a < b.\n{CALL}\nDone."


def make_request(parsing: OutputParsing | None = None) -> GenerationRequest:
    return GenerationRequest(
        kind="messages",
        response_id="msg_1",
        created=5,
        model_name="tiny",
        prompts=(PromptInput((5, 6, 7, 8, 9), "<chat>"),),
        n=1,
        params=SamplingParams(),
        stream=True,
        output_parsing=parsing,
    )


def tokens_of(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def deltas_of(tokens: list[str], cuts: list[int], **finish) -> list[ChoiceDelta]:
    """The tokens merged into deltas at `cuts` (token positions), the last finishing."""
    bounds = [0, *cuts, len(tokens)]
    deltas = [
        ChoiceDelta(
            text="".join(tokens[start:stop]),
            token_ids=[1] * (stop - start),
            token_texts=tokens[start:stop],
            num_prompt_tokens=5,
            num_cached_tokens=2,
        )
        for start, stop in itertools.pairwise(bounds)
        if stop > start
    ]
    deltas[-1].finish_reason = finish.get("finish_reason", "stop")
    deltas[-1].stop_reason = finish.get("stop_reason")
    return deltas


def stream(request: GenerationRequest, deltas: list[ChoiceDelta]) -> tuple[bytes, list]:
    events = MessagesEvents(request, STRINGS)
    written = list(events.opening_events())
    made = [delivered_event(events, 0, delta) for delta in deltas]
    written += [event for event in made if event is not None]
    return b"".join(written + events.closing_events()), made


def body(request: GenerationRequest, deltas: list[ChoiceDelta]) -> dict:
    events = MessagesEvents(request, STRINGS)
    for delta in deltas:
        delivered_fold(events, 0, delta)
    return orjson.loads(events.body())


def without_ids(message: dict) -> dict:
    blocks = [{k: v for k, v in block.items() if k != "id"} for block in message["content"]]
    return {**message, "content": blocks}


def test_a_text_message_streams_start_ping_one_block_and_the_finish():
    deltas = deltas_of(["Hel", "lo", " there"], [1])
    raw, _ = stream(make_request(), deltas)
    types = [name for name, _ in parse_events(raw)]
    assert types == [
        "message_start", "ping", "content_block_start", "content_block_delta",
        "content_block_delta", "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    streamed = read_message_stream(raw).message
    assert streamed == body(make_request(), deltas)
    assert streamed["content"] == [{"type": "text", "text": "Hello there"}]
    assert streamed["stop_reason"] == "end_turn" and streamed["stop_sequence"] is None
    # Anthropic's input_tokens leave the cached ones out.
    assert streamed["usage"] == {
        "input_tokens": 3, "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 2, "output_tokens": 3,
    }  # fmt: skip


def test_message_start_carries_the_input_usage_and_no_output_yet():
    raw, _ = stream(make_request(), deltas_of(["a"], []))
    (_, start), _ping, *_ = parse_events(raw)
    assert start["message"]["id"] == "msg_1" and start["message"]["model"] == "tiny"
    assert start["message"]["usage"]["input_tokens"] == 3
    assert start["message"]["usage"]["output_tokens"] == 0


@settings(max_examples=60, deadline=None)
@given(
    output=st.sampled_from([TOOL_OUTPUT, "<think>Weather, so a call.</think>\n" + TOOL_OUTPUT]),
    token_size=st.integers(1, 6),
    data=st.data(),
)
def test_merged_deltas_give_the_same_blocks_as_one_token_at_a_time(output, token_size, data):
    tokens = tokens_of(output, token_size)
    request = make_request(THINKING_HERMES)
    each = deltas_of(tokens, list(range(1, len(tokens))))
    one_by_one = read_message_stream(stream(request, each)[0])
    cuts = sorted(data.draw(st.sets(st.integers(1, len(tokens) - 1), max_size=6)))
    merged = read_message_stream(stream(request, deltas_of(tokens, cuts))[0])
    assert without_ids(merged.message) == without_ids(one_by_one.message)
    assert without_ids(merged.message) == without_ids(body(request, deltas_of(tokens, cuts)))
    assert len(merged.event_types) <= len(one_by_one.event_types)


def test_content_after_a_call_in_the_same_delta_goes_to_a_block_after_it():
    tokens = tokens_of(TOOL_OUTPUT)
    message = read_message_stream(stream(make_request(HERMES), deltas_of(tokens, [1]))[0]).message
    assert [block["type"] for block in message["content"]] == ["text", "tool_use", "text"]
    text, call, after = message["content"]
    assert text["text"] == "Let me check, a < b."
    assert call["name"] == "get_weather" and call["input"] == orjson.loads(ARGUMENTS)
    assert call["id"].startswith("toolu_") and len(call["id"]) > len("toolu_")
    assert after["text"] == "Done."
    assert message["stop_reason"] == "tool_use"


def test_a_streamed_call_keeps_its_id_and_joined_json_in_the_final_message():
    request = make_request(OutputParsing(NAMED_FORMAT, function_name="get_weather"))
    events = MessagesEvents(request, STRINGS)
    deltas = deltas_of(tokens_of(ARGUMENTS), [2, 5])
    raw = b"".join(e for e in (delivered_event(events, 0, d) for d in deltas) if e)
    raw += b"".join(events.closing_events())
    streamed = read_message_stream(raw)
    (call,) = streamed.message["content"]
    assert call["type"] == "tool_use" and call["input"] == orjson.loads(ARGUMENTS)
    assert "text_delta" not in raw.decode()
    assert streamed.num_deltas == [3]


def test_reasoning_streams_as_a_thinking_block_before_the_text():
    output = "<think>Weather, so a call.</think>\n" + TOOL_OUTPUT
    deltas = deltas_of(tokens_of(output, 4), [3, 9])
    raw, _ = stream(make_request(THINKING_HERMES), deltas)
    message = read_message_stream(raw).message
    assert [block["type"] for block in message["content"]] == [
        "thinking",
        "text",
        "tool_use",
        "text",
    ]
    assert message["content"][0] == {
        "type": "thinking", "thinking": "Weather, so a call.", "signature": "",
    }  # fmt: skip
    assert b'"type":"thinking_delta"' in raw
    assert without_ids(message) == without_ids(body(make_request(THINKING_HERMES), deltas))


def test_max_tokens_ends_with_max_tokens_and_a_cut_call_has_empty_input():
    cut = "Sure.\n" + CALL[:40]
    deltas = deltas_of(tokens_of(cut), [], finish_reason="length")
    message = read_message_stream(stream(make_request(HERMES), deltas)[0]).message
    assert message["stop_reason"] == "max_tokens"
    folded = body(make_request(HERMES), deltas)
    assert folded["stop_reason"] == "max_tokens"
    assert folded["content"][-1]["type"] == "tool_use" and folded["content"][-1]["input"] == {}


def test_a_call_cut_inside_its_arguments_has_the_input_anthropics_sdk_accumulates():
    # Cut after `{"city": "Zürich 😀", "nes`: the SDK (jiter, partial mode)
    # keeps the complete member; the body must give the streamed message's input.
    cut = "Sure.\n" + CALL[: CALL.index('"nested"') + 4]
    for cuts in ([], list(range(1, len(tokens_of(cut))))):
        deltas = deltas_of(tokens_of(cut), cuts, finish_reason="length")
        raw, _ = stream(make_request(HERMES), deltas)
        partial = "".join(
            data["delta"]["partial_json"]
            for _, data in parse_events(raw)
            if data.get("delta", {}).get("type") == "input_json_delta"
        )
        streamed_input = jiter.from_json(partial.encode(), partial_mode=True)
        assert streamed_input == {"city": "Zürich 😀"}
        folded = body(make_request(HERMES), deltas)
        assert folded["content"][-1]["input"] == streamed_input


def test_a_stop_string_ends_with_stop_sequence_naming_it():
    deltas = deltas_of(["one", " two"], [], stop_reason="STOP")
    message = read_message_stream(stream(make_request(), deltas)[0]).message
    assert message["stop_reason"] == "stop_sequence" and message["stop_sequence"] == "STOP"
    assert body(make_request(), deltas)["stop_sequence"] == "STOP"


def test_a_stop_token_is_an_end_turn():
    deltas = deltas_of(["one"], [], stop_reason=7)
    assert body(make_request(), deltas)["stop_reason"] == "end_turn"


def test_a_delta_whose_text_is_held_back_makes_no_event_after_the_start():
    tokens = ["Hi", " <tool", "_ca", "ll>"]
    deltas = deltas_of(tokens, [1, 2, 3])
    _, made = stream(make_request(HERMES), deltas)
    assert made[0] is not None and made[0].startswith(b"event: message_start\n")
    assert made[1] is None and made[2] is None  # "<tool_ca" may still open a call


def test_the_first_delta_starts_the_message_even_when_all_its_text_is_held():
    deltas = deltas_of(["<tool", "_x"], [1])
    raw, made = stream(make_request(HERMES), deltas)
    assert made[0] == b"\n\n".join(raw.split(b"\n\n")[:2]) + b"\n\n"
    assert read_message_stream(raw).message["content"] == [{"type": "text", "text": "<tool_x"}]


def test_a_finish_with_no_text_still_closes_the_open_block():
    deltas = [*deltas_of(["a", "b"], []), ChoiceDelta(finish_reason="stop")]
    deltas[0].finish_reason = None
    raw, made = stream(make_request(), deltas)
    assert (
        made[-1] == b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    )
    assert read_message_stream(raw).message["content"] == [{"type": "text", "text": "ab"}]


@pytest.mark.parametrize(
    ("error", "error_type"),
    [
        (InvalidRequestError("bad"), "invalid_request_error"),
        (QueueFullError("full"), "overloaded_error"),
        (RuntimeError("secret"), "api_error"),
    ],
)
def test_a_failed_stream_ends_with_an_error_event_in_anthropics_shape(error, error_type):
    (event,) = MessagesEvents(make_request(), STRINGS).error_events(error)
    ((name, data),) = parse_events(event)
    assert name == "error" and data["type"] == "error"
    assert data["error"]["type"] == error_type
    assert "secret" not in data["error"]["message"]
