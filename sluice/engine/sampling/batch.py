"""One step's sampling inputs, turned from per-request rows into batch tensors.

`SamplingRow` is what the runner hands the sampler for one request;
`SamplingBatch` is the same information laid out for tensor ops over the batch.
Every optional part is None when no row needs it, so a batch of plain requests
pays for none of them. Row i of every tensor belongs to rows[i].

Invariants: greedy rows get temperature 1.0 and disabled filters (their token
is the argmax of the penalised logits); token ids outside [0, vocab) in
logit_bias or stop_token_ids are ignored rather than indexing out of range.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from sluice.engine.sampling.rng import derive_step_seed
from sluice.engine.sampling_params import SamplingParams
from sluice.structured.bitmask import forbidden_tokens
from sluice.structured.matcher import GrammarMatcher

# Candidates a top-p-only row first searches its nucleus in on CPU.
CPU_TOP_P_CANDIDATES = 1024


@dataclass(slots=True)
class SamplingRow:
    """One request that samples a token this step."""

    request_id: str
    params: SamplingParams
    prompt_token_ids: Sequence[int]
    # Generated so far, before this step's token.
    output_token_ids: Sequence[int]
    # Structured output: the grammar state that says which tokens may come next.
    grammar: GrammarMatcher | None = None


@dataclass(slots=True)
class SparseEntries:
    """Scattered positions (row, token) of a [B, V] tensor, with a value each."""

    row_ids: Tensor  # [n] int64
    token_ids: Tensor  # [n] int64
    values: Tensor  # [n] float32


@dataclass(slots=True)
class RepetitionPenalty:
    """HF/vLLM multiplicative penalty over prompt and output tokens."""

    penalty: Tensor  # [B] float32, 1.0 where disabled
    seen_token_mask: Tensor  # [B, V] bool: token in the row's prompt or output


@dataclass(slots=True)
class OccurrencePenalties:
    """OpenAI presence and frequency penalties over output tokens."""

    presence: Tensor  # [B] float32
    frequency: Tensor  # [B] float32
    output_token_counts: Tensor  # [B, V] float32


@dataclass(slots=True)
class Filters:
    """Per-row truncation of the distribution; disabled rows hold neutral values."""

    # Both present when some row has top-k or top-p, else both None.
    top_k: Tensor | None  # [B] int64, vocab size where disabled
    top_p: Tensor | None  # [B] float32, 1.0 where disabled
    min_p: Tensor | None  # [B] float32, 0.0 where disabled
    # K of the partial sort behind top-k/top-p: at least every row's top_k; the
    # whole vocabulary off CPU, where a full sort is cheap and needs no host check.
    num_candidates: int
    # Some row has top_p < 1 and no top_k: its nucleus may reach past K.
    has_unbounded_top_p: bool
    # Some row has neither top-k nor top-p: it keeps tokens outside the candidates.
    has_uncut_rows: bool


@dataclass(slots=True)
class SamplingBatch:
    num_rows: int
    vocab_size: int
    # [B, V] bool: True where a constrained row's grammar forbids the token.
    forbidden_tokens: Tensor | None
    is_greedy: Tensor  # [B] bool
    # The same on the host, for the per-row noise loop.
    greedy_rows: list[bool]
    all_greedy: bool
    # (row, token, bias) added to the logits.
    logit_bias: SparseEntries | None
    # (row, token) set to -inf: EOS and stop ids of rows still under min_tokens.
    min_tokens_mask: SparseEntries | None
    repetition: RepetitionPenalty | None
    occurrence: OccurrencePenalties | None
    temperature: Tensor | None  # [B] float32, 1.0 for greedy rows
    filters: Filters | None
    # Most alternatives any row asks for; None when no row asks for logprobs.
    max_num_logprobs: int | None
    # Seed of this step's generator per row; None draws from the shared generator.
    step_seeds: list[int | None]


def is_plain_greedy(rows: list[SamplingRow]) -> bool:
    """Every row takes the argmax of the raw logits: no processing, no logprobs."""
    return all(
        p.is_greedy
        and not p.logit_bias
        and p.repetition_penalty == 1.0
        and p.presence_penalty == 0.0
        and p.frequency_penalty == 0.0
        and p.logprobs is None
        and len(row.output_token_ids) >= p.min_tokens
        and row.grammar is None
        for row in rows
        for p in (row.params,)
    )


def build_sampling_batch(
    rows: list[SamplingRow], eos_token_ids: frozenset[int], vocab_size: int, device: torch.device
) -> SamplingBatch:
    params = [row.params for row in rows]
    greedy = [p.is_greedy for p in params]
    asked = [p.logprobs for p in params if p.logprobs is not None]
    return SamplingBatch(
        num_rows=len(rows),
        vocab_size=vocab_size,
        forbidden_tokens=_forbidden_tokens(rows, vocab_size, device),
        is_greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
        greedy_rows=greedy,
        all_greedy=all(greedy),
        logit_bias=_logit_bias(params, vocab_size, device),
        min_tokens_mask=_min_tokens_mask(rows, eos_token_ids, vocab_size, device),
        repetition=_repetition(rows, vocab_size, device),
        occurrence=_occurrence(rows, vocab_size, device),
        temperature=_temperature(params, device),
        filters=_filters(params, vocab_size, device),
        max_num_logprobs=min(max(asked), vocab_size) if asked else None,
        step_seeds=[
            None
            if row.params.seed is None
            else derive_step_seed(row.params.seed, len(row.output_token_ids))
            for row in rows
        ],
    )


def _forbidden_tokens(
    rows: list[SamplingRow], vocab_size: int, device: torch.device
) -> Tensor | None:
    if all(row.grammar is None for row in rows):
        return None  # a free batch does no mask work
    return forbidden_tokens([row.grammar for row in rows], vocab_size, device)


def _floats(values: list[float], device: torch.device) -> Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device)


def _sparse(entries: list[tuple[int, int, float]], device: torch.device) -> SparseEntries | None:
    if not entries:
        return None
    row_ids, token_ids, values = zip(*entries, strict=True)
    return SparseEntries(
        row_ids=torch.tensor(row_ids, dtype=torch.int64, device=device),
        token_ids=torch.tensor(token_ids, dtype=torch.int64, device=device),
        values=torch.tensor(values, dtype=torch.float32, device=device),
    )


def _logit_bias(
    params: list[SamplingParams], vocab_size: int, device: torch.device
) -> SparseEntries | None:
    entries = [
        (i, int(token_id), float(bias))
        for i, p in enumerate(params)
        for token_id, bias in p.logit_bias.items()
        if 0 <= int(token_id) < vocab_size
    ]
    return _sparse(entries, device)


def _min_tokens_mask(
    rows: list[SamplingRow], eos_token_ids: frozenset[int], vocab_size: int, device: torch.device
) -> SparseEntries | None:
    entries = []
    for i, row in enumerate(rows):
        if len(row.output_token_ids) >= row.params.min_tokens:
            continue
        banned = eos_token_ids.union(row.params.stop_token_ids)
        entries.extend((i, t, float("-inf")) for t in sorted(banned) if 0 <= t < vocab_size)
    return _sparse(entries, device)


def _scatter_rows(
    rows: list[SamplingRow], row_indices: list[int], with_prompt: bool, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Flat (row, token) index pair over the tokens of the chosen rows."""
    row_ids: list[int] = []
    token_ids: list[int] = []
    for i in row_indices:
        row = rows[i]
        tokens = (
            [*row.prompt_token_ids, *row.output_token_ids] if with_prompt else row.output_token_ids
        )
        row_ids.extend([i] * len(tokens))
        token_ids.extend(tokens)
    return (
        torch.tensor(row_ids, dtype=torch.int64, device=device),
        torch.tensor(token_ids, dtype=torch.int64, device=device),
    )


