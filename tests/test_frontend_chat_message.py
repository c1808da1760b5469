"""One parsed chat choice: held-back tokens' logprob entries wait for the next
chunk, the folded message's shape, finish_reason tool_calls."""

from __future__ import annotations

import httpx2

from sluice.frontend.chat_message import ParsedChoice, delta_fields
from sluice.testing import FakeEngine
from sluice.testing.contract import parse_sse
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer
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


# -- over HTTP: the real app, a fake engine scripting the model's text ----------

TOKENIZER = ChatFakeTokenizer()
TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]


def serve(output: str, **config) -> LiveServer:
    # One token per step: the script's end is a finish delta with no token.
    token_ids = TOKENIZER.encode(output)
    engine = FakeEngine(lambda *_: iter(token_ids), tokens_per_step=1, step_interval_s=0.0005)
    return LiveServer(engine, TOKENIZER, **config)


def exchange(output: str, **fields) -> tuple[dict, list[dict]]:
    """The non-streamed body and the streamed chunks of the same request."""
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    body |= {"tools": TOOLS} | fields
    config = {"tool_call_parser": "hermes", "reasoning_parser": "deepseek_r1"}
    with serve(output, **config) as live:
        url = live.url + "/v1/chat/completions"
        whole = httpx2.post(url, json=body, timeout=60)
        stream = {"include_usage": True, "continuous_usage_stats": True}
        streamed = httpx2.post(url, json=body | {"stream": True, "stream_options": stream})
    assert whole.status_code == streamed.status_code == 200, (whole.text, streamed.text)
    return whole.json(), parse_sse(streamed.content)


def streamed_calls(chunks: list[dict]) -> list[tuple[str, str]]:
    calls: list[list[str]] = []
    for chunk in chunks:
        for choice in chunk["choices"]:
            for call in choice["delta"].get("tool_calls", []):
                if "id" in call:
                    calls.append([call["function"]["name"], ""])
                calls[call["index"]][1] += call["function"]["arguments"]
    return [(name, arguments) for name, arguments in calls]


def body_calls(body: dict) -> list[tuple[str, str]]:
    calls = body["choices"][0]["message"]["tool_calls"]
    return [(call["function"]["name"], call["function"]["arguments"]) for call in calls]


LONG_CALL_OUTPUT = (
    "<think>Weather, so a call.</think>\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
)


def test_held_back_tokens_logprobs_go_out_with_a_finish_that_has_no_token():
    body, chunks = exchange(LONG_CALL_OUTPUT, logprobs=True, top_logprobs=1)
    num_tokens = body["usage"]["completion_tokens"]
    assert len(body["choices"][0]["logprobs"]["content"]) == num_tokens
    entries = [
        entry
        for chunk in chunks
        for choice in chunk["choices"]
        for entry in (choice["logprobs"] or {}).get("content", [])
    ]
    assert chunks[-1]["usage"]["completion_tokens"] == num_tokens
    assert entries == body["choices"][0]["logprobs"]["content"]
    assert streamed_calls(chunks) == body_calls(body) == [("get_weather", '{"city": "Paris"}')]


LONE_SURROGATES = (
    '<think>hm</think><tool_call>{"name": "get_weather\\ud83d", "arguments": '
    '{"city": "Par\\udc00is", "pair": "\\ud83d\\ude00", "\\ud83d": "x\\\\ud83d"}}</tool_call>'
)


def test_a_lone_surrogate_the_model_wrote_in_a_call_becomes_u_fffd_streamed_and_not():
    body, chunks = exchange(LONE_SURROGATES)
    expected = [
        (
            "get_weather\ufffd",
            '{"city": "Par\\ufffdis", "pair": "\\ud83d\\ude00", "\\ufffd": "x\\\\ud83d"}',
        )
    ]
    assert body_calls(body) == expected
    assert streamed_calls(chunks) == expected
    assert body["choices"][0]["finish_reason"] == "tool_calls"
