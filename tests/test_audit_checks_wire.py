"""Wire and HTTP error checks on hand-built responses."""

from __future__ import annotations

from sluice.audit.checks.catalogue import severity_of
from sluice.audit.checks.exchange import check_exchange
from sluice.audit.records import CHAT, COMPLETIONS
from tests.broken_servers import chat_chunk, completion_chunk, recorded, sse

STREAM = {"model": "m", "prompt": "p", "stream": True}


def ids(exchange) -> set[str]:
    return {finding.check_id for finding in check_exchange(exchange)}


def test_a_clean_stream_passes_the_wire_checks():
    raw = sse(completion_chunk(0, "hi"), completion_chunk(0, "!", "stop"))
    assert ids(recorded(COMPLETIONS, STREAM, raw)) == set()


def test_an_event_line_is_a_framing_finding_naming_its_chunk():
    raw = b"event: delta\n" + sse(completion_chunk(0, "hi", "stop"))
    findings = check_exchange(recorded(COMPLETIONS, STREAM, raw))
    framing = next(f for f in findings if f.check_id == "framing")
    assert framing.chunk_numbers == [0]
    assert framing.evidence[0].startswith("#0: event: delta\\ndata: ")


def test_a_missing_done_and_bytes_after_done_are_told_apart():
    assert "done_missing" in ids(
        recorded(COMPLETIONS, STREAM, sse(completion_chunk(0, "hi", "stop"), done=False))
    )
    late = sse(completion_chunk(0, "hi", "stop")) + b'data: {"x":1}\n\n'
    assert "done_not_last" in ids(recorded(COMPLETIONS, STREAM, late))


def test_a_wrong_content_type_is_flagged():
    raw = sse(completion_chunk(0, "hi", "stop"))
    assert ids(recorded(COMPLETIONS, STREAM, raw, content_type="application/json")) == {
        "content_type"
    }


ERROR_EVENT = {"error": {"message": "boom", "type": "x", "param": None, "code": None}}
USAGE_STREAM = {**STREAM, "stream_options": {"include_usage": True}}


def test_a_stream_ended_by_an_error_event_and_done_is_one_note_and_nothing_else():
    raw = sse(completion_chunk(0, "hi"), ERROR_EVENT)
    findings = check_exchange(recorded(COMPLETIONS, USAGE_STREAM, raw))
    assert [(f.check_id, f.severity, f.chunk_numbers) for f in findings] == [
        ("stream_ended_by_error", "note", [1])
    ]


def test_an_error_event_followed_by_more_chunks_is_a_break():
    raw = sse(completion_chunk(0, "hi"), ERROR_EVENT, completion_chunk(0, "!", "stop"))
    assert "error_event" in ids(recorded(COMPLETIONS, STREAM, raw))


def test_data_null_events_are_a_break_naming_their_chunk():
    # llama-server opens a multi-prompt completions stream with one.
    raw = b"data: null\n\n" + sse(completion_chunk(0, "hi", "stop"))
    findings = check_exchange(recorded(COMPLETIONS, STREAM, raw))
    assert [(f.check_id, f.severity, f.chunk_numbers) for f in findings] == [
        ("data_null", "break", [0])
    ]


def test_comment_lines_are_a_strict_rule_not_a_framing_break():
    raw = b": ping\n\n" + sse(completion_chunk(0, "hi", "stop"))
    findings = check_exchange(recorded(COMPLETIONS, STREAM, raw))
    assert [(f.check_id, f.severity) for f in findings] == [("comment_line", "strict")]


def test_a_4xx_must_carry_the_openai_error_object():
    good = b'{"error": {"message": "bad", "type": "invalid_request_error", "param": "n", "code": null}}'
    assert ids(recorded(CHAT, {"model": "m"}, good, status=400, expects_error=True)) == set()
    partial = b'{"error": {"message": "bad", "type": "invalid_request_error"}}'
    assert ids(recorded(CHAT, {"model": "m"}, partial, status=400, expects_error=True)) == {
        "bad_error_shape"
    }
    assert ids(
        recorded(
            CHAT, {"model": "m"}, b'{"object": "error", "message": "bad"}', status=404,
            expects_error=True,
        )
    ) == {"bad_error_shape"}  # fmt: skip


