"""The contract checker used by the streaming tests (the audit's checks) catches what it
claims to, naming the audit's check."""

from __future__ import annotations

import orjson
import pytest

from sluice.testing.contract import Expectations, check_stream, parse_sse

CHAT = Expectations("chat", 1)


def sse(*chunks: dict, done: bool = True) -> bytes:
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def chunk(delta: dict, finish: str | None = None, **extra) -> dict:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice], **extra}  # fmt: skip


ROLE = chunk({"role": "assistant", "content": ""})


def test_a_well_formed_stream_passes_and_is_read_back():
    result = check_stream(sse(ROLE, chunk({"content": "hi"}), chunk({}, "stop")), CHAT)
    assert (result.choices[0].text, result.choices[0].finish_reason) == ("hi", "stop")


@pytest.mark.parametrize(
    ("body", "rule"),
    [
        (sse(ROLE, chunk({"content": "hi"}, "stop"), done=False), "done_missing"),
        (sse(ROLE, chunk({"content": "hi"})), "finish_reason_count"),
        (
            sse(ROLE, chunk({"content": "a"}, "stop"), chunk({"content": "b"})),
            "finish_reason_not_last",
        ),
        (sse(ROLE, chunk({"role": "assistant", "content": "a"}, "stop")), "role_repeated"),
        (sse(ROLE, chunk({"content": ""}), chunk({}, "stop")), "empty_chunk"),
        (sse(ROLE, chunk({"content": "\ufffd"}, "stop")), "replacement_char"),
        (sse(ROLE, chunk({"content": "a"}, "abort")), "finish_reason_invalid"),
        (sse(chunk({"content": "a"}, "stop")), "role_not_first"),
        (sse(ROLE, {**chunk({}, "stop"), "id": "other"}), "id_changed"),
    ],
)
def test_a_broken_stream_is_refused_naming_the_rule(body: bytes, rule: str):
    with pytest.raises(AssertionError, match=rule):
        check_stream(body, CHAT)


def test_continuous_usage_may_not_run_ahead_of_the_tokens():
    expect = Expectations("chat", 1, logprobs=0, include_usage=True, continuous_usage_stats=True)
    entry = {"token": "a", "logprob": -1.0, "bytes": [97], "top_logprobs": []}
    # One token delivered; an unshown EOS would explain one more, not two.
    usage = {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
    content = chunk({"content": "a"}, "stop", usage=usage)
    content["choices"][0]["logprobs"] = {"content": [entry]}
    role = {**ROLE, "usage": {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1}}
    with pytest.raises(AssertionError, match="usage_inexact"):
        check_stream(sse(role, content, {**chunk({}), "choices": [], "usage": usage}), expect)


def test_events_must_be_single_data_lines():
    with pytest.raises(AssertionError, match="framing"):
        parse_sse(b"event: x\n\ndata: [DONE]\n\n")


def test_a_stream_that_failed_half_way_passes_only_when_the_error_is_expected():
    error = {"error": {"message": "the engine died", "type": "service_unavailable"}}
    body = sse(ROLE, chunk({"content": "hi"}), error)
    with pytest.raises(AssertionError, match="ended with an error event"):
        check_stream(body, CHAT)
    result = check_stream(body, Expectations("chat", 1, allows_error=True))
    assert result.error == error["error"] and result.choices[0].text == "hi"


def test_too_few_logprob_alternatives_fail_whatever_the_body_shows():
    def logprobs(num_alternatives: int) -> dict:
        alternatives = [
            {"token": t, "logprob": -2.0, "bytes": [ord(t)]} for t in "xyz"[:num_alternatives]
        ]
        entry = {"token": "a", "logprob": -1.0, "bytes": [97], "top_logprobs": alternatives}
        return {"content": [entry]}

    def body(num_alternatives: int) -> bytes:
        token = chunk({"content": "a"})
        token["choices"][0]["logprobs"] = logprobs(num_alternatives)
        return sse(ROLE, token, chunk({}, "stop"))

    asked_for_two = Expectations("chat", 1, logprobs=2)
    check_stream(body(2), asked_for_two)
    # One alternative in every entry: the expectation is the request's two, not
    # the fewest the body itself shows.
    with pytest.raises(AssertionError, match="logprob"):
        check_stream(body(1), asked_for_two)