def _repetition(
    rows: list[SamplingRow], vocab_size: int, device: torch.device
) -> RepetitionPenalty | None:
    chosen = [i for i, row in enumerate(rows) if row.params.repetition_penalty != 1.0]
    if not chosen:
        return None
    row_ids, token_ids = _scatter_rows(rows, chosen, with_prompt=True, device=device)
    seen = torch.zeros(len(rows), vocab_size, dtype=torch.bool, device=device)  # [B, V]
    seen[row_ids, token_ids] = True
    penalty = _floats([row.params.repetition_penalty for row in rows], device)  # [B]
    return RepetitionPenalty(penalty=penalty, seen_token_mask=seen)


def _occurrence(
    rows: list[SamplingRow], vocab_size: int, device: torch.device
) -> OccurrencePenalties | None:
    chosen = [
        i
        for i, row in enumerate(rows)
        if row.params.presence_penalty != 0.0 or row.params.frequency_penalty != 0.0
    ]
    if not chosen:
        return None
    row_ids, token_ids = _scatter_rows(rows, chosen, with_prompt=False, device=device)
    counts = torch.zeros(len(rows), vocab_size, dtype=torch.float32, device=device)  # [B, V]
    ones = torch.ones(row_ids.shape[0], dtype=torch.float32, device=device)  # [n]
    counts.index_put_((row_ids, token_ids), ones, accumulate=True)
    return OccurrencePenalties(
        presence=_floats([row.params.presence_penalty for row in rows], device),
        frequency=_floats([row.params.frequency_penalty for row in rows], device),
        output_token_counts=counts,
    )


