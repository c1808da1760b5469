"""Strict SSE parsing: every event numbered, every framing fault named."""

from __future__ import annotations

import math

from sluice.audit.records import Exchange
from sluice.audit.sse import event_time_s, parse_sse


def test_a_well_framed_stream_parses_into_numbered_events_ending_with_done():
    parsed = parse_sse(b'data: {"a":1}\n\ndata: {"a":2}\n\ndata: [DONE]\n\n')
    assert [e.number for e in parsed.events] == [0, 1, 2]
    assert [e.payload for e in parsed.events] == [{"a": 1}, {"a": 2}, None]
    assert parsed.events[-1].is_done
    assert all(e.problem is None for e in parsed.events)
    assert parsed.trailing == b""


def test_crlf_line_endings_are_a_framing_problem_but_still_parse():
    parsed = parse_sse(b'data: {"a":1}\r\n\r\ndata: [DONE]\r\n\r\n')
    assert len(parsed.events) == 2
    assert parsed.events[0].payload == {"a": 1}
    assert parsed.events[0].problem == "line ending is not a bare LF"


def test_event_lines_are_named_in_the_problem_but_comment_lines_are_legal_sse():
    parsed = parse_sse(b'event: message\ndata: {"a":1}\n\n: keep-alive\n\n: ping\ndata: 2\n\n')
    assert "event" in parsed.events[0].problem
    assert parsed.events[0].payload == {"a": 1}
    ping = parsed.events[1]
    assert (ping.problem, ping.comment_lines, ping.is_comment_only) == (None, 1, True)
    assert (parsed.events[2].problem, parsed.events[2].payload) == (None, 2)
    assert parsed.events[2].comment_lines == 1


def test_json_split_over_several_data_lines_is_flagged():
    parsed = parse_sse(b'data: {"a":\ndata: 1}\n\n')
    assert parsed.events[0].payload == {"a": 1}
    assert "2 lines" in parsed.events[0].problem


def test_undecodable_data_is_flagged_and_left_without_payload():
    parsed = parse_sse(b"data: {not json}\n\n")
    assert parsed.events[0].payload is None
    assert parsed.events[0].problem.startswith("data is not one JSON value")


def test_a_missing_space_after_data_colon_is_flagged():
    parsed = parse_sse(b'data:{"a":1}\n\n')
    assert parsed.events[0].problem == "line does not start with 'data: '"


def test_bytes_after_the_last_blank_line_are_kept_as_trailing():
    parsed = parse_sse(b'data: {"a":1}\n\ndata: {"b"')
    assert len(parsed.events) == 1
    assert parsed.trailing == b'data: {"b"'


def test_nan_and_infinity_decode_so_the_logprob_check_can_see_them():
    parsed = parse_sse(b'data: {"x": NaN, "y": -Infinity}\n\n')
    assert math.isnan(parsed.events[0].payload["x"])
    assert parsed.events[0].payload["y"] == -math.inf


def test_an_event_is_timed_by_the_piece_that_carried_its_last_byte():
    raw = b'data: {"a":1}\n\ndata: {"a":2}\n\n'
    exchange = Exchange("s", "t", "/v1/completions", {}, raw=raw)
    exchange.arrival_offsets = [10, 20, len(raw)]
    exchange.arrival_times_s = [1.0, 2.0, 3.0]
    first, second = parse_sse(raw).events
    assert event_time_s(first, exchange.arrival_offsets, exchange.arrival_times_s) == 2.0
    assert event_time_s(second, exchange.arrival_offsets, exchange.arrival_times_s) == 3.0
