"""Checks of logprobs (STREAMING_CONTRACT.md, I3 and hard case 5).

Per index: entries only when asked, in the API's own shape, on every chunk
that carries text, one per token generated (a choice finished by "length"
generated max_tokens), with the asked number of alternatives; finite numbers; no entry copied onto a
position holding another token; and what each token's entry says of
itself (token_entries.py: its own logprob, the greedy head, the bytes).
"""

from __future__ import annotations

from sluice.audit.checks.evidence import finding
from sluice.audit.checks.token_entries import check_token_entries
from sluice.audit.logprob_entries import LogprobEntry
from sluice.audit.records import Exchange, Finding
from sluice.audit.stream_view import ChoiceChunk, StreamView, is_prompt_entry, view_of


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
        findings += check_token_entries(
            exchange, view, chunks, view.request, is_complete, view.echo_chars(index)
        )
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
        if not expected:
            continue  # a twin without logprobs (the backpressure scenario's control)
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
