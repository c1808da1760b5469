"""One parsed chat choice: held-back tokens' logprob entries wait for the next
chunk, the folded message's shape, finish_reason tool_calls."""

from __future__ import annotations

from sluice.frontend.chat_message import ParsedChoice, delta_fields
from sluice.tools.output_parsing import OutputParsing


def test_entries_of_held_back_text_go_with_the_next_chunk():
    parsed = ParsedChoice(OutputParsing("hermes"))
    assert parsed.entries([{"token": "<tool"}], is_sent=False) is None
    sent = parsed.entries([{"token": "x"}], is_sent=True)
    assert sent == [{"token": "<tool"}, {"token": "x"}]
    assert parsed.entries(None, is_sent=True) is None


def test_the_folded_message_and_deltas_have_openai_shapes():
    parsed = ParsedChoice(OutputParsing("hermes", reasoning_parser="deepseek_r1"))
    first = parsed.push('<think>hm</think><tool_call>{"name": "f", "arguments": {"a"', False)
    assert delta_fields(first) == {
        "reasoning_content": "hm",
        "reasoning": "hm",
        "tool_calls": [{"index": 0, "id": first.tool_calls[0].id, "type": "function",
                        "function": {"name": "f", "arguments": '{"a"'}}],
    }  # fmt: skip
    last = parsed.push(": 1}}</tool_call>", True)
    assert delta_fields(last) == {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}
    parsed.fold(first)
    parsed.fold(last)
    assert parsed.message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": first.tool_calls[0].id, "type": "function",
                        "function": {"name": "f", "arguments": '{"a": 1}'}}],
        "reasoning_content": "hm",
        "reasoning": "hm",
    }  # fmt: skip
    assert parsed.finish_reason("stop") == "tool_calls"
    assert parsed.finish_reason("length") == "length"


def test_without_calls_the_message_is_plain_content_and_stop_stays():
    parsed = ParsedChoice(OutputParsing("hermes"))
    parsed.fold(parsed.push("just text", True))
    assert parsed.message() == {"role": "assistant", "content": "just text"}
    assert parsed.finish_reason("stop") == "stop"
