"""Logprob checks: counts, copies, non-finite values, byte alignment with hold-backs."""

from __future__ import annotations

from sluice.audit.checks.exchange import check_exchange
from sluice.audit.records import CHAT, COMPLETIONS
from tests.broken_servers import chat_chunk, completion_chunk, recorded, sse
from tests.peer_shapes import llama_completion_chunk, llama_logprob_entry, llama_stream

ROLE = {"role": "assistant", "content": ""}


def entry(token: bytes, logprob: float, top: int = 2) -> dict:
    alternatives = [
        {"token": token.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(token)}
    ]
    alternatives += [
        {"token": f"x{k}", "logprob": logprob - k, "bytes": list(f"x{k}".encode())}
        for k in range(1, top)
    ]
    return {
        "token": token.decode("utf-8", "replace"),
        "logprob": logprob,
        "bytes": list(token),
        "top_logprobs": alternatives,
    }


def chat(*entries: dict) -> dict:
    return {"content": list(entries)}


def findings_of(*payloads, **body_extra) -> dict[str, list[int]]:
    body = {
        "model": "m",
        "messages": [],
        "stream": True,
        "logprobs": True,
        "top_logprobs": 2,
        **body_extra,
    }
    found = check_exchange(recorded(CHAT, body, sse(chat_chunk(0, ROLE), *payloads)))
    return {finding.check_id: finding.chunk_numbers for finding in found}


def test_multi_token_chunks_with_matching_entries_pass():
    found = findings_of(
        chat_chunk(
            0,
            {"content": "Hello world"},
            logprobs=chat(entry(b"Hello", -0.1), entry(b" world", -0.2)),
        ),
        chat_chunk(0, {"content": "!"}, "length", logprobs=chat(entry(b"!", -0.3))),
    )
    assert found == {}


def test_a_character_split_across_tokens_may_be_held_back_until_complete():
    emoji = "🦊".encode()
    found = findings_of(
        chat_chunk(0, {"content": "a"}, logprobs=chat(entry(b"a", -0.1), entry(emoji[:2], -0.2))),
        chat_chunk(0, {"content": "🦊"}, "length", logprobs=chat(entry(emoji[2:], -0.3))),
    )
    assert found == {}


def test_entries_that_do_not_spell_the_text_are_misaligned():
    found = findings_of(
        chat_chunk(0, {"content": "Hello"}, logprobs=chat(entry(b"Help", -0.1))),
        chat_chunk(0, {"content": "!"}, "length", logprobs=chat(entry(b"!", -0.3))),
    )
    assert found == {"logprob_alignment": [1]}


def test_stop_trimming_and_a_held_back_stop_prefix_are_allowed():
    found = findings_of(
        chat_chunk(0, {"content": "ab"}, logprobs=chat(entry(b"ab", -0.1), entry(b" S", -0.2))),
        chat_chunk(0, {}, "stop", logprobs=chat(entry(b"TOP!", -0.3))),
        stop=[" STOP"],
    )
    assert found == {}


def test_the_first_tokens_logprobs_copied_onto_other_tokens_are_flagged():
    copied = entry(b"Hello", -0.1)
    other = dict(copied, token=" world", bytes=list(b" world"))
    found = findings_of(
        chat_chunk(0, {"content": "Hello world"}, "length", logprobs=chat(copied, other))
    )
    assert found == {"logprob_copied": [1]}


def test_non_finite_logprobs_and_missing_alternatives_are_flagged():
    found = findings_of(
        chat_chunk(0, {"content": "a"}, logprobs=chat(entry(b"a", float("-inf")))),
        chat_chunk(0, {"content": "b"}, "length", logprobs=chat(entry(b"b", -0.1, top=1))),
    )
    assert found == {"logprob_nonfinite": [1], "logprob_count": [2]}


