"""Checks of usage reporting (STREAMING_CONTRACT.md, I5).

No usage unless asked. `include_usage`: exactly one chunk with `choices: []`
and the totals, last before `[DONE]`. `continuous_usage_stats` (a vLLM
extension, checked once some content chunk carries usage: a server without
it was told so by preflight): every chunk carries cumulative usage whose
`completion_tokens` equals the tokens delivered so far for that index
(counted from logprob entries when the request asked for them), never
repeated on a chunk that carried new text.

Tokens are countable from logprobs only; without them the totals are compared
to the non-streamed twin's usage when both produced the same text. A server
may count an EOS token it does not show: one extra token is allowed on an
index that finished with "stop". When every index finished with "length" and
the usage says max_tokens each, the usage is right by definition: fewer
entries are the logprobs' fault (`logprob_count`), not the usage's.

Only complete 200 responses are read: a refusal has no usage to check.
"""

from __future__ import annotations

from typing import Any

from sluice.audit.checks.evidence import finding
from sluice.audit.records import Exchange, Finding
from sluice.audit.stream_view import ChoiceChunk, StreamView, is_prompt_entry, view_of


def check_usage(exchange: Exchange, view: StreamView) -> list[Finding]:
    if exchange.status != 200:
        return []
    if not view.request.is_stream:
        return _check_totals(exchange, view, [c for c in view.chunks if c.usage])
    usage_chunks = [chunk for chunk in view.chunks if chunk.usage is not None]
    if not view.request.include_usage:
        if not usage_chunks:
            return []
        message = (
            f"{len(usage_chunks)} chunks carry usage; stream_options.include_usage was not set"
        )
        numbers = [chunk.number for chunk in usage_chunks]
        return [finding("usage_unrequested", exchange, message, numbers, view=view)]
    findings = _check_placement(exchange, view)
    findings += _check_totals(
        exchange, view, [c for c in view.chunks if c.num_choices == 0 and c.usage]
    )
    if view.request.continuous_usage:
        for index, chunks in view.choices.items():
            findings += _check_continuous(exchange, view, chunks, view.echo_chars(index))
    return findings


def _check_placement(exchange: Exchange, view: StreamView) -> list[Finding]:
    chunks = [chunk for chunk in view.chunks if not chunk.is_error]
    finals = [chunk for chunk in chunks if chunk.num_choices == 0 and chunk.usage is not None]
    with_choices = [chunk for chunk in chunks if chunk.num_choices > 0]
    carried = [chunk for chunk in with_choices if chunk.usage is not None]
    findings = []
    is_complete = exchange.reader != "abandon" and exchange.transport_error is None
    finishing = {
        c.number for cs in view.choices.values() for c in cs if c.finish_reason is not None
    }
    on_finish = bool(carried) and all(chunk.number in finishing for chunk in carried)
    if is_complete and (len(finals) != 1 or finals[0] is not chunks[-1]):
        findings.append(_misplaced(exchange, view, chunks, finals, carried, on_finish))
    if view.request.continuous_usage:
        bare = [chunk.number for chunk in with_choices if chunk.usage is None]
        message = f"{len(bare)} chunks without usage under continuous_usage_stats"
        if bare:
            findings.append(finding("usage_continuous_missing", exchange, message, bare, view=view))
    elif carried and not (is_complete and not finals and on_finish):
        message = f"{len(carried)} content chunks carry usage without continuous_usage_stats"
        numbers = [chunk.number for chunk in carried]
        findings.append(finding("usage_placement", exchange, message, numbers, view=view))
    return findings


def _misplaced(
    exchange: Exchange,
    view: StreamView,
    chunks: list[Any],
    finals: list[Any],
    carried: list[Any],
    on_finish: bool,
) -> Finding:
    """One finding naming the shape: usage on the finish chunk (llama-server's
    completions), one usage chunk per choice (its chat with n > 1), several,
    none, or one that is not last."""
    numbers = [chunk.number for chunk in finals] or [chunks[-1].number if chunks else 0]
    expected = "expected one, last before [DONE]"
    if not finals and on_finish:
        numbers = [chunk.number for chunk in carried]
        message = f"usage on {len(carried)} finish chunks, no usage chunk with choices: []"
        cause = "usage on the finish chunk instead of a usage chunk with choices: []"
    elif not finals:
        message = cause = f"no usage chunk with choices: []; {expected}"
    elif len(finals) > 1 and len(finals) == len(view.choices):
        message = f"{len(finals)} usage chunks with choices: [], one per choice; {expected}"
        cause = "one usage chunk with choices: [] per choice"
    elif len(finals) > 1:
        message = f"{len(finals)} usage chunks with choices: []; {expected}"
        cause = "several usage chunks with choices: []"
    else:
        message = cause = "the usage chunk is not last before [DONE]"
    return finding("usage_placement", exchange, message, numbers, view=view, cause=cause)


