"""The checks of a Messages answer's message and errors
(sluice/audit/checks/messages_final.py) on recorded answers: stop reasons,
usage, tool inputs, forced calls, the stream against its non-streamed twin,
and Anthropic's error shape; each broken form flagged, the conforming one not."""

from __future__ import annotations

import copy
import json

from sluice.audit.checks.exchange import check_exchange
from sluice.audit.records import MESSAGES
from sluice.audit.scenarios.bad_inputs import LAX_VALIDATION
from sluice.audit.scenarios.messages import TOOLS, invalid_request_findings
from tests.agent_script import encode_all, messages_answer
from tests.broken_servers import MODEL, recorded

PLAIN = {"model": MODEL, "max_tokens": 24, "temperature": 0,
         "messages": [{"role": "user", "content": "Tell a story."}]}  # fmt: skip
TRUNCATED = {**PLAIN, "max_tokens": 4}
NAMED = {**PLAIN, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_weather"}}
ZERO = {**PLAIN, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "get_server_status"}}


def final(body: dict) -> dict:
    return copy.deepcopy(messages_answer(body)[1])


def body_ids(body: dict, message: dict) -> set[str]:
    exchange = recorded(MESSAGES, body, json.dumps(message).encode())
    return {finding.check_id for finding in check_exchange(exchange)}


def stream_ids(body: dict, events: list[dict], twin: dict | None = None) -> set[str]:
    twin_body = {**body, "stream": False}
    twin_message = twin if twin is not None else final(body)
    twin_exchange = recorded(MESSAGES, twin_body, json.dumps(twin_message).encode())
    stream = recorded(MESSAGES, {**body, "stream": True}, encode_all(events), twin=twin_exchange)
    return {finding.check_id for finding in check_exchange(stream)}


def events_of(body: dict) -> list[dict]:
    return copy.deepcopy(messages_answer(body)[0])


def test_conforming_messages_pass():
    for body in (PLAIN, TRUNCATED, NAMED, ZERO):
        assert body_ids(body, final(body)) == set()
        assert stream_ids(body, events_of(body)) == set()


def test_a_stop_reason_unlike_what_happened_is_flagged():
    assert body_ids(TRUNCATED, final(TRUNCATED) | {"stop_reason": "end_turn"}) == {
        "messages_stop_reason"
    }
    assert body_ids(PLAIN, final(PLAIN) | {"stop_reason": "max_tokens"}) == {"messages_stop_reason"}
    assert body_ids(NAMED, final(NAMED) | {"stop_reason": "end_turn"}) == {"messages_stop_reason"}
    assert body_ids(PLAIN, final(PLAIN) | {"stop_reason": "tool_use"}) == {"messages_stop_reason"}
    assert body_ids(PLAIN, final(PLAIN) | {"stop_reason": "length"}) == {"messages_stop_reason"}
    events = events_of(TRUNCATED)
    events[-2]["delta"]["stop_reason"] = "end_turn"
    assert "messages_stop_reason" in stream_ids(TRUNCATED, events)


def test_usage_without_output_tokens_or_unlike_the_twins_is_flagged():
    message = final(PLAIN)
    del message["usage"]["output_tokens"]
    assert body_ids(PLAIN, message) == {"messages_usage"}
    twin = final(PLAIN)
    twin["usage"]["output_tokens"] += 1
    assert stream_ids(PLAIN, events_of(PLAIN), twin) == {"messages_usage"}


def test_tool_input_that_is_no_json_object_or_not_empty_for_a_zero_argument_tool_is_flagged():
    message = final(ZERO)
    message["content"][0]["input"] = {"force": True}
    assert body_ids(ZERO, message) == {"messages_invalid_input"}
    events = events_of(NAMED)
    delta = next(e for e in events if e["type"] == "content_block_delta")
    delta["delta"]["partial_json"] = "[" + delta["delta"]["partial_json"]
    assert "messages_invalid_input" in stream_ids(NAMED, events)


def test_a_forced_call_that_ended_as_text_is_flagged():
    assert body_ids(NAMED, final(PLAIN)) == {"tools_no_call"}


def test_a_stream_unlike_its_twin_is_flagged_ids_aside():
    twin = final(NAMED)
    twin["content"][0]["input"] = {"city": "y", "unit": "x"}
    assert stream_ids(NAMED, events_of(NAMED), twin) == {"messages_stream_mismatch"}
    twin = final(NAMED)
    twin["id"], twin["content"][0]["id"] = "msg_2", "toolu_2"
    assert stream_ids(NAMED, events_of(NAMED), twin) == set()


def test_an_error_in_openais_shape_on_messages_is_flagged_and_anthropics_passes():
    bad = {**PLAIN}
    del bad["max_tokens"]
    openai_shaped = {"error": {"message": "max_tokens", "type": "invalid_request_error",
                               "code": None, "param": "max_tokens"}}  # fmt: skip
    exchange = recorded(MESSAGES, bad, json.dumps(openai_shaped).encode(), status=400,
                        expects_error=True)  # fmt: skip
    assert {f.check_id for f in check_exchange(exchange)} == {"messages_error_shape"}
    anthropic = {"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}
    exchange = recorded(MESSAGES, bad, json.dumps(anthropic).encode(), status=400,
                        expects_error=True)  # fmt: skip
    assert check_exchange(exchange) == [] and invalid_request_findings(exchange) == []


def test_an_invalid_request_accepted_or_answered_with_another_status_is_flagged():
    anthropic = {"type": "error", "error": {"type": "not_found_error", "message": "x"}}
    wrong = recorded(MESSAGES, PLAIN, json.dumps(anthropic).encode(), status=404,
                     expects_error=True)  # fmt: skip
    assert [f.check_id for f in invalid_request_findings(wrong)] == ["messages_error_shape"]
    accepted = recorded(MESSAGES, PLAIN, json.dumps(final(PLAIN)).encode(), expects_error=True)
    assert [f.check_id for f in invalid_request_findings(accepted)] == ["bad_input_accepted"]


def test_an_accepted_invalid_request_is_the_lax_validation_cause_the_bad_inputs_share():
    accepted = recorded(MESSAGES, PLAIN, json.dumps(final(PLAIN)).encode(), expects_error=True)
    [found] = invalid_request_findings(accepted)
    assert (found.cause, found.message) == (LAX_VALIDATION, "case: answered 200")