def test_logprobs_nobody_asked_for_are_flagged():
    body = {"model": "m", "prompt": "p", "stream": True}
    lp = {
        "tokens": ["a"],
        "token_logprobs": [-0.1],
        "top_logprobs": [{"a": -0.1}],
        "text_offset": [0],
    }
    found = check_exchange(
        recorded(COMPLETIONS, body, sse(completion_chunk(0, "a", "length", logprobs=lp)))
    )
    assert [f.check_id for f in found] == ["logprob_count"]


def test_completions_text_offset_must_continue_like_the_non_streamed_twin():
    def lp(token: str, offset: int) -> dict:
        return {
            "tokens": [token],
            "token_logprobs": [-0.1],
            "top_logprobs": [{token: -0.1}],
            "text_offset": [offset],
        }

    twin_body = (
        b'{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"ab",'
        b'"logprobs":{"tokens":["a","b"],"token_logprobs":[-0.1,-0.1],"top_logprobs":[{"a":-0.1},{"b":-0.1}],'
        b'"text_offset":[0,1]},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}'
    )
    twin = recorded(COMPLETIONS, {"model": "m", "prompt": "p", "logprobs": 1}, twin_body)
    body = {"model": "m", "prompt": "p", "stream": True, "logprobs": 1}
    restarted = sse(
        completion_chunk(0, "a", logprobs=lp("a", 0)),
        completion_chunk(0, "b", "length", logprobs=lp("b", 0)),
    )
    found = check_exchange(recorded(COMPLETIONS, body, restarted, twin=twin))
    assert [(f.check_id, f.chunk_numbers) for f in found] == [("logprob_text_offset", [1])]


def shifted(token: bytes, logprob: float, previous: dict) -> dict:
    """An entry carrying its own token and logprob but another position's alternatives."""
    return {**entry(token, logprob), "top_logprobs": previous["top_logprobs"]}


def test_a_greedy_token_heading_its_alternatives_passes():
    found = findings_of(
        chat_chunk(0, {"content": "ab"}, logprobs=chat(entry(b"a", -0.1), entry(b"b", -0.7))),
        chat_chunk(0, {"content": "c"}, "length", logprobs=chat(entry(b"c", -2.0))),
        temperature=0,
    )
    assert found == {}


def test_greedy_alternatives_attributed_to_the_next_token_are_flagged():
    first = entry(b"a", -0.1)
    found = findings_of(
        chat_chunk(0, {"content": "a"}, logprobs=chat(first)),
        chat_chunk(0, {"content": "b"}, "length", logprobs=chat(shifted(b"b", -0.7, first))),
        temperature=0,
    )
    assert found == {"logprob_greedy_head": [2]}


def test_a_greedy_token_listed_below_another_is_flagged_even_with_its_own_logprob():
    lower = entry(b"a", -0.5)
    lower["top_logprobs"] = [{"token": "z", "logprob": -0.2, "bytes": [122]}] + lower[
        "top_logprobs"
    ][:1]
    found = findings_of(
        chat_chunk(0, {"content": "a"}, "length", logprobs=chat(lower)), temperature=0
    )
    assert found == {"logprob_greedy_head": [1]}


def test_a_greedy_tie_for_first_place_is_accepted():
    tied = entry(b"a", -0.5)
    tied["top_logprobs"] = [{"token": "z", "logprob": -0.5, "bytes": [122]}] + tied["top_logprobs"][
        :1
    ]
    found = findings_of(
        chat_chunk(0, {"content": "a"}, "length", logprobs=chat(tied)), temperature=0
    )
    assert found == {}


def test_sampled_tokens_need_not_head_their_alternatives():
    first = entry(b"a", -0.1)
    found = findings_of(
        chat_chunk(0, {"content": "a"}, logprobs=chat(first)),
        chat_chunk(0, {"content": "b"}, "length", logprobs=chat(shifted(b"b", -0.7, first))),
        temperature=0.8,
    )
    assert found == {}


def echoed(tokens: list[str], logprobs: list[float | None]) -> dict:
    """Completions logprobs for `tokens` from offset 0; each heads its two alternatives."""
    offsets = [sum(len(t) for t in tokens[:k]) for k in range(len(tokens))]
    tops = [None if lp is None else {t: lp, "zz": lp - 1} for t, lp in zip(tokens, logprobs, strict=True)]  # fmt: skip
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops,
            "text_offset": offsets}  # fmt: skip


