"""Checks of logprobs (STREAMING_CONTRACT.md, I3 and hard case 5).

Per index: entries only when asked, in the API's own shape, on every chunk
that carries text, one per token generated (a choice finished by "length"
generated max_tokens), with the asked number of alternatives; finite numbers; no entry copied onto a
position holding another token; under greedy decoding, the sampled token
heads its own alternatives with its own logprob (a tie for first place is
fine); the entries' bytes concatenate to the text.

Alignment is cumulative, in bytes: the text delivered so far must be a prefix
of the entries' bytes so far. The entries may run ahead only by what a server
legitimately holds back: an incomplete UTF-8 character, or a prefix of a stop
string; at the end, by the trimmed stop string and what followed it in its
token. Special tokens that the text skips are not counted.
"""

from __future__ import annotations

import re

from sluice.audit.checks.evidence import finding
from sluice.audit.logprob_entries import LogprobEntry
from sluice.audit.records import Exchange, Finding
from sluice.audit.stream_view import (
    ChoiceChunk,
    RequestShape,
    StreamView,
    is_prompt_entry,
    view_of,
)
from sluice.audit.text_utils import split_partial_utf8

_SPECIAL_TOKEN = re.compile(r"<\|[^|<>\s]{1,40}\|>|</?s>|<(?:eos|bos|pad|unk)>|\[/?[A-Z_]{2,20}\]")


def check_logprobs(exchange: Exchange, view: StreamView) -> list[Finding]:
    findings: list[Finding] = []
    is_complete = exchange.reader != "abandon" and exchange.transport_error is None
    for index, chunks in view.choices.items():
        if view.request.top_logprobs is None:
            unrequested = [chunk.number for chunk in chunks if chunk.logprobs]
            if unrequested:
                message = "logprob entries although logprobs were not requested"
                findings.append(finding("logprob_count", exchange, message, unrequested, view=view))
            continue
        findings += _check_shape(exchange, view, chunks)
        findings += _check_counts(exchange, view, chunks, view.echo_chars(index))
        if is_complete:
            findings += _check_token_count(exchange, view, chunks, view.echo_chars(index))
        findings += _check_values(exchange, view, chunks, view.echo_chars(index))
        findings += _check_greedy_heads(exchange, view, chunks, view.echo_chars(index))
        problem = alignment_problem(chunks, view.request, is_complete)
        if problem is not None:
            number, message = problem
            findings.append(finding("logprob_alignment", exchange, message, [number], view=view))
    return findings + _check_text_offsets(exchange, view)


def _check_counts(
    exchange: Exchange, view: StreamView, chunks: list[ChoiceChunk], echo_chars: int
) -> list[Finding]:
    top = view.request.top_logprobs or 0
    missing = [chunk.number for chunk in chunks if chunk.text and chunk.logprobs is None]
    # A server may add the sampled token when it is not among the top N.
    wrong_top = [
        chunk.number
        for chunk in chunks
        for entry in chunk.logprobs or []
        if not top <= len(entry.top) <= top + 1
        and not (entry.is_ambiguous or _is_unscored_prompt(entry, echo_chars))
    ]
    findings = []
    if missing:
        message = f"{len(missing)} chunks with text but no logprobs object"
        findings.append(finding("logprob_count", exchange, message, missing, view=view))
    if wrong_top:
        message = f"entries without {top} (or {top + 1}) alternatives"
        findings.append(
            finding("logprob_count", exchange, message, sorted(set(wrong_top)), view=view)
        )
    return findings


def _check_shape(exchange: Exchange, view: StreamView, chunks: list[ChoiceChunk]) -> list[Finding]:
    wrong = [chunk.number for chunk in chunks if chunk.has_chat_shaped_logprobs]
    if not wrong:
        return []
    message = "completions logprobs in chat's shape (content: [...]), not tokens/token_logprobs"
    return [finding("logprob_shape", exchange, message, wrong, view=view)]


