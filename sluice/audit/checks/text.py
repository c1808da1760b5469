"""Checks of the delivered text (STREAMING_CONTRACT.md, I1, I2, hard cases 2 and 4).

- `replacement_char`: U+FFFD in the stream that the non-streamed text lacks.
- `stop_leak`: a stop string in the output (without include_stop_str_in_output),
  or the expected output followed by a prefix of a stop string: text sent and
  never retracted.
- `stop_str_not_included` (vLLM's include_stop_str_in_output): a choice that
  finished with "stop" where the stop-free greedy text shows a stop string
  matched must end with that stop string.
- `duplicate_delta` / `skipped_delta`: deltas aligned against the non-streamed
  twin, by tokens when both carry logprobs, else by text.
- `text_mismatch_nonstream` (a note): streamed text differs from the twin; a
  correct server that is not batch-invariant may do this.
"""

from __future__ import annotations

from sluice.audit.checks.evidence import finding
from sluice.audit.records import Exchange, Finding
from sluice.audit.stream_view import ChoiceChunk, StreamView, view_of
from sluice.audit.text_utils import align_deltas, first_difference, stopped_text


def check_text(exchange: Exchange, view: StreamView) -> list[Finding]:
    twin = _usable_twin(exchange)
    findings: list[Finding] = []
    for index, chunks in view.choices.items():
        twin_chunks = twin.choices.get(index) if twin is not None else None
        findings += _check_stop_leak(exchange, view, index, chunks)
        findings += _check_stop_included(exchange, view, index, chunks)
        if not view.request.is_stream:
            continue
        findings += _check_replacement(exchange, view, chunks, twin_chunks)
        if twin_chunks is not None and exchange.reader != "abandon":
            findings += _check_deltas(exchange, view, chunks, twin_chunks)
            findings += _check_determinism(exchange, view, chunks, twin_chunks)
    return findings


def _usable_twin(exchange: Exchange) -> StreamView | None:
    twin = exchange.twin
    if twin is None or not twin.is_ok or exchange.transport_error:
        return None
    return view_of(twin)


def _text(chunks: list[ChoiceChunk]) -> str:
    return "".join(chunk.text for chunk in chunks)


def _check_replacement(
    exchange: Exchange,
    view: StreamView,
    chunks: list[ChoiceChunk],
    twin_chunks: list[ChoiceChunk] | None,
) -> list[Finding]:
    allowed = _text(twin_chunks).count("\ufffd") if twin_chunks is not None else 0
    if twin_chunks is None and _is_cut_mid_character(chunks):
        allowed = 1  # max_tokens cut a character: its bytes decode as one U+FFFD at the end
    if _text(chunks).count("\ufffd") <= allowed:
        return []
    numbers = [chunk.number for chunk in chunks if "\ufffd" in chunk.text]
    message = f"U+FFFD in {len(numbers)} deltas; the non-streamed text has {allowed}"
    return [finding("replacement_char", exchange, message, numbers, view=view)]


def _is_cut_mid_character(chunks: list[ChoiceChunk]) -> bool:
    last = chunks[-1]
    return last.finish_reason == "length" and _text(chunks).endswith("\ufffd")


def _check_stop_leak(
    exchange: Exchange, view: StreamView, index: int, chunks: list[ChoiceChunk]
) -> list[Finding]:
    stops, text = view.request.stops, _text(chunks)
    # With min_tokens, a stop string inside the first tokens is text (not a
    # leak); where those tokens end is not on the wire, so no check.
    if not stops or view.request.include_stop_str or view.request.min_tokens:
        return []
    for stop in stops:
        if stop and stop in text:
            start = text.find(stop)
            return [_leak(exchange, view, chunks, start, f"stop string {stop!r} at offset {start}")]
    references = []
    if exchange.unstopped_texts and index in exchange.unstopped_texts:
        references.append(stopped_text(exchange.unstopped_texts[index], stops, False))
    twin = _usable_twin(exchange)
    if twin is not None and index in twin.choices:
        references.append(twin.text(index))
    for reference in references:
        rest = text[len(reference) :]
        if text.startswith(reference) and rest and any(stop.startswith(rest) for stop in stops):
            message = f"{rest!r} (a prefix of a stop string) follows the expected output"
            return [_leak(exchange, view, chunks, len(reference), message)]
    return []


