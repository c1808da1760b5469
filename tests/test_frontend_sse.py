"""SSE encoding: chunk events are byte-for-byte the encoding of the whole chunk."""

from __future__ import annotations

import orjson

from sluice.frontend.sse import (
    DONE_EVENT,
    TEXT_PLACEHOLDER,
    ChunkEvents,
    TextChoice,
    encode_event,
)

ENVELOPE = {
    "id": 'cmpl-"quoted"\\id',
    "object": "text_completion",
    "created": 1_700_000_000,
    "model": "modèle 語",
}
CHOICE = {"index": 0, "text": "héllo\n😀", "logprobs": None, "finish_reason": None}
USAGE = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}


def chunk_events() -> ChunkEvents:
    return ChunkEvents(ENVELOPE["id"], ENVELOPE["object"], ENVELOPE["created"], ENVELOPE["model"])


def test_a_chunk_event_equals_encoding_the_whole_chunk():
    assert chunk_events().event(CHOICE) == encode_event(ENVELOPE | {"choices": [CHOICE]})


def test_a_chunk_event_with_usage_puts_usage_after_the_choices():
    expected = encode_event(ENVELOPE | {"choices": [CHOICE], "usage": USAGE})
    assert chunk_events().event(CHOICE, USAGE) == expected


def test_the_usage_chunk_has_no_choices():
    expected = encode_event(ENVELOPE | {"choices": [], "usage": USAGE})
    assert chunk_events().event(None, USAGE) == expected


def test_events_are_one_data_line_of_compact_json():
    event = chunk_events().event(CHOICE, USAGE)
    assert event.startswith(b"data: {") and event.endswith(b"}\n\n")
    assert event.count(b"\n") == 2
    assert orjson.loads(event[len(b"data: ") :])["choices"] == [CHOICE]
    assert DONE_EVENT == b"data: [DONE]\n\n"


def test_a_text_choice_splices_any_text_where_the_placeholder_was():
    choice = {"index": 2, "text": TEXT_PLACEHOLDER, "logprobs": None, "stop_reason": None}
    spliced = TextChoice.around(choice)
    for text in ("", 'x"y\\z', "\x00text\x00", "😀\n\t語"):
        expected = encode_event(ENVELOPE | {"choices": [choice | {"text": text}]})
        assert chunk_events().text_event(spliced, text) == expected