def _check_token_count(
    exchange: Exchange, view: StreamView, chunks: list[ChoiceChunk], echo_chars: int
) -> list[Finding]:
    """A choice that finished by "length" generated max_tokens tokens: one entry each."""
    max_tokens = view.request.max_tokens
    if max_tokens is None or chunks[-1].finish_reason != "length":
        return []
    entries = [e for c in chunks for e in c.logprobs or [] if not is_prompt_entry(e, echo_chars)]
    if not entries or len(entries) == max_tokens:
        return []
    numbers = [chunk.number for chunk in chunks if chunk.logprobs]
    message = (
        f"{len(entries)} logprob entries for {max_tokens} tokens (finished by length at max_tokens)"
    )
    return [finding("logprob_count", exchange, message, numbers, view=view)]


def _is_unscored_prompt(entry: LogprobEntry, echo_chars: int) -> bool:
    """The echoed prompt's first token: nothing before it to score it, so a null
    logprob and no alternatives (as OpenAI and vLLM answer)."""
    return is_prompt_entry(entry, echo_chars) and entry.logprob is None


def _check_values(
    exchange: Exchange, view: StreamView, chunks: list[ChoiceChunk], echo_chars: int
) -> list[Finding]:
    nonfinite, copied = [], []
    first_by_signature: dict[tuple, tuple[bytes, int]] = {}
    for chunk in chunks:
        for entry in chunk.logprobs or []:
            if _is_unscored_prompt(entry, echo_chars):
                continue
            if not entry.is_finite:
                nonfinite.append(chunk.number)
                continue
            if not entry.top:
                continue
            seen = first_by_signature.setdefault(entry.signature, (entry.token_bytes, chunk.number))
            if seen[0] != entry.token_bytes:
                copied += [seen[1], chunk.number]
    findings = []
    if nonfinite:
        message = "NaN, Infinity or a non-number among logprobs (use -9999.0)"
        findings.append(finding("logprob_nonfinite", exchange, message, nonfinite, view=view))
    if copied:
        message = "the same logprob and alternatives at positions holding different tokens"
        findings.append(finding("logprob_copied", exchange, message, copied, view=view))
    return findings


def _check_greedy_heads(
    exchange: Exchange, view: StreamView, chunks: list[ChoiceChunk], echo_chars: int
) -> list[Finding]:
    """Greedy: the token sampled is the most likely one, so it heads its own
    `top_logprobs` with the logprob it carries. A server that attributes one
    position's alternatives to another breaks this even when every entry
    differs from every other (which `logprob_copied` cannot see)."""
    if not view.request.is_greedy or not view.request.top_logprobs:
        return []
    wrong, first_problem = [], ""
    for chunk in chunks:
        for entry in chunk.logprobs or []:
            problem = None if is_prompt_entry(entry, echo_chars) else _head_problem(entry)
            if problem is not None:
                wrong.append(chunk.number)
                first_problem = first_problem or problem
    if not wrong:
        return []
    message = f"{len(wrong)} greedy tokens do not head their top_logprobs; first: {first_problem}"
    return [finding("logprob_greedy_head", exchange, message, sorted(set(wrong)), view=view)]


def _head_problem(entry: LogprobEntry) -> str | None:
    """Why a greedy entry does not head its alternatives; None when it does.

    Ambiguous entries are skipped (`LogprobEntry.is_ambiguous`: "" or U+FFFD
    strings that several partial characters share, or colliding alternatives)."""
    if not entry.top or not entry.is_finite or entry.is_ambiguous:
        return None
    best_token, best = max(entry.top.items(), key=lambda item: item[1])
    own = entry.top.get(entry.token, entry.logprob)  # absent: a tie pushed it out of the top N
    if best == entry.logprob and own == entry.logprob:
        return None
    return (
        f"{entry.token!r} with logprob {entry.logprob} (listed at {own}); "
        f"the top alternative is {best_token!r} at {best}"
    )


