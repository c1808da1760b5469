"""The Messages stream checks (sluice/audit/checks/messages.py) on recorded
byte sequences: a conforming stream of each case passes, and each broken
one is flagged with its check, quoting the event that shows it."""

from __future__ import annotations

import copy
import json

import pytest

from sluice.audit.checks.exchange import check_exchange
from sluice.audit.records import MESSAGES
from sluice.audit.scenarios.messages import TOOLS
from tests.agent_script import encode, encode_all, messages_answer
from tests.broken_servers import MODEL, recorded

PLAIN = {"model": MODEL, "max_tokens": 24, "temperature": 0,
         "messages": [{"role": "user", "content": "Tell a story."}]}  # fmt: skip
CASES = {
    "plain": PLAIN,
    "truncated": {**PLAIN, "max_tokens": 4},
    "named tool": {**PLAIN, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_weather"}},
    "zero-argument tool": {**PLAIN, "tools": TOOLS,
                           "tool_choice": {"type": "tool", "name": "get_server_status"}},
    "any tool": {**PLAIN, "tools": TOOLS, "tool_choice": {"type": "any"}},
}  # fmt: skip
NAMED = CASES["named tool"]


def streamed(body: dict) -> list[dict]:
    return copy.deepcopy(messages_answer(body)[0])


def findings(body: dict, raw: bytes):
    twin_body = {**body, "stream": False}
    twin = recorded(MESSAGES, twin_body, json.dumps(messages_answer(body)[1]).encode())
    return check_exchange(recorded(MESSAGES, {**body, "stream": True}, raw, twin=twin))


def ids(body: dict, events: list[dict]) -> set[str]:
    return {finding.check_id for finding in findings(body, encode_all(events))}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_conforming_stream_of_every_case_passes(case):
    assert findings(CASES[case], encode_all(streamed(CASES[case]))) == []


def test_an_event_without_its_event_line_is_a_framing_finding():
    events = streamed(PLAIN)
    raw = b"".join(encode(e).split(b"\n", 1)[1] if e["type"] == "ping" else encode(e)
                   for e in events)  # fmt: skip
    found = [f for f in findings(PLAIN, raw) if f.check_id == "agent_framing"]
    assert found[0].chunk_numbers == [1] and "no `event:` line" in found[0].message


def test_a_stream_not_opened_by_message_start_with_input_tokens_is_flagged():
    events = streamed(PLAIN)
    assert "messages_start_first" in ids(PLAIN, [events[1], events[0], *events[2:]])
    del events[0]["message"]["usage"]["input_tokens"]
    assert ids(PLAIN, events) == {"messages_start_first"}


def test_blocks_out_of_order_are_flagged():
    events = streamed(PLAIN)
    skipped = copy.deepcopy(events)
    skipped[2]["index"] = 1  # content_block_start of block 1 first
    assert "messages_block_order" in ids(PLAIN, skipped)
    stop = next(i for i, e in enumerate(events) if e["type"] == "content_block_stop")
    assert "messages_block_order" in ids(PLAIN, events[:stop] + events[stop + 1 :])
    late = events[:stop] + [events[stop + 1], events[stop], *events[stop + 2 :]]
    assert "messages_block_order" in ids(PLAIN, late)


def test_a_text_delta_on_a_tool_use_block_or_json_on_a_text_block_is_flagged():
    events = streamed(NAMED)
    delta = next(e for e in events if e["type"] == "content_block_delta")
    delta["delta"] = {"type": "text_delta", "text": delta["delta"]["partial_json"]}
    found = [f for f in findings(NAMED, encode_all(events)) if f.check_id == "messages_delta_type"]
    assert "'text_delta' on a 'tool_use' block" in found[0].message
    events = streamed(PLAIN)
    delta = next(e for e in events if e["type"] == "content_block_delta")
    delta["delta"] = {"type": "input_json_delta", "partial_json": delta["delta"]["text"]}
    assert "messages_delta_type" in ids(PLAIN, events)


def test_an_empty_text_delta_is_flagged_but_an_empty_partial_json_is_anthropics_own():
    events = streamed(PLAIN)
    position = next(i for i, e in enumerate(events) if e["type"] == "content_block_delta")
    empty = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ""}}
    assert ids(PLAIN, [*events[:position], empty, *events[position:]]) == {"messages_empty_delta"}
    events = streamed(NAMED)
    position = next(i for i, e in enumerate(events) if e["type"] == "content_block_delta")
    opening = {"type": "content_block_delta", "index": 0,
               "delta": {"type": "input_json_delta", "partial_json": ""}}  # fmt: skip
    assert ids(NAMED, [*events[:position], opening, *events[position:]]) == set()


def test_a_stream_without_message_stop_last_is_flagged():
    events = streamed(PLAIN)
    assert "messages_end" in ids(PLAIN, events[:-1])
    assert "messages_end" in ids(PLAIN, [*events, {"type": "ping"}])
    assert "messages_end" in ids(PLAIN, [*events[:-1], events[-2], events[-1]])


def test_an_error_event_is_a_note():
    events = streamed(PLAIN)[:4]
    events.append({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    found = findings(PLAIN, encode_all(events))
    assert [(f.check_id, f.severity) for f in found] == [("stream_ended_by_error", "note")]


def test_a_message_delta_without_output_usage_is_flagged_though_message_start_had_some():
    events = streamed(PLAIN)
    del events[-2]["usage"]
    assert ids(PLAIN, events) == {"messages_usage"}


def cut_call(twin_input: dict) -> tuple[dict, bytes, dict]:
    """The named tool's stream cut by max_tokens after `{"city": "x", "`, and its twin."""
    events = [e for e in streamed(NAMED) if e.get("delta", {}).get("partial_json") != "}"]
    events = [e for e in events if e.get("delta", {}).get("partial_json") not in ('unit"', ': "x"')]
    for event in events:
        if event["type"] == "message_delta":
            event["delta"]["stop_reason"] = "max_tokens"
            event["usage"]["output_tokens"] = NAMED["max_tokens"]
    whole = messages_answer(NAMED)[1]
    whole = {
        **whole,
        "stop_reason": "max_tokens",
        "usage": {**whole["usage"], "output_tokens": NAMED["max_tokens"]},
    }
    whole["content"] = [{**whole["content"][0], "input": twin_input}]
    return NAMED, encode_all(events), whole


def test_a_call_cut_by_max_tokens_is_read_as_anthropics_sdk_reads_it():
    # The SDK parses the cut input in jiter's partial mode: {"city": "x"}. A
    # non-streamed twin giving that passes; one giving {} differs from what
    # the stream's users got.
    for twin_input, expected in (({"city": "x"}, set()), ({}, {"messages_stream_mismatch"})):
        body, raw, whole = cut_call(twin_input)
        twin = recorded(MESSAGES, {**body, "stream": False}, json.dumps(whole).encode())
        got = check_exchange(recorded(MESSAGES, {**body, "stream": True}, raw, twin=twin))
        assert {finding.check_id for finding in got} == expected
