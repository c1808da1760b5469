"""Usage checks: unrequested, placement, exactness, frozen counters."""

from __future__ import annotations

from sluice.audit.checks.exchange import check_exchange
from sluice.audit.records import COMPLETIONS
from tests.broken_servers import completion_chunk, recorded, sse, usage_chunk

INCLUDE = {"include_usage": True}
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


def body(**extra) -> dict:
    return {"model": "m", "prompt": "p", "stream": True, **extra}


def usage(completion: int) -> dict:
    return {"prompt_tokens": 2, "completion_tokens": completion, "total_tokens": 2 + completion}


def logprobs(*tokens: str) -> dict:
    return {
        "tokens": list(tokens),
        "token_logprobs": [-0.1 * (i + 1) for i in range(len(tokens))],
        "top_logprobs": [{token: -0.1 * (i + 1)} for i, token in enumerate(tokens)],
        "text_offset": [0] * len(tokens),
    }


def findings_of(request: dict, *payloads, **fields) -> dict[str, list[int]]:
    found = check_exchange(recorded(COMPLETIONS, request, sse(*payloads), **fields))
    return {finding.check_id: finding.chunk_numbers for finding in found}


def test_usage_without_include_usage_is_unrequested_on_every_chunk_that_has_it():
    found = findings_of(
        body(),
        completion_chunk(0, "a", usage=usage(1)),
        completion_chunk(0, "b", "length", usage=usage(2)),
    )
    assert found == {"usage_unrequested": [0, 1]}


def test_include_usage_wants_one_final_usage_chunk_after_the_finish():
    good = findings_of(
        body(stream_options=INCLUDE),
        completion_chunk(0, "a", "length"),
        usage_chunk("completion", 2, 1),
    )
    assert good == {}
    missing = findings_of(body(stream_options=INCLUDE), completion_chunk(0, "a", "length"))
    assert missing == {"usage_placement": [0]}
    early = findings_of(
        body(stream_options=INCLUDE),
        usage_chunk("completion", 2, 1),
        completion_chunk(0, "a", "length"),
    )
    assert early == {"usage_placement": [0]}


def test_totals_must_add_up_and_match_the_tokens_delivered():
    wrong_total = usage_chunk("completion", 2, 1)
    wrong_total["usage"]["total_tokens"] = 9
    found = findings_of(
        body(stream_options=INCLUDE), completion_chunk(0, "a", "length"), wrong_total
    )
    assert found == {"usage_inexact": [1]}
    counted = findings_of(
        body(stream_options=INCLUDE, logprobs=1),
        completion_chunk(0, "ab", "length", logprobs=logprobs("a", "b")),
        usage_chunk("completion", 2, 3),
    )
    assert counted == {"usage_inexact": [1]}


def test_continuous_usage_frozen_on_a_chunk_with_new_text_is_flagged():
    found = findings_of(
        body(stream_options=CONTINUOUS),
        completion_chunk(0, "a", usage=usage(1)),
        completion_chunk(0, "b", usage=usage(1)),
        completion_chunk(0, "c", "length", usage=usage(3)),
        usage_chunk("completion", 2, 3),
    )
    assert found == {"usage_frozen": [1]}


def test_continuous_usage_running_ahead_of_the_logprob_count_is_inexact():
    found = findings_of(
        body(stream_options=CONTINUOUS, logprobs=1),
        completion_chunk(0, "ab", logprobs=logprobs("a", "b"), usage=usage(3)),
        completion_chunk(0, "c", "length", logprobs=logprobs("c"), usage=usage(4)),
        usage_chunk("completion", 2, 3),
    )
    assert found == {"usage_inexact": [0, 1]}


def test_one_unshown_eos_token_is_allowed_on_a_stop_finish():
    found = findings_of(
        body(stream_options=CONTINUOUS, logprobs=1),
        completion_chunk(0, "ab", logprobs=logprobs("a", "b"), usage=usage(2)),
        completion_chunk(0, "", "stop", logprobs=logprobs(), usage=usage(3)),
        usage_chunk("completion", 2, 3),
    )
    assert found == {}


def test_the_final_usage_must_match_a_non_streamed_twin_with_the_same_text():
    twin = recorded(
        COMPLETIONS,
        {"model": "m", "prompt": "p"},
        b'{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"a","finish_reason":"length"}],'
        b'"usage":{"prompt_tokens":2,"completion_tokens":4,"total_tokens":6}}',
    )
    found = findings_of(
        body(stream_options=INCLUDE),
        completion_chunk(0, "a", "length"),
        usage_chunk("completion", 2, 1),
        twin=twin,
    )
    assert found == {"usage_inexact": [1]}
