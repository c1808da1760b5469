"""Check a response against the streaming contract (docs: STREAMING_CONTRACT.md).

`check_stream(body, expect)` parses an SSE body and asserts the wire rules,
the shape rules and I1-I5 that a single stream can show by itself; it returns
what each index received, so a test can compare it with the non-streamed body
(`read_body`) and with what the engine generated. Failures are AssertionErrors
naming the rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

DONE_EVENT = b"data: [DONE]\n\n"
_OBJECTS = {"completion": ("text_completion", "text_completion"),
            "chat": ("chat.completion.chunk", "chat.completion")}  # fmt: skip
_ROLE_DELTA = {"role": "assistant", "content": ""}


@dataclass(frozen=True, slots=True)
class Expectations:
    kind: Literal["completion", "chat"]
    num_choices: int
    has_logprobs: bool = False
    include_usage: bool = False
    continuous_usage_stats: bool = False
    # Completions: the first chunk of each index starts with its prompt.
    echo: bool = False
    # Only for generations holding invalid UTF-8 (bytes of a character cut
    # by a special token), where a full decode has U+FFFD too.
    allows_replacement_char: bool = False
    # A stream may end with an error event (then [DONE]) only when the test
    # expects one: a stream that failed half way is not a whole stream.
    allows_error: bool = False


@dataclass(slots=True)
class ChoiceResult:
    """What one index received, streamed or not."""

    text: str = ""
    finish_reason: str | None = None
    stop_reason: Any = None
    num_chunks: int = 0
    # With logprobs, per token in order: string, logprob, completions text_offset.
    token_strings: list[str] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    text_offsets: list[int] = field(default_factory=list)
    # Completions token strings are not trimmed at a stop string; their text is.
    num_tokens_by_usage: int | None = None


@dataclass(slots=True)
class ResponseResult:
    choices: list[ChoiceResult]
    usage: dict[str, int] | None = None
    error: dict[str, Any] | None = None


def parse_sse(body: bytes) -> list[dict[str, Any]]:
    """The JSON payloads of an SSE body, checking the framing; [DONE] must end it."""
    assert body.endswith(DONE_EVENT), "the body must end with data: [DONE]"
    events = body[: -len(DONE_EVENT)].split(b"\n\n")
    assert events[-1] == b"", "every event ends with a blank line"
    payloads = []
    for event in events[:-1]:
        assert event.startswith(b"data: "), f"not a data event: {event[:40]!r}"
        assert b"\n" not in event and b"\r" not in event, "one line of JSON per event"
        assert event != b"data: [DONE]", "[DONE] only at the end"
        payloads.append(orjson.loads(event[6:]))
    return payloads


def check_stream(body: bytes, expect: Expectations) -> ResponseResult:
    payloads = parse_sse(body)
    result = ResponseResult([ChoiceResult() for _ in range(expect.num_choices)])
    if payloads and "error" in payloads[-1]:
        result.error = payloads.pop()["error"]
        assert expect.allows_error, f"the stream ended with an error event: {result.error}"
    _check_envelopes(payloads, expect)
    for position, chunk in enumerate(payloads):
        if chunk["choices"]:
            _check_choice_chunk(chunk, expect, result)
        else:
            assert position == len(payloads) - 1, "the usage chunk comes last"
            assert expect.include_usage, "usage chunk without include_usage"
            assert all(c.finish_reason for c in result.choices), "usage after every finish"
            result.usage = chunk["usage"]
    if result.error is None:
        assert all(c.finish_reason for c in result.choices), "every index finishes (I4)"
        assert (result.usage is not None) == expect.include_usage, "one usage chunk iff asked"
    if result.usage is not None:
        _check_usage_totals(result)
    return result


def read_body(body: bytes, expect: Expectations) -> ResponseResult:
    """A non-streamed body, read into the same shape as a stream."""
    response = orjson.loads(body)
    assert response["object"] == _OBJECTS[expect.kind][1]
    choices = sorted(response["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == list(range(expect.num_choices))
    result = ResponseResult([], usage=response["usage"])
    for choice in choices:
        read = ChoiceResult(finish_reason=choice["finish_reason"], num_chunks=1)
        read.stop_reason = choice["stop_reason"]
        read.text = choice["text"] if expect.kind == "completion" else choice["message"]["content"]
        _collect_logprobs(read, choice["logprobs"], expect)
        result.choices.append(read)
    return result


def _check_envelopes(payloads: list[dict[str, Any]], expect: Expectations) -> None:
    first = payloads[0] if payloads else {}
    for chunk in payloads:
        assert chunk["object"] == _OBJECTS[expect.kind][0], "object name"
        for key in ("id", "created", "model"):
            assert chunk[key] == first[key], f"{key} changes between chunks"
        has_usage = "usage" in chunk and chunk["usage"] is not None
        if chunk["choices"]:
            assert has_usage == expect.continuous_usage_stats, "usage only when asked (I5)"


def _check_choice_chunk(
    chunk: dict[str, Any], expect: Expectations, result: ResponseResult
) -> None:
    for choice in chunk["choices"]:
        seen = result.choices[choice["index"]]
        assert seen.finish_reason is None, "nothing after an index's finish chunk (I4)"
        assert "finish_reason" in choice, "finish_reason key present on every chunk (I4)"
        finish = choice["finish_reason"]
        assert finish in (None, "stop", "length"), f"finish_reason {finish!r}"
        text = _chunk_text(choice, seen, expect)
        assert expect.allows_replacement_char or "\ufffd" not in text, "U+FFFD in a delta"
        assert text or finish or (expect.kind == "chat" and seen.num_chunks == 0), "empty chunk"
        num_before = len(seen.token_strings)
        _collect_logprobs(seen, choice["logprobs"], expect)
        _check_alignment(seen.token_strings[num_before:], text, finish, expect, seen)
        seen.text += text
        seen.num_chunks += 1
        seen.finish_reason, seen.stop_reason = finish, choice.get("stop_reason")
        if expect.continuous_usage_stats:
            _check_continuous_usage(
                chunk["usage"], seen, len(seen.token_strings) - num_before, expect
            )


def _chunk_text(choice: dict[str, Any], seen: ChoiceResult, expect: Expectations) -> str:
    if expect.kind == "completion":
        return choice["text"]
    delta = choice["delta"]
    if seen.num_chunks == 0:
        assert delta == _ROLE_DELTA, "the first chat chunk of an index is the role chunk"
        return ""
    assert "role" not in delta, "role never repeats"
    assert delta == {} or delta.get("content"), "no empty content deltas"
    return delta.get("content") or ""


def _collect_logprobs(seen: ChoiceResult, logprobs: Any, expect: Expectations) -> None:
    if not expect.has_logprobs:
        assert logprobs is None, "logprobs only when asked"
        return
    if logprobs is None:
        return
    if expect.kind == "chat":
        for entry in logprobs["content"]:
            assert bytes(entry["bytes"]) == entry["token"].encode(), "bytes are the token's"
            seen.token_strings.append(entry["token"])
            seen.token_logprobs.append(entry["logprob"])
        return
    sizes = {
        len(logprobs[key]) for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    }
    assert len(sizes) == 1, "completions logprob lists have one entry per token"
    for token, value, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert top[token] == value, "the sampled token is in its own top_logprobs"
    seen.token_strings.extend(logprobs["tokens"])
    seen.token_logprobs.extend(logprobs["token_logprobs"])
    seen.text_offsets.extend(logprobs["text_offset"])


def _check_alignment(
    strings: list[str], text: str, finish: str | None, expect: Expectations, seen: ChoiceResult
) -> None:
    """I3: a chunk's token strings concatenate to its text (minus echo, plus trimming)."""
    if not expect.has_logprobs:
        return
    joined = "".join(strings)
    if seen.num_chunks == 0 and expect.echo:
        # An echoed prompt has no entries: the first token's offset is its length.
        text = text[seen.text_offsets[0] :] if strings else ""
    if finish == "stop":
        assert joined.startswith(text), "token strings cover the chunk text (I3)"
    else:
        assert joined == text, "token strings concatenate to the chunk text (I3)"
    offsets = seen.text_offsets
    for k in range(max(1, len(offsets) - len(strings)), len(offsets)):
        assert offsets[k] == offsets[k - 1] + len(seen.token_strings[k - 1]), "text_offset"


def _check_continuous_usage(
    usage: dict[str, int], seen: ChoiceResult, num_new_tokens: int, expect: Expectations
) -> None:
    previous = seen.num_tokens_by_usage or 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if expect.has_logprobs:
        assert usage["completion_tokens"] == len(seen.token_strings), "usage == tokens (I5)"
    assert usage["completion_tokens"] >= previous, "cumulative usage never goes back (I5)"
    assert num_new_tokens == 0 or usage["completion_tokens"] > previous, "new tokens count (I5)"
    seen.num_tokens_by_usage = usage["completion_tokens"]


def _check_usage_totals(result: ResponseResult) -> None:
    usage = result.usage
    assert usage is not None
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    counts = [c.num_tokens_by_usage for c in result.choices]
    if None not in counts:
        assert usage["completion_tokens"] == sum(counts), "usage totals sum the choices (I5)"
