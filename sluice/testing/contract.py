"""Check a response against the streaming contract (docs: STREAMING_CONTRACT.md)
with the audit's checks: the tests and `sluice audit` share one checker.

`check_stream(body, expect)` runs every per-response check of `sluice.audit`
on an SSE body and fails on any broken invariant, naming the check; it
returns what each index received, so a test can compare it with the
non-streamed body (`read_body`) and with what the engine generated.
`Expectations` say what the request asked for (the audit reads that from a
request body; the tests often have none, so one is written from them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from sluice.audit.checks.exchange import check_exchange, ensure_view
from sluice.audit.records import CHAT, COMPLETIONS, Exchange, Finding
from sluice.audit.sse import parse_sse as parse_events
from sluice.audit.stream_view import ChoiceChunk, StreamView

# Findings that say the stream did not end whole: expected once an error ended it.
_CUT_SHORT = frozenset({"error_event", "finish_reason_count", "index_missing", "usage_placement"})


@dataclass(frozen=True, slots=True)
class Expectations:
    kind: Literal["completion", "chat"]
    num_choices: int
    # The alternatives the request asked for per token (completions `logprobs`,
    # chat `top_logprobs`); None: no logprobs. Every entry must carry that many.
    logprobs: int | None = None
    include_usage: bool = False
    continuous_usage_stats: bool = False
    # Completions: the first chunk of each index starts with its prompt (with
    # logprobs, the prompts' entries come first: give the prompts).
    echo: bool = False
    prompts: tuple[str, ...] = ()
    # The request's stop strings: text they cut may still show in logprob entries.
    stop: tuple[str, ...] = ()
    include_stop_str: bool = False
    min_tokens: int = 0
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
    # The last continuous usage's completion_tokens (continuous usage only).
    num_tokens_by_usage: int | None = None


@dataclass(slots=True)
class ResponseResult:
    choices: list[ChoiceResult]
    usage: dict[str, int] | None = None
    error: dict[str, Any] | None = None


def parse_sse(body: bytes) -> list[dict[str, Any]]:
    """The JSON payloads of an SSE body, which must be well framed and end with [DONE]."""
    parsed = parse_events(body)
    problems = [event.problem for event in parsed.events if event.problem]
    assert not problems, f"framing: {problems[0]}"
    assert parsed.events and parsed.events[-1].is_done and not parsed.trailing, (
        "the body must end with data: [DONE]"
    )
    return [event.payload for event in parsed.events if isinstance(event.payload, dict)]


def check_stream(body: bytes, expect: Expectations) -> ResponseResult:
    exchange = _exchange(body, expect, stream=True)
    result = _checked(exchange, expect)
    assert result.error is None or expect.allows_error, (
        f"the stream ended with an error event: {result.error}"
    )
    return result


def read_body(body: bytes, expect: Expectations) -> ResponseResult:
    """A non-streamed body, checked and read into the same shape as a stream."""
    return _checked(_exchange(body, expect, stream=False), expect)


def _checked(exchange: Exchange, expect: Expectations) -> ResponseResult:
    findings = check_exchange(exchange, include_twin=False)
    result = _result_of(exchange, expect)
    broken = [f for f in findings if f.is_failure and not _allowed(f, expect, result)]
    assert not broken, "; ".join(f"{f.check_id}: {f.message}" for f in broken)
    return result


def _allowed(finding: Finding, expect: Expectations, result: ResponseResult) -> bool:
    if finding.check_id == "replacement_char":
        return expect.allows_replacement_char
    return result.error is not None and finding.check_id in _CUT_SHORT


def _exchange(body: bytes, expect: Expectations, *, stream: bool) -> Exchange:
    request: dict[str, Any] = {
        "stream": stream,
        "n": expect.num_choices // max(1, len(expect.prompts)),
        "echo": expect.echo,
        "prompt": list(expect.prompts),
        "stop": list(expect.stop),
        "include_stop_str_in_output": expect.include_stop_str,
        "min_tokens": expect.min_tokens,
    }
    if stream and expect.include_usage:
        request["stream_options"] = {
            "include_usage": True,
            "continuous_usage_stats": expect.continuous_usage_stats,
        }
    top = expect.logprobs
    if top is not None:
        request.update(
            {"logprobs": True, "top_logprobs": top} if expect.kind == "chat" else {"logprobs": top}
        )
    return Exchange(
        scenario="test",
        target="test",
        endpoint=CHAT if expect.kind == "chat" else COMPLETIONS,
        body=request,
        status=200,
        content_type="text/event-stream" if stream else "application/json",
        raw=body,
    )


def _result_of(exchange: Exchange, expect: Expectations) -> ResponseResult:
    view = ensure_view(exchange)
    payloads = _payloads(exchange, view)
    result = ResponseResult(
        [_choice_of(view.choices.get(i, [])) for i in range(expect.num_choices)]
    )
    for payload in payloads:
        if "error" in payload:
            result.error = payload["error"]
        elif not payload.get("choices") and isinstance(payload.get("usage"), dict):
            result.usage = payload["usage"]
        elif not view.request.is_stream:
            result.usage = payload.get("usage")
        for choice in payload.get("choices") or []:
            if choice.get("finish_reason") is not None and "stop_reason" in choice:
                result.choices[choice["index"]].stop_reason = choice["stop_reason"]
    return result


def _payloads(exchange: Exchange, view: StreamView) -> list[dict[str, Any]]:
    if view.sse is not None:
        return [event.payload for event in view.sse.events if isinstance(event.payload, dict)]
    return [orjson.loads(exchange.raw)]


def _choice_of(chunks: list[ChoiceChunk]) -> ChoiceResult:
    entries = [entry for chunk in chunks for entry in chunk.logprobs or []]
    usages = [chunk.usage for chunk in chunks if chunk.usage is not None]
    finishes = [chunk.finish_reason for chunk in chunks if chunk.finish_reason is not None]
    return ChoiceResult(
        text="".join(chunk.text for chunk in chunks),
        finish_reason=finishes[-1] if finishes else None,
        num_chunks=len(chunks),
        token_strings=[entry.token for entry in entries],
        token_logprobs=[entry.logprob for entry in entries],
        text_offsets=[entry.text_offset for entry in entries if entry.text_offset is not None],
        num_tokens_by_usage=usages[-1]["completion_tokens"] if usages else None,
    )
