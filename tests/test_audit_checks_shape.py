"""Chunk shape checks (ids, roles, finish reasons, indices, empty chunks)."""

from __future__ import annotations

from sluice.audit.checks.exchange import check_exchange
from sluice.audit.records import CHAT, COMPLETIONS
from tests.broken_servers import chat_chunk, completion_chunk, recorded, sse
from tests.peer_shapes import LLAMA_CREATED, llama_completion_chunk, llama_stream

CHAT_STREAM = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
ROLE = {"role": "assistant", "content": ""}


def findings_of(endpoint: str, body: dict, *payloads) -> dict[str, list[int]]:
    found = check_exchange(recorded(endpoint, body, sse(*payloads)))
    return {finding.check_id: finding.chunk_numbers for finding in found}


def test_a_correct_chat_stream_has_no_shape_finding():
    found = findings_of(
        CHAT,
        CHAT_STREAM,
        chat_chunk(0, ROLE),
        chat_chunk(0, {"content": "Hi"}),
        chat_chunk(0, {}, "stop"),
    )
    assert found == {}


def test_a_repeated_role_and_a_missing_role_chunk_are_flagged():
    repeated = findings_of(
        CHAT,
        CHAT_STREAM,
        chat_chunk(0, ROLE),
        chat_chunk(0, {"role": "assistant", "content": "Hi"}, "stop"),
    )
    assert repeated == {"role_repeated": [1]}
    missing = findings_of(CHAT, CHAT_STREAM, chat_chunk(0, {"content": "Hi"}, "stop"))
    assert missing == {"role_not_first": [0]}


def test_two_finish_reasons_for_one_index_are_counted():
    found = findings_of(
        CHAT,
        CHAT_STREAM,
        chat_chunk(0, ROLE),
        chat_chunk(0, {"content": "Hi"}, "length"),
        chat_chunk(0, {}, "length"),
    )
    assert found == {"finish_reason_count": [1, 2]}


def test_text_after_the_finish_chunk_and_an_empty_string_finish_are_flagged():
    found = findings_of(
        COMPLETIONS,
        {"model": "m", "prompt": "p", "stream": True},
        completion_chunk(0, "a", ""),
        completion_chunk(0, "b", "stop"),
        completion_chunk(0, "c"),
    )
    assert found == {"finish_reason_empty_string": [0], "finish_reason_not_last": [1, 2]}


def test_a_changed_id_and_an_empty_chunk_are_flagged():
    changed = completion_chunk(0, "b", "stop")
    changed["id"] = "cmpl-2"
    found = findings_of(
        COMPLETIONS,
        {"model": "m", "prompt": "p", "stream": True},
        completion_chunk(0, "a"),
        completion_chunk(0, ""),
        changed,
    )
    assert found == {"id_changed": [0, 2], "empty_chunk": [1]}


def test_list_prompts_with_n_must_stream_indices_prompt_index_times_n_plus_i():
    body = {"model": "m", "prompt": ["a", "b"], "n": 2, "stream": True}
    chunks = [completion_chunk(index, "x", "stop") for index in (0, 1, 2, 3)]
    assert findings_of(COMPLETIONS, body, *chunks) == {}
    found = findings_of(COMPLETIONS, body, *chunks[:3], completion_chunk(4, "x", "stop"))
    assert set(found) == {"index_unexpected", "index_missing"}


def test_created_changing_between_chunks_names_created_and_both_values():
    """llama-server stamps each chunk with the time it was built."""
    raw = llama_stream(
        llama_completion_chunk("a"),
        llama_completion_chunk("b", created=LLAMA_CREATED + 1),
        llama_completion_chunk("c", "length", created=LLAMA_CREATED + 1),
    )
    body = {"model": "m", "prompt": "p", "stream": True}
    (changed,) = [f for f in check_exchange(recorded(COMPLETIONS, body, raw))]
    assert changed.check_id == "id_changed"
    assert changed.message.startswith(
        f"created changed: chunk #0 has {LLAMA_CREATED}, chunk #1 {LLAMA_CREATED + 1}"
    )
    assert changed.cause == "created differs between chunks of one response"
    assert changed.chunk_numbers == [0, 1, 2]
