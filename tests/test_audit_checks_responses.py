"""The Responses stream checks (sluice/audit/checks/responses.py) on recorded
byte sequences: a conforming stream of each case passes, and each broken
one is flagged with its check, quoting the event that shows it."""

from __future__ import annotations

import copy

import pytest

from sluice.audit.checks.exchange import check_exchange
from sluice.audit.checks.responses_final import LOGPROBS_INCLUDE
from sluice.audit.records import RESPONSES
from sluice.audit.scenarios.responses import TOOLS
from tests.agent_script import encode, encode_all, renumbered, responses_answer
from tests.broken_servers import MODEL, recorded

PLAIN = {"model": MODEL, "input": "Tell a story.", "max_output_tokens": 24, "temperature": 0}
CASES = {
    "plain": PLAIN,
    "truncated": {**PLAIN, "max_output_tokens": 4},
    "named tool": {**PLAIN, "tools": TOOLS, "tool_choice": {"type": "function",
                                                            "name": "get_weather"}},
    "zero-argument tool": {**PLAIN, "tools": TOOLS, "tool_choice": {"type": "function",
                                                                    "name": "get_server_status"}},
    "logprobs": {**PLAIN, "include": [LOGPROBS_INCLUDE], "top_logprobs": 2},
    "required": {**PLAIN, "tools": TOOLS, "tool_choice": "required"},
}  # fmt: skip


def streamed(body: dict) -> list[dict]:
    return copy.deepcopy(responses_answer({**body, "stream": True})[0])


def findings(body: dict, raw: bytes, *, twin_events: list[dict] | None = None):
    """The findings on a recorded stream of `body`, with its conforming twin."""
    body = {**body, "stream": True}
    twin_body = {**body, "stream": False}
    twin = recorded(RESPONSES, twin_body, encode_final(twin_body))
    return check_exchange(recorded(RESPONSES, body, raw, twin=twin))


def encode_final(body: dict) -> bytes:
    import json

    return json.dumps(responses_answer(body)[1]).encode()


def ids(body: dict, events: list[dict]) -> set[str]:
    return {finding.check_id for finding in findings(body, encode_all(events))}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_conforming_stream_of_every_case_passes(case):
    assert findings(CASES[case], encode_all(streamed(CASES[case]))) == []


def test_an_event_named_unlike_its_type_and_an_unterminated_end_are_framing_findings():
    events = streamed(PLAIN)
    raw = encode_all(events).replace(b"event: response.in_progress", b"event: response.done", 1)
    assert {f.check_id for f in findings(PLAIN, raw)} == {"agent_framing"}
    cut = encode_all(events)[:-1]
    found = [f for f in findings(PLAIN, cut) if f.check_id == "agent_framing"]
    assert found and "unterminated" in found[0].message


def test_a_sequence_number_that_skips_is_flagged_at_that_event():
    events = streamed(PLAIN)
    events[3]["sequence_number"] = 4
    found = [f for f in findings(PLAIN, encode_all(events)) if f.check_id == "responses_sequence"]
    assert found[0].chunk_numbers == [3]
    assert found[0].evidence[0].startswith("#3: event: ")


def test_a_stream_that_does_not_open_with_response_created_is_flagged():
    assert ids(PLAIN, renumbered(streamed(PLAIN)[1:])) == {"responses_created_first"}


def test_a_stream_without_a_terminal_event_or_with_two_is_flagged():
    events = streamed(PLAIN)
    assert "responses_terminal" in ids(PLAIN, events[:-1])
    assert "responses_terminal" in ids(PLAIN, renumbered([*events, events[-1]]))


def test_a_terminal_event_naming_another_status_than_its_response_is_flagged():
    events = streamed(CASES["truncated"])
    events[-1]["type"] = "response.completed"
    assert "responses_terminal" in ids(CASES["truncated"], events)


