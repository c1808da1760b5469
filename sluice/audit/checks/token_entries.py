"""What each token's logprob entry must say of itself, lag or not, on every
API with logprobs (chat, completions, Responses): its own logprob where it is
listed among its alternatives (`logprob_own_entry`); under greedy decoding,
the head of its alternatives at that logprob (`logprob_greedy_head`, a tie
for first place is fine); and the entries' bytes concatenate to the text
(`logprob_alignment`). A server that attributes one token's alternatives to
another in a merged chunk breaks the first two even when every entry
differs from every other.

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
from sluice.audit.stream_view import ChoiceChunk, RequestShape, StreamView, is_prompt_entry
from sluice.audit.text_utils import split_partial_utf8

_SPECIAL_TOKEN = re.compile(r"<\|[^|<>\s]{1,40}\|>|</?s>|<(?:eos|bos|pad|unk)>|\[/?[A-Z_]{2,20}\]")


def check_token_entries(
    exchange: Exchange,
    view: StreamView,
    chunks: list[ChoiceChunk],
    request: RequestShape,
    is_complete: bool,
    echo_chars: int = 0,
) -> list[Finding]:
    """What each token's entry must say of itself, lag or not (every API with
    logprobs): its own logprob where it is listed among its alternatives, at
    their head under greedy; the entries' bytes make the text."""
    findings = _check_own_entries(exchange, view, chunks, request, echo_chars)
    findings += _check_greedy_heads(exchange, view, chunks, request, echo_chars)
    problem = alignment_problem(chunks, request, is_complete)
    if problem is not None:
        number, message = problem
        findings.append(finding("logprob_alignment", exchange, message, [number], view=view))
    return findings


def _check_own_entries(
    exchange: Exchange,
    view: StreamView,
    chunks: list[ChoiceChunk],
    request: RequestShape,
    echo_chars: int,
) -> list[Finding]:
    """A token listed among its own alternatives is listed at its own logprob
    (under greedy, `logprob_greedy_head` says this and more)."""
    if request.is_greedy or not request.top_logprobs:
        return []
    wrong = [
        chunk.number
        for chunk in chunks
        for entry in chunk.logprobs or []
        if not is_prompt_entry(entry, echo_chars)
        and entry.is_finite
        and not entry.is_ambiguous
        and entry.top.get(entry.token, entry.logprob) != entry.logprob
    ]
    if not wrong:
        return []
    message = (
        f"{len(wrong)} tokens listed among their top_logprobs at another logprob than their own"
    )
    return [finding("logprob_own_entry", exchange, message, sorted(set(wrong)), view=view)]


def _check_greedy_heads(
    exchange: Exchange,
    view: StreamView,
    chunks: list[ChoiceChunk],
    request: RequestShape,
    echo_chars: int,
) -> list[Finding]:
    """Greedy: the token sampled is the most likely one, so it heads its own
    `top_logprobs` with the logprob it carries. A server that attributes one
    position's alternatives to another breaks this even when every entry
    differs from every other (which `logprob_copied` cannot see)."""
    if not request.is_greedy or not request.top_logprobs:
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
