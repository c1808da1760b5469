"""Usage checks: unrequested, placement, exactness, frozen counters."""

from __future__ import annotations

from sluice.audit.checks.exchange import check_exchange
from sluice.audit.records import CHAT, COMPLETIONS
from tests.broken_servers import completion_chunk, recorded, sse, usage_chunk
from tests.peer_shapes import (
    llama_chat_chunk,
    llama_completion_chunk,
    llama_logprob_entry,
    llama_stream,
    llama_usage,
    vllm_completion_chunk,
    vllm_stream,
)

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
    assert found == {"usage_continuous_inexact": [0, 1]}


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


# --- llama-server's and vLLM's shapes (tests/peer_shapes.py) ---------------------------------


def peer_findings(request: dict, raw: bytes) -> dict[str, list[str]]:
    found = check_exchange(recorded(COMPLETIONS, request, raw))
    return {finding.check_id: finding.message for finding in found}


def test_usage_on_the_finish_chunk_alone_is_not_checked_as_continuous_usage():
    """llama-server puts usage on its finish chunk only: there is no continuous
    count to compare, and its 32 tokens are not "expected 0"."""
    entries = [llama_logprob_entry(t, -0.1, [(t, -0.1)]) for t in ("a", "b")]
    raw = llama_stream(
        llama_completion_chunk("ab", logprobs=entries),
        llama_completion_chunk("", "length", usage=llama_usage(3, 2), logprobs=[]),
    )
    found = peer_findings(body(stream_options=CONTINUOUS, logprobs=1, max_tokens=2), raw)
    assert "usage_continuous_inexact" not in found and "usage_frozen" not in found
    assert "usage_inexact" not in found


def test_continuous_usage_counts_tokens_of_chunks_that_carried_no_usage():
    found = findings_of(
        body(stream_options=CONTINUOUS, logprobs=1),
        completion_chunk(0, "ab", logprobs=logprobs("a", "b"), usage=usage(2)),
        completion_chunk(0, "c", logprobs=logprobs("c")),
        completion_chunk(0, "d", "length", logprobs=logprobs("d"), usage=usage(4)),
        usage_chunk("completion", 2, 4),
    )
    assert found == {"usage_continuous_missing": [1]}


def test_fewer_logprob_entries_than_max_tokens_by_length_blame_the_logprobs_not_the_usage():
    """llama-server merges the tokens of one character into one entry: 4 tokens
    generated (finished by length at max_tokens 4), usage 4, 3 entries."""
    entries = [llama_logprob_entry(token, -0.2, [(token, -0.2)]) for token in ("Tok", "yo", " 東")]
    raw = llama_stream(
        llama_completion_chunk("Tokyo 東", logprobs=entries),
        llama_completion_chunk("", "length", usage=llama_usage(3, 4), logprobs=[]),
    )
    found = peer_findings(body(stream_options=INCLUDE, logprobs=1, max_tokens=4), raw)
    assert "usage_inexact" not in found
    assert (
        found["logprob_count"]
        == "3 logprob entries for 4 tokens (finished by length at max_tokens)"
    )


def test_llama_servers_usage_on_its_finish_chunk_is_a_placement_break():
    raw = llama_stream(
        llama_completion_chunk("ab"),
        llama_completion_chunk("", "length", usage=llama_usage(3, 2)),
    )
    found = check_exchange(recorded(COMPLETIONS, body(stream_options=INCLUDE, max_tokens=2), raw))
    assert [(f.check_id, f.cause, f.chunk_numbers) for f in found] == [
        (
            "usage_placement",
            "usage on the finish chunk instead of a usage chunk with choices: []",
            [1],
        ),
    ]


def test_llama_servers_multi_prompt_finish_chunks_with_usage_are_the_same_one_cause():
    raw = llama_stream(
        None,
        llama_completion_chunk("a", index=0),
        llama_completion_chunk("b", index=1),
        llama_completion_chunk("", "length", usage=llama_usage(3, 1), index=1),
        llama_completion_chunk("", "length", usage=llama_usage(4, 1), index=0),
    )
    request = {"model": "m", "prompt": ["p", "q"], "stream": True, "max_tokens": 1}
    found = check_exchange(recorded(COMPLETIONS, {**request, "stream_options": INCLUDE}, raw))
    placement = [(f.cause, f.message) for f in found if f.check_id == "usage_placement"]
    assert placement == [
        (
            "usage on the finish chunk instead of a usage chunk with choices: []",
            "usage on 2 finish chunks, no usage chunk with choices: []",
        )
    ]


def test_one_usage_chunk_per_choice_is_its_own_cause_not_a_missing_usage_chunk():
    raw = llama_stream(
        llama_chat_chunk(0, {"role": "assistant", "content": None}),
        llama_chat_chunk(0, {"content": "Hi"}),
        llama_chat_chunk(1, {"role": "assistant", "content": None}),
        llama_chat_chunk(1, {"content": "Hi"}),
        llama_chat_chunk(0, {}, "length"),
        llama_chat_chunk(0, {}, usage=llama_usage(31, 1)),
        llama_chat_chunk(1, {}, "length"),
        llama_chat_chunk(1, {}, usage=llama_usage(31, 1)),
    )
    request = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "n": 2,
        "max_tokens": 1,
        "stream": True,
        "stream_options": INCLUDE,
    }
    found = check_exchange(recorded(CHAT, request, raw))
    assert [(f.check_id, f.cause, f.chunk_numbers) for f in found] == [
        ("usage_placement", "one usage chunk with choices: [] per choice", [5, 7]),
    ]
    assert found[0].message.startswith("2 usage chunks with choices: [], one per choice")


def test_a_stream_without_any_usage_is_missing_its_usage_chunk():
    raw = llama_stream(llama_completion_chunk("ab"), llama_completion_chunk("", "length"))
    found = check_exchange(recorded(COMPLETIONS, body(stream_options=INCLUDE, max_tokens=2), raw))
    assert [(f.check_id, f.cause) for f in found] == [
        ("usage_placement", "no usage chunk with choices: []; expected one, last before [DONE]"),
    ]


def test_vllms_null_usage_on_content_chunks_is_no_usage():
    raw = vllm_stream(
        vllm_completion_chunk("ab"),
        vllm_completion_chunk("c", "length"),
        {**vllm_completion_chunk("", None), "choices": [], "usage": usage(3)},
    )
    assert peer_findings(body(stream_options=INCLUDE, max_tokens=3), raw) == {}
