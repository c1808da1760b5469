"""benchmarks/_agent_sse.py: the first content moment and the token counts of a stream,
in each dialect, from hand-built events in the shapes the servers send."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the modules import their siblings
sse = importlib.import_module("_agent_sse")


def _watched(dialect, events):
    """Feed (seconds, payload) pairs as the lines of a stream, with `event:` lines and blanks."""
    watch = sse.StreamWatch(dialect)
    for seconds, payload in events:
        kind = payload.get("type", "") if isinstance(payload, dict) else ""
        watch.feed_line(f"event: {kind}", seconds)
        text = payload if isinstance(payload, str) else json.dumps(payload)
        watch.feed_line(f"data: {text}", seconds)
        watch.feed_line("", seconds)
    return watch.facts


def test_responses_ttft_is_the_first_delta_and_usage_comes_from_the_final_response():
    usage = {"input_tokens": 4598, "input_tokens_details": {"cached_tokens": 4576},
             "output_tokens": 8}  # fmt: skip
    facts = _watched("responses", [
        (0.1, {"type": "response.created", "response": {"usage": None}}),
        (0.2, {"type": "response.in_progress", "response": {"usage": None}}),
        (0.3, {"type": "response.output_item.added", "item": {}}),
        (0.4, {"type": "response.content_part.added", "part": {}}),
        (0.5, {"type": "response.output_text.delta", "delta": "Hi"}),
        (0.6, {"type": "response.output_text.delta", "delta": " there"}),
        (0.7, {"type": "response.completed", "response": {"usage": usage}}),
    ])  # fmt: skip
    assert facts.first_content_s == 0.5
    assert (facts.num_prompt_tokens, facts.num_cached_tokens) == (4598, 4576)


def test_a_reasoning_or_call_delta_is_content_too():
    facts = _watched("responses", [
        (0.1, {"type": "response.created", "response": {}}),
        (0.3, {"type": "response.function_call_arguments.delta", "delta": "{"}),
    ])  # fmt: skip
    assert facts.first_content_s == 0.3


def test_messages_prompt_tokens_add_the_cached_ones_back():
    start = {"usage": {"input_tokens": 14, "cache_read_input_tokens": 4384,
                       "cache_creation_input_tokens": 0, "output_tokens": 1}}  # fmt: skip
    facts = _watched("messages", [
        (0.1, {"type": "message_start", "message": start}),
        (0.15, {"type": "ping"}),
        (0.2, {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}),
        (0.4, {"type": "content_block_delta", "index": 0, "delta": {"text": "x"}}),
        (0.5, {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 8}}),
        (0.6, {"type": "message_stop"}),
    ])  # fmt: skip
    assert facts.first_content_s == 0.4
    assert (facts.num_prompt_tokens, facts.num_cached_tokens) == (4398, 4384)


def test_messages_usage_in_message_delta_replaces_the_start_figures():
    facts = _watched("messages", [
        (0.1, {"type": "message_start", "message": {"usage": {"input_tokens": 1}}}),
        (0.5, {"type": "message_delta", "usage": {"input_tokens": 10,
                                                  "cache_read_input_tokens": 90}}),
    ])  # fmt: skip
    assert (facts.num_prompt_tokens, facts.num_cached_tokens) == (100, 90)


def test_chat_role_chunk_is_not_content_and_usage_chunk_counts():
    facts = _watched("chat", [
        (0.1, {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        (0.3, {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}),
        (0.4, {"choices": [], "usage": {"prompt_tokens": 500, "completion_tokens": 8,
                                        "prompt_tokens_details": {"cached_tokens": 496}}}),
        (0.4, "[DONE]"),
    ])  # fmt: skip
    assert facts.first_content_s == 0.3
    assert (facts.num_prompt_tokens, facts.num_cached_tokens) == (500, 496)


def test_llama_server_timings_stand_in_for_a_missing_usage_chunk():
    timings = {"cache_n": 4300, "prompt_n": 98, "prompt_ms": 812.5}
    facts = _watched("chat", [
        (0.9, {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}),
        (1.0, {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
               "timings": timings}),
    ])  # fmt: skip
    assert (facts.num_prompt_tokens, facts.num_cached_tokens) == (4398, 4300)
    assert facts.server_prefill_ms == 812.5


def test_completions_ttft_is_the_first_text():
    facts = _watched("completions", [
        (0.2, {"choices": [{"index": 0, "text": ""}]}),
        (0.3, {"choices": [{"index": 0, "text": "a"}]}),
        (0.4, {"choices": [], "usage": {"prompt_tokens": 37}}),
    ])  # fmt: skip
    assert facts.first_content_s == 0.3
    assert (facts.num_prompt_tokens, facts.num_cached_tokens) == (37, 0)


def test_a_completions_token_that_shows_no_text_counts_at_its_finish():
    facts = _watched("completions", [
        (0.2, {"choices": [{"index": 0, "text": ""}]}),
        (0.6, {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}),
    ])  # fmt: skip
    assert facts.first_content_s == 0.6


def test_an_error_event_is_kept_and_no_ttft_is_made_up():
    facts = _watched("messages", [(0.2, {"type": "error", "error": {"message": "too long"}})])
    assert facts.first_content_s is None
    assert "too long" in facts.error


def test_an_unknown_dialect_is_refused():
    with pytest.raises(ValueError, match="dialect"):
        sse.StreamWatch("grpc")


def test_llama_server_prefill_time_is_read_from_a_responses_stream_too():
    usage = {"input_tokens": 17, "input_tokens_details": {"cached_tokens": 3}}
    timings = {"cache_n": 3, "prompt_n": 14, "prompt_ms": 118.5}
    facts = _watched("responses", [
        (0.2, {"type": "response.output_text.delta", "delta": "Hello"}),
        (0.3, {"type": "response.completed", "response": {"usage": usage}, "timings": timings}),
    ])  # fmt: skip
    assert (facts.num_prompt_tokens, facts.num_cached_tokens) == (17, 3)
    assert facts.server_prefill_ms == 118.5