def _counted_bytes(chunk: ChoiceChunk) -> bytes:
    """The chunk's entries as bytes, without special tokens its text skipped."""
    return b"".join(
        entry.token_bytes
        for entry in chunk.logprobs or []
        if not _is_skipped_special(entry, chunk.text)
    )


def _is_skipped_special(entry: LogprobEntry, text: str) -> bool:
    """A special token none of whose text is in the chunk (skip_special_tokens).
    Its text may also be cut by a stop string: then a prefix of it ends the chunk."""
    token = entry.token
    if not _SPECIAL_TOKEN.fullmatch(token) or token in text:
        return False
    return not any(text.endswith(token[:size]) for size in range(1, len(token)))


def alignment_problem(
    chunks: list[ChoiceChunk], request: RequestShape, is_complete: bool
) -> tuple[int, str] | None:
    """The first chunk whose text disagrees with the entries so far, and why."""
    entries = [entry for chunk in chunks for entry in chunk.logprobs or []]
    if not entries or any(not e.has_exact_bytes for e in entries):
        return None
    if any("\ufffd" in chunk.text for chunk in chunks):
        return None  # reported as replacement_char: one anomaly, one id
    delivered, counted = b"", b""
    for position, chunk in enumerate(chunks):
        counted += _counted_bytes(chunk)
        delivered += chunk.text.encode()
        is_last = is_complete and position == len(chunks) - 1
        if not counted.startswith(delivered):
            tail = len(counted) - 24
            return chunk.number, (
                f"text so far ...{delivered[-24:]!r} is not a prefix of the entries' "
                f"bytes ...{counted[max(tail, 0) :]!r}"
            )
        excess = counted[len(delivered) :]
        if excess and not _is_held_back(excess, delivered, request, is_last):
            return chunk.number, f"entries carry {excess!r} beyond the text so far"
    return None


def _is_held_back(excess: bytes, delivered: bytes, request: RequestShape, is_last: bool) -> bool:
    complete, _partial = split_partial_utf8(excess)
    held = complete.decode("utf-8", "replace")
    if not is_last:
        return held == "" or any(stop.startswith(held) for stop in request.stops)
    text = delivered.decode("utf-8", "replace")
    if held == "":
        return True
    if request.include_stop_str:
        return any(text.endswith(stop) for stop in request.stops)
    full = text + held
    return any(0 <= full.find(stop) <= len(text) for stop in request.stops)


def _check_text_offsets(exchange: Exchange, view: StreamView) -> list[Finding]:
    """Completions text_offset must continue across chunks as in the non-streamed twin."""
    twin = view_of(exchange.twin) if exchange.twin is not None else None
    if view.request.is_chat or not view.request.is_stream or twin is None:
        return []
    findings = []
    for index, chunks in view.choices.items():
        twin_chunks = twin.choices.get(index, [])
        if not twin_chunks or twin.text(index) != view.text(index):
            continue
        expected = [entry.text_offset for chunk in twin_chunks for entry in chunk.logprobs or []]
        streamed = [entry.text_offset for chunk in chunks for entry in chunk.logprobs or []]
        first = _first_difference(streamed, expected)
        if first is None:
            continue
        got = streamed[first] if first < len(streamed) else None
        want = expected[first] if first < len(expected) else None
        message = f"text_offset of token {first}: streamed {got}, non-streamed {want}"
        number = _chunk_of_entry(chunks, first)
        findings.append(finding("logprob_text_offset", exchange, message, [number], view=view))
    return findings


def _first_difference(left: list, right: list) -> int | None:
    for position in range(max(len(left), len(right))):
        if position >= len(left) or position >= len(right) or left[position] != right[position]:
            return position
    return None


def _chunk_of_entry(chunks: list[ChoiceChunk], entry_position: int) -> int:
    seen = 0
    for chunk in chunks:
        seen += len(chunk.logprobs or [])
        if seen > entry_position:
            return chunk.number
    return chunks[-1].number
