"""Text checks: U+FFFD, stop leaks, duplicated or skipped deltas, determinism."""

from __future__ import annotations

import json

from sluice.audit.checks.exchange import check_exchange
from sluice.audit.records import CHAT, Exchange
from tests.broken_servers import chat_chunk, recorded, sse

ROLE = {"role": "assistant", "content": ""}


def twin_of(text: str) -> Exchange:
    payload = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
    }
    return recorded(CHAT, {"model": "m", "messages": []}, json.dumps(payload).encode())


def findings_of(
    deltas: list[str], *, twin_text: str | None = None, **body_extra
) -> dict[str, list[int]]:
    body = {"model": "m", "messages": [], "stream": True, **body_extra}
    chunks = [
        chat_chunk(0, {"content": d}, "stop" if i == len(deltas) - 1 else None)
        for i, d in enumerate(deltas)
    ]
    twin = twin_of(twin_text) if twin_text is not None else None
    exchange = recorded(CHAT, body, sse(chat_chunk(0, ROLE), *chunks), twin=twin)
    return {f.check_id: f.chunk_numbers for f in check_exchange(exchange)}


def test_a_stream_equal_to_its_twin_has_no_text_finding():
    assert findings_of(["Hel", "lo ", "🦊"], twin_text="Hello 🦊") == {}


def test_replacement_characters_the_twin_lacks_are_flagged_per_chunk():
    found = findings_of(["Hello ", "\ufffd", "\ufffd!"], twin_text="Hello 🦊!")
    assert found["replacement_char"] == [2, 3]
    # The text differs from the twin too, but that is the same anomaly: one id.
    assert "text_mismatch_nonstream" not in found


def test_replacement_characters_the_model_itself_produced_are_not_a_stream_fault():
    assert findings_of(["ab\ufffd", "c"], twin_text="ab\ufffdc") == {}


def test_a_stop_string_in_the_output_leaks():
    found = findings_of(["Hello ", "world"], stop=["wor"])
    assert found == {"stop_leak": [2]}
    assert findings_of(["Hello ", "world"], stop=["wor"], include_stop_str_in_output=True) == {}


def test_a_stop_prefix_sent_and_never_retracted_leaks():
    body = {"model": "m", "messages": [], "stream": True, "stop": [" wor"]}
    chunks = [
        chat_chunk(0, {"content": "Hello"}),
        chat_chunk(0, {"content": " wo"}),
        chat_chunk(0, {}, "stop"),
    ]
    exchange = recorded(
        CHAT, body, sse(chat_chunk(0, ROLE), *chunks), unstopped_texts={0: "Hello world"}
    )
    found = check_exchange(exchange)
    assert [(f.check_id, f.chunk_numbers) for f in found] == [("stop_leak", [2])]


def test_a_repeated_delta_and_the_delta_it_replaced_are_found_against_the_twin():
    found = findings_of(["one", " two", " two", " four"], twin_text="one two three four")
    assert found["duplicate_delta"] == [3]
    assert found["skipped_delta"] == [4]


def test_a_stream_that_simply_differs_is_only_a_determinism_note():
    findings = check_exchange(
        recorded(
            CHAT,
            {"model": "m", "messages": [], "stream": True},
            sse(
                chat_chunk(0, ROLE),
                chat_chunk(0, {"content": "one two"}),
                chat_chunk(0, {"content": " cats"}, "stop"),
            ),
            twin=twin_of("one two three"),
        )
    )
    assert [(f.check_id, f.severity) for f in findings] == [("text_mismatch_nonstream", "note")]


def stopped(deltas: list[str], *, include: bool, unstopped: str) -> dict[str, list[int]]:
    body = {"model": "m", "messages": [], "stream": True, "stop": ["fox"]}
    if include:
        body["include_stop_str_in_output"] = True
    chunks = [
        chat_chunk(0, {"content": d}, "stop" if i == len(deltas) - 1 else None)
        for i, d in enumerate(deltas)
    ]
    exchange = recorded(CHAT, body, sse(chat_chunk(0, ROLE), *chunks))
    exchange.unstopped_texts = {0: unstopped}
    return {f.check_id: f.chunk_numbers for f in check_exchange(exchange)}


def test_include_stop_str_in_output_is_checked_not_skipped():
    unstopped = "The quick brown fox jumps"
    assert stopped(["The quick ", "brown fox"], include=True, unstopped=unstopped) == {}
    # A server that ignores the extension cuts the stop string all the same.
    assert stopped(["The quick ", "brown "], include=True, unstopped=unstopped) == {
        "stop_str_not_included": [2]
    }
    assert stopped(["The quick ", "brown "], include=False, unstopped=unstopped) == {}


def test_a_choice_that_stopped_on_eos_needs_no_stop_string():
    assert stopped(["The end."], include=True, unstopped="The end.") == {}


def test_the_determinism_note_cites_the_chunk_where_the_texts_part():
    found = findings_of(["Hello", " world", ", again"], twin_text="Hello world; again")
    assert found == {"text_mismatch_nonstream": [3]}