def test_an_item_never_done_or_closed_out_of_order_is_flagged():
    events = streamed(PLAIN)
    undone = [e for e in events if e["type"] != "response.output_item.done"]
    assert "responses_item_order" in ids(PLAIN, renumbered(undone))
    part_done = next(i for i, e in enumerate(events) if e["type"] == "response.content_part.done")
    unpaired = events[:part_done] + events[part_done + 1 :]
    assert "responses_item_order" in ids(PLAIN, renumbered(unpaired))


def test_an_event_naming_another_item_id_or_output_index_is_flagged():
    events = streamed(PLAIN)
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    delta["item_id"] = "msg_other"
    assert ids(PLAIN, events) == {"responses_index_mismatch"}
    events = streamed(PLAIN)
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    delta["output_index"] = 1
    assert "responses_index_mismatch" in ids(PLAIN, events)


def test_an_empty_delta_is_flagged():
    events = streamed(PLAIN)
    position = next(i for i, e in enumerate(events) if e["type"] == "response.output_text.delta")
    events.insert(position, {**events[position], "delta": "", "logprobs": []})
    assert ids(PLAIN, renumbered(events)) == {"responses_empty_delta"}


def test_deltas_that_do_not_add_up_to_the_done_values_are_flagged_at_each_one():
    events = streamed(CASES["named tool"])
    delta = next(e for e in events if e["type"] == "response.function_call_arguments.delta")
    delta["delta"] = delta["delta"][:-1]
    found = [f for f in findings(CASES["named tool"], encode_all(events))
             if f.check_id == "responses_delta_mismatch"]  # fmt: skip
    # .done, output_item.done and the terminal response: one finding, three events.
    assert len(found) == 1 and len(found[0].chunk_numbers) == 3


def test_an_error_event_then_response_failed_is_a_note_not_a_break():
    events = streamed(PLAIN)[:4]
    failed = {**events[0]["response"], "status": "failed", "error": {"code": "server_error"}}
    events += [{"type": "error", "code": "server_error", "message": "engine died"},
               {"type": "response.failed", "response": failed}]  # fmt: skip
    found = findings(PLAIN, encode_all(renumbered(events)))
    assert {(f.check_id, f.severity) for f in found} >= {("stream_ended_by_error", "note")}
    assert not [f for f in found if f.is_failure and f.check_id != "responses_item_order"]


def test_an_event_line_is_optional_on_responses_but_must_match():
    raw = b"".join(encode(e).split(b"\n", 1)[1] for e in streamed(PLAIN))
    assert findings(PLAIN, raw) == []


def test_a_call_id_that_changes_between_the_added_done_and_terminal_items_is_flagged():
    events = streamed(CASES["named tool"])
    events[-1]["response"]["output"][0]["call_id"] = "call_other"
    assert ids(CASES["named tool"], events) == {"responses_index_mismatch"}
    events = streamed(CASES["named tool"])
    added = next(e for e in events if e["type"] == "response.output_item.added")
    added["item"]["call_id"] = "call_other"
    assert ids(CASES["named tool"], events) == {"responses_index_mismatch"}


def llama_shaped(events: list[dict]) -> list[dict]:
    """llama-server's Responses events: items named by item_id alone, no
    output_index, content_index or sequence_number."""
    for event in events:
        for key in ("output_index", "content_index", "sequence_number"):
            event.pop(key, None)
    return events


def test_events_without_index_fields_are_one_cause_per_field_not_a_cascade():
    found = findings(PLAIN, encode_all(llama_shaped(streamed(PLAIN))))
    assert sorted((f.check_id, f.cause) for f in found) == [
        ("responses_index_mismatch", "N events carry no content_index"),
        ("responses_index_mismatch", "N events carry no output_index"),
        ("responses_sequence", "event N (response.created) has sequence_number None"),
    ]


def test_deltas_of_events_without_index_fields_are_still_compared_with_their_done_values():
    events = llama_shaped(streamed(PLAIN))
    delta = next(e for e in events if e["type"] == "response.output_text.delta")
    delta["delta"] = delta["delta"] + "x"
    found = {f.check_id for f in findings(PLAIN, encode_all(events))}
    assert "responses_delta_mismatch" in found and "responses_item_order" not in found