def test_an_error_object_without_param_breaks_only_the_strict_rule():
    # llama-server's shape: code, message, type.
    llama = b'{"error":{"code":400,"message":"bad","type":"invalid_request_error"}}'
    findings = check_exchange(recorded(CHAT, {"model": "m"}, llama, status=400, expects_error=True))
    assert [(f.check_id, f.severity) for f in findings] == [("error_param_missing", "strict")]


def test_422_and_500_are_failures_but_503_with_retry_after_is_not():
    def checked(raw: bytes, **fields) -> set[str]:
        return ids(recorded(CHAT, {"model": "m"}, raw, expects_error=True, **fields))

    assert checked(b'{"detail": []}', status=422) == {"status_422"}
    assert checked(b"Internal Server Error", status=500) == {"server_error_5xx"}
    busy = b'{"error": {"message": "busy", "type": "service_unavailable", "param": null, "code": null}}'
    assert checked(busy, status=503, retry_after="1") == set()
    assert checked(busy, status=503) == {"server_error_5xx"}
    assert checked(busy, status=429) == {"retry_after_missing"}


def test_a_valid_request_refused_is_one_note_and_no_usage_check_reads_it():
    """sluice with --max-num-seqs 2 --max-waiting-requests 0 answers 503 with
    Retry-After; vLLM answers 400 to n>1 under greedy sampling."""
    full = b'{"error":{"message":"the waiting queue is full","type":"service_unavailable","param":null,"code":null}}'
    queue_full = recorded(COMPLETIONS, USAGE_STREAM, full, status=503, retry_after="1")
    greedy_n = b'{"error":{"message":"n must be 1 when using greedy sampling, got 2.","type":"BadRequestError","param":null,"code":400}}'
    refused = recorded(CHAT, {**USAGE_STREAM, "n": 2}, greedy_n, status=400)
    for exchange in (queue_full, refused):
        findings = check_exchange(exchange)
        assert [(f.check_id, f.severity) for f in findings] == [("request_refused", "note")]
    assert "greedy sampling" in check_exchange(refused)[0].message


def test_a_transport_error_is_a_connection_error_unless_the_client_abandoned():
    raw = sse(completion_chunk(0, "hi"), done=False)
    broken = recorded(COMPLETIONS, STREAM, raw, transport_error="ClientPayloadError: reset")
    assert "connection_error" in ids(broken)
    abandoned = recorded(COMPLETIONS, STREAM, raw, reader="abandon")
    assert ids(abandoned) == set()


def test_a_timeout_before_any_response_is_capacity_but_a_stalled_stream_is_broken():
    queued = recorded(
        COMPLETIONS, {"model": "m", "prompt": "p"}, b"", status=None,
        transport_error="SocketTimeoutError: Timeout on reading data from socket",
    )  # fmt: skip
    assert ids(queued) == {"timeout_before_response"}
    assert severity_of("timeout_before_response") == "note"
    stalled = recorded(
        COMPLETIONS, STREAM, sse(completion_chunk(0, "hi"), done=False), headers_s=0.1,
        transport_error="SocketTimeoutError: Timeout on reading data from socket",
    )  # fmt: skip
    assert "stream_stalled" in ids(stalled)
    reset = recorded(COMPLETIONS, STREAM, b"", status=None, transport_error="ClientOSError: reset")
    assert "connection_error" in ids(reset)


def test_a_chat_stream_timing_out_after_its_role_chunk_only_waited_for_capacity():
    body = {"model": "m", "messages": [], "stream": True}
    role_only = sse(chat_chunk(0, {"role": "assistant", "content": ""}), done=False)
    queued = recorded(
        CHAT, body, role_only, headers_s=0.1,
        transport_error="SocketTimeoutError: Timeout on reading data from socket",
    )  # fmt: skip
    assert ids(queued) == {"timeout_before_response"}
    reset = recorded(CHAT, body, role_only, headers_s=0.1, transport_error="ClientOSError: reset")
    assert "connection_error" in ids(reset)
