"""Named events of the agent APIs read from raw bytes (sluice/audit/agent_events.py):
well-formed events keep their name and data; each framing fault is named on
its own event, whose payload is kept when readable; comments and a stray
[DONE] are skipped."""

from __future__ import annotations

from sluice.audit.agent_events import read_events
from sluice.audit.records import MESSAGES
from tests.broken_servers import recorded

BODY = {"model": "m", "max_tokens": 4, "stream": True, "messages": []}


def events(raw: bytes):
    return read_events(recorded(MESSAGES, BODY, raw))


def test_well_formed_events_keep_their_numbers_names_and_data():
    raw = (b'event: ping\ndata: {"type": "ping"}\n\n: keep-alive\n\n'
           b'data: {"type": "message_stop"}\n\ndata: [DONE]\n\n')  # fmt: skip
    stream = events(raw)
    assert [(e.number, e.name, e.type, e.problem) for e in stream.events] == [
        (0, "ping", "ping", None),
        (2, None, "message_stop", None),
    ]
    assert stream.trailing == b""


def test_each_framing_fault_is_named_on_its_event_and_readable_data_kept():
    raw = (b'event: ping\r\ndata: {"type": "ping"}\r\n\r\n'
           b'event: ping\ndata: {"type": "pong"}\n\n'
           b'data: {"type": "ping"}\nevent: ping\n\n'
           b'event: ping\ndata: [1]\n\n'
           b'event: ping\ndata: {"type": "ping"}\ndata: {}\n\n'
           b'event: ping\ndata: {"type"')  # fmt: skip
    stream = events(raw)
    assert [e.problem for e in stream.events] == [
        "line ending is not a bare LF",
        "event: ping carries data of type 'pong'",
        "the data line comes before the event line",
        "data is not one JSON object",
        "2 data lines, expected one",
    ]
    assert stream.events[1].payload == {"type": "pong"}
    assert stream.trailing == b'event: ping\ndata: {"type"'