def _check_stop_included(
    exchange: Exchange, view: StreamView, index: int, chunks: list[ChoiceChunk]
) -> list[Finding]:
    stops, text = view.request.stops, _text(chunks)
    unstopped = (exchange.unstopped_texts or {}).get(index)
    if not view.request.include_stop_str or unstopped is None or not stops:
        return []
    if chunks[-1].finish_reason != "stop" or stopped_text(unstopped, stops, False) == unstopped:
        return []  # no stop string matched: nothing to include
    if any(text.endswith(stop) for stop in stops):
        return []
    expected = stopped_text(unstopped, stops, True)
    message = f"text ends {text[-20:]!r}; with the stop string it ends {expected[-20:]!r}"
    numbers = [chunk.number for chunk in chunks][-1:]
    return [finding("stop_str_not_included", exchange, message, numbers, view=view)]


def _leak(
    exchange: Exchange, view: StreamView, chunks: list[ChoiceChunk], start: int, message: str
) -> Finding:
    numbers, offset = [], 0
    for chunk in chunks:
        if offset + len(chunk.text) > start and chunk.text:
            numbers.append(chunk.number)
        offset += len(chunk.text)
    return finding("stop_leak", exchange, message, numbers[:4], view=view)


def _check_deltas(
    exchange: Exchange, view: StreamView, chunks: list[ChoiceChunk], twin_chunks: list[ChoiceChunk]
) -> list[Finding]:
    by_tokens = all(c.logprobs is not None for c in chunks if c.text) and all(
        c.logprobs is not None for c in twin_chunks
    )
    if by_tokens:
        reference = tuple(e.token_bytes for c in twin_chunks for e in c.logprobs or [])
        deltas = [(c.number, tuple(e.token_bytes for e in c.logprobs or [])) for c in chunks]
        unit = "tokens"
    else:
        reference = _text(twin_chunks)
        deltas = [(c.number, c.text) for c in chunks]
        unit = "characters"
    outcome = align_deltas(reference, deltas)
    if outcome.has_diverged:
        return []
    findings = []
    if outcome.duplicates:
        message = f"{len(outcome.duplicates)} deltas repeat the previous delta (aligned by {unit})"
        findings.append(
            finding("duplicate_delta", exchange, message, outcome.duplicates, view=view)
        )
    if outcome.skips:
        jumped = sum(length for _, length in outcome.skips)
        message = f"{jumped} {unit} of the non-streamed output never arrived, before {len(outcome.skips)} deltas"
        numbers = [number for number, _ in outcome.skips]
        findings.append(finding("skipped_delta", exchange, message, numbers, view=view))
    return findings


def _check_determinism(
    exchange: Exchange, view: StreamView, chunks: list[ChoiceChunk], twin_chunks: list[ChoiceChunk]
) -> list[Finding]:
    streamed, expected = _text(chunks), _text(twin_chunks)
    if streamed == expected:
        return []
    offset = first_difference(streamed, expected)
    message = (
        f"differs at character {offset}: streamed {streamed[offset : offset + 30]!r}, "
        f"non-streamed {expected[offset : offset + 30]!r}"
    )
    return [
        finding(
            "text_mismatch_nonstream", exchange, message, [_chunk_at(chunks, offset)], view=view
        )
    ]


def _chunk_at(chunks: list[ChoiceChunk], offset: int) -> int:
    """The number of the chunk that holds character `offset` of the text (or the last one)."""
    position = 0
    for chunk in chunks:
        position += len(chunk.text)
        if position > offset:
            return chunk.number
    return chunks[-1].number