def echo_findings(logprobs: list[float | None], **body_extra) -> dict[str, list[int]]:
    body = {"model": "m", "prompt": "Say", "echo": True, "stream": True, "logprobs": 1,
            "temperature": 0, **body_extra}  # fmt: skip
    lp = echoed(["S", "ay", "!"], logprobs)
    chunks = sse(completion_chunk(0, "Say!", "length", logprobs=lp))
    return {
        f.check_id: f.chunk_numbers for f in check_exchange(recorded(COMPLETIONS, body, chunks))
    }


def test_echoed_prompt_entries_may_open_with_a_null_logprob_and_are_not_sampled():
    # The prompt's second token is not the most likely one: it was given, not sampled.
    lp = echoed(["S", "ay", "!"], [None, -3.0, -0.1])
    lp["top_logprobs"][1] = {"ay": -3.0, "ey": -0.5}
    body = {"model": "m", "prompt": "Say", "echo": True, "stream": True, "logprobs": 1,
            "temperature": 0}  # fmt: skip
    chunks = sse(completion_chunk(0, "Say!", "length", logprobs=lp))
    assert check_exchange(recorded(COMPLETIONS, body, chunks)) == []


def test_a_null_logprob_on_a_generated_token_is_still_flagged_under_echo():
    assert "logprob_nonfinite" in echo_findings([None, -1.0, None])
    assert "logprob_nonfinite" in echo_findings([None, -1.0, -0.1], echo=False)


def test_entries_whose_strings_collide_are_not_judged_by_string():
    """Byte pieces of one character share the string "" (vLLM) or U+FFFD: keyed by
    string, their alternatives collapse, so count and greedy-head skip them."""
    piece = {"token": "", "logprob": -1.1, "bytes": [0xE6],
             "top_logprobs": [{"token": "", "logprob": -1.1, "bytes": [0xE6]},
                              {"token": "", "logprob": -1.7, "bytes": [0xE7]}]}  # fmt: skip
    rest = entry("本".encode()[1:], -0.2)
    found = findings_of(
        chat_chunk(0, {"content": "本"}, "length", logprobs=chat({**piece, "bytes": [0xE6]}, rest)),
        temperature=0,
    )
    assert "logprob_greedy_head" not in found and "logprob_count" not in found


def test_a_special_token_cut_by_a_stop_string_still_counts_its_delivered_prefix():
    """skip_special_tokens false and stop "|": "<|sep|>" is cut to "<", and the
    entry's other bytes are the trimmed stop string and what followed it."""
    special = {**entry(b"<|sep|>", -0.4), "token": "<|sep|>"}
    found = findings_of(
        chat_chunk(0, {"content": "a"}, logprobs=chat(entry(b"a", -0.1))),
        chat_chunk(0, {"content": "<"}, "stop", logprobs=chat(special)),
        stop=["|"],
    )
    assert found == {}


def test_chat_shaped_logprobs_on_completions_are_a_shape_break_and_still_checked():
    """llama-server's completions logprobs: read in chat's shape, so the
    greedy-head check still sees alternatives given to the wrong token."""
    body = {"model": "m", "prompt": "p", "stream": True, "logprobs": 1, "temperature": 0}
    entries = [
        llama_logprob_entry("Hello", -0.1, [("Hello", -0.1)]),
        llama_logprob_entry(" world", -0.2, [("Hello", -0.1)]),  # the previous token's
    ]
    raw = llama_stream(llama_completion_chunk("Hello world", "length", logprobs=entries))
    found = {f.check_id: f for f in check_exchange(recorded(COMPLETIONS, body, raw))}
    assert set(found) == {"logprob_shape", "logprob_greedy_head"}
    assert found["logprob_shape"].chunk_numbers == [0]
    assert "no logprobs object" not in found["logprob_shape"].message