def _check_totals(exchange: Exchange, view: StreamView, final_chunks: list[Any]) -> list[Finding]:
    if len(final_chunks) != 1:
        return []
    chunk = final_chunks[-1]
    usage = chunk.usage
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    problems = []
    if not all(isinstance(value, int) for value in (prompt, completion, usage.get("total_tokens"))):
        problems.append("prompt/completion/total tokens must be integers")
    elif usage["total_tokens"] != prompt + completion:
        problems.append(f"total_tokens {usage['total_tokens']} != {prompt} + {completion}")
    else:
        problems += _compare_to_delivered(exchange, view, prompt, completion)
    return [
        finding("usage_inexact", exchange, problem, [chunk.number], view=view)
        for problem in problems
    ]


def _compare_to_delivered(
    exchange: Exchange, view: StreamView, prompt: int, completion: int
) -> list[str]:
    delivered = _delivered_tokens(view)
    if delivered is not None and _is_max_tokens_by_length(view, completion):
        return []  # usage right by definition; fewer entries are logprob_count's
    if delivered is not None and not _is_close(completion, delivered, _stop_finishes(view)):
        return [
            f"completion_tokens {completion}, but {delivered} tokens were delivered (logprob entries)"
        ]
    twin = view_of(exchange.twin) if exchange.twin is not None else None
    twin_usage = twin.chunks[0].usage if twin is not None and twin.chunks else None
    if not view.request.is_stream or not twin_usage or twin.texts() != view.texts():
        return []
    if (
        twin_usage.get("prompt_tokens") != prompt
        or twin_usage.get("completion_tokens") != completion
    ):
        return [
            f"usage {prompt}+{completion}, non-streamed twin with the same text reports "
            f"{twin_usage.get('prompt_tokens')}+{twin_usage.get('completion_tokens')}"
        ]
    return []


def _delivered_tokens(view: StreamView) -> int | None:
    if view.request.top_logprobs is None:
        return None
    content = [c for chunks in view.choices.values() for c in chunks if c.text]
    if any(chunk.logprobs is None for chunk in content):
        return None
    return sum(
        sum(not is_prompt_entry(entry, view.echo_chars(index)) for entry in c.logprobs or [])
        for index, chunks in view.choices.items()
        for c in chunks
    )


def _is_max_tokens_by_length(view: StreamView, completion: int) -> bool:
    """Every index finished with "length" and the usage counts max_tokens for each."""
    max_tokens = view.request.max_tokens
    finishes = [c.finish_reason for chunks in view.choices.values() for c in chunks]
    finishes = [reason for reason in finishes if reason is not None]
    return (
        max_tokens is not None
        and len(finishes) == len(view.choices) > 0
        and all(reason == "length" for reason in finishes)
        and completion == max_tokens * len(view.choices)
    )


def _stop_finishes(view: StreamView) -> int:
    return sum(1 for chunks in view.choices.values() for c in chunks if c.finish_reason == "stop")


def _is_close(reported: int, delivered: int, allowance: int) -> bool:
    """Equal, or ahead by at most one unshown EOS per index that stopped."""
    return delivered <= reported <= delivered + allowance


def _check_continuous(
    exchange: Exchange, view: StreamView, chunks: list[ChoiceChunk], echo_chars: int
) -> list[Finding]:
    if not any(chunk.usage is not None for chunk in chunks if chunk.finish_reason is None):
        return []  # usage on the finish chunk alone is not continuous: nothing to count
    countable = view.request.top_logprobs is not None
    delivered, previous = 0, None
    frozen, inexact = [], []
    for chunk in chunks:
        # Every chunk's tokens count, whether or not it carried usage.
        delivered += sum(not is_prompt_entry(entry, echo_chars) for entry in chunk.logprobs or [])
        countable = countable and (chunk.logprobs is not None or not chunk.text)
        if chunk.usage is None or not isinstance(chunk.usage.get("completion_tokens"), int):
            continue
        reported = chunk.usage["completion_tokens"]
        is_new_text = chunk.has_content
        if is_new_text and previous is not None and reported == previous:
            frozen.append(chunk.number)
        elif countable and not _is_close(reported, delivered, int(chunk.finish_reason == "stop")):
            inexact.append((chunk.number, reported, delivered))
        elif previous is not None and reported < previous:
            inexact.append((chunk.number, reported, previous))
        previous = reported
    findings = []
    if frozen:
        message = f"completion_tokens repeated on {len(frozen)} chunks that carried new text"
        findings.append(finding("usage_frozen", exchange, message, frozen, view=view))
    if inexact:
        number, reported, expected = inexact[0]
        message = f"chunk #{number}: completion_tokens {reported}, expected {expected} ({len(inexact)} chunks off)"
        numbers = [item[0] for item in inexact]
        findings.append(finding("usage_continuous_inexact", exchange, message, numbers, view=view))
    return findings
