"""The checks of a Responses answer's final object
(sluice/audit/checks/responses_final.py) on recorded answers: truncation,
usage, tool-call arguments, forced calls, logprobs, and the stream against
its non-streamed twin; each broken form flagged, the conforming one not."""

from __future__ import annotations

import copy
import json

from sluice.audit.checks.exchange import check_exchange
from sluice.audit.checks.responses_final import LOGPROBS_INCLUDE
from sluice.audit.records import RESPONSES
from sluice.audit.scenarios.responses import TOOLS
from tests.agent_script import encode_all, responses_answer
from tests.broken_servers import MODEL, recorded

PLAIN = {"model": MODEL, "input": "Tell a story.", "max_output_tokens": 24, "temperature": 0}
TRUNCATED = {**PLAIN, "max_output_tokens": 4}
ZERO = {**PLAIN, "tools": TOOLS, "tool_choice": {"type": "function", "name": "get_server_status"}}
NAMED = {**PLAIN, "tools": TOOLS, "tool_choice": {"type": "function", "name": "get_weather"}}
LOGPROBS = {**PLAIN, "include": [LOGPROBS_INCLUDE], "top_logprobs": 2}


def body_ids(body: dict, response: dict) -> set[str]:
    """Findings on a non-streamed answer."""
    exchange = recorded(RESPONSES, body, json.dumps(response).encode())
    return {finding.check_id for finding in check_exchange(exchange)}


def final(body: dict) -> dict:
    return copy.deepcopy(responses_answer(body)[1])


def stream_ids(body: dict, events: list[dict], twin: dict | None = None) -> set[str]:
    """Findings on a stream of `body` with its twin (conforming unless given)."""
    twin_body = {**body, "stream": False}
    twin_answer = twin if twin is not None else final(twin_body)
    twin_exchange = recorded(RESPONSES, twin_body, json.dumps(twin_answer).encode())
    stream = recorded(RESPONSES, {**body, "stream": True}, encode_all(events), twin=twin_exchange)
    return {finding.check_id for finding in check_exchange(stream)}


def events_of(body: dict) -> list[dict]:
    return copy.deepcopy(responses_answer({**body, "stream": True})[0])


def test_conforming_answers_pass():
    for body in (PLAIN, TRUNCATED, ZERO, NAMED, LOGPROBS):
        assert body_ids(body, final(body)) == set()
        assert stream_ids(body, events_of(body)) == set()


def test_a_truncated_answer_reported_completed_is_flagged_streamed_or_not():
    completed = final(TRUNCATED) | {"status": "completed", "incomplete_details": None}
    assert body_ids(TRUNCATED, completed) == {"responses_truncation"}
    events = events_of(TRUNCATED)
    events[-1] = {**events[-1], "type": "response.completed", "response": completed}
    assert "responses_truncation" in stream_ids(TRUNCATED, events)


def test_an_answer_incomplete_for_max_output_tokens_it_did_not_use_is_flagged():
    answer = final(PLAIN) | {"status": "incomplete",
                             "incomplete_details": {"reason": "max_output_tokens"}}  # fmt: skip
    assert body_ids(PLAIN, answer) == {"responses_truncation"}


def test_usage_missing_or_not_adding_up_is_flagged():
    assert body_ids(PLAIN, final(PLAIN) | {"usage": None}) == {"responses_usage"}
    answer = final(PLAIN)
    answer["usage"]["total_tokens"] += 1
    assert body_ids(PLAIN, answer) == {"responses_usage"}


def test_a_stream_whose_output_tokens_differ_from_its_twins_is_flagged():
    twin = final(PLAIN)
    twin["usage"] = {"input_tokens": 3, "output_tokens": 11, "total_tokens": 14}
    assert stream_ids(PLAIN, events_of(PLAIN), twin) == {"responses_usage"}


def test_arguments_that_are_not_a_json_object_or_not_empty_for_a_zero_argument_tool_are_flagged():
    for arguments in ("", '{"force": true}', "[]", '{"city": '):
        answer = final(ZERO)
        answer["output"][0]["arguments"] = arguments
        assert body_ids(ZERO, answer) == {"responses_invalid_arguments"}, arguments
    unknown = final(NAMED)
    unknown["output"][0]["name"] = "get_wether"
    assert body_ids(NAMED, unknown) == {"responses_invalid_arguments"}


def test_a_forced_call_that_completed_as_text_is_flagged():
    answer = final(NAMED)
    answer["output"] = final(PLAIN)["output"]
    assert body_ids(NAMED, answer) == {"tools_no_call"}


def test_logprobs_asked_for_and_missing_or_unlike_the_deltas_or_twin_are_flagged():
    answer = final(LOGPROBS)
    answer["output"][0]["content"][0]["logprobs"] = []
    assert body_ids(LOGPROBS, answer) == {"responses_logprobs"}
    events = events_of(LOGPROBS)
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    delta["logprobs"] = []
    assert stream_ids(LOGPROBS, events) == {"responses_logprobs"}
    twin = final(LOGPROBS)
    twin["output"][0]["content"][0]["logprobs"][0]["token"] = "other"
    assert stream_ids(LOGPROBS, events_of(LOGPROBS), twin) == {"responses_logprobs"}


def test_a_stream_unlike_its_twin_in_text_or_arguments_is_flagged_ids_aside():
    twin = final(PLAIN)
    twin["output"][0]["content"][0]["text"] += " more"
    assert stream_ids(PLAIN, events_of(PLAIN), twin) == {"responses_stream_mismatch"}
    twin = final(NAMED)
    twin["output"][0]["arguments"] = '{"city": "y", "unit": "x"}'
    assert stream_ids(NAMED, events_of(NAMED), twin) == {"responses_stream_mismatch"}
    twin = final(NAMED)
    twin["id"], twin["output"][0]["id"], twin["output"][0]["call_id"] = "resp_2", "fc_2", "call_2"
    assert stream_ids(NAMED, events_of(NAMED), twin) == set()