def _temperature(params: list[SamplingParams], device: torch.device) -> Tensor | None:
    # Greedy rows (temperature 0) stay unscaled: their argmax does not care, and
    # dividing by zero would turn their logits into infinities and NaNs.
    values = [1.0 if p.is_greedy else float(p.temperature) for p in params]
    if all(v == 1.0 for v in values):
        return None
    return _floats(values, device)


def _filters(params: list[SamplingParams], vocab_size: int, device: torch.device) -> Filters | None:
    top_k = [
        vocab_size if p.is_greedy or p.top_k <= 0 else min(p.top_k, vocab_size) for p in params
    ]
    top_p = [1.0 if p.is_greedy else float(p.top_p) for p in params]
    min_p = [0.0 if p.is_greedy else float(p.min_p) for p in params]
    is_cut = [k < vocab_size or p < 1.0 for k, p in zip(top_k, top_p, strict=True)]
    has_min_p = any(p > 0.0 for p in min_p)
    if not (any(is_cut) or has_min_p):
        return None
    return Filters(
        top_k=torch.tensor(top_k, dtype=torch.int64, device=device) if any(is_cut) else None,
        top_p=_floats(top_p, device) if any(is_cut) else None,
        min_p=_floats(min_p, device) if has_min_p else None,
        num_candidates=_num_candidates(top_k, top_p, vocab_size, device),
        has_unbounded_top_p=any(
            k == vocab_size and p < 1.0 for k, p in zip(top_k, top_p, strict=True)
        ),
        has_uncut_rows=not all(is_cut),
    )


def _num_candidates(
    top_k: list[int], top_p: list[float], vocab_size: int, device: torch.device
) -> int:
    if device.type != "cpu":
        return vocab_size
    # One past the largest top_k, so a tie group at a top-k cut is seen to end.
    bound = 1 + max([0, *(k for k in top_k if k < vocab_size)])
    if any(k == vocab_size and p < 1.0 for k, p in zip(top_k, top_p, strict=True)):
        bound = max(bound, CPU_TOP_P_CANDIDATES)  # room for a top-p-only nucleus
    return min(vocab_size, bound)
