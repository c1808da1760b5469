"""Logits processing: from the model's raw logits to the distribution sampled.

Order, on a working copy (the raw logits stay intact for logprobs):
0. structured output: tokens the row's grammar forbids go to -inf;
1. logit_bias is added;
2. EOS and stop_token_ids are masked to -inf while a row is under min_tokens;
3. repetition penalty (HF/vLLM): over prompt and output tokens, positive
   logits are divided by the penalty and negative ones multiplied;
4. presence and frequency penalties (OpenAI): over output tokens only,
   logit -= frequency * count + presence * (count > 0);
5. temperature divides the logits (greedy rows stay unscaled);
6. top-k and top-p from one partial sort of the batch (topk of K candidates
   on CPU, where a full sort of the vocabulary costs more than the rest of
   sampling; a full sort elsewhere), then min-p, which needs no sort.

Invariants: softmax of the result is exactly the distribution a row samples
from; the most likely token always survives filtering, so greedy rows (argmax
of the result) are unaffected by it; top-k keeps exactly k tokens and top-p the
smallest prefix, ordering equal logits by token id, so a row's result never
depends on the rest of the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sluice.engine.sampling.batch import (
    Filters,
    OccurrencePenalties,
    RepetitionPenalty,
    SamplingBatch,
    SparseEntries,
)


def process_logits(logits: Tensor, batch: SamplingBatch) -> Tensor:
    """[B, V] raw logits -> [B, V] processed logits; the input is never written.

    With nothing to do for a step, the input itself is returned.
    """
    # 0-2. The grammar mask, then sparse additions: bias, then the min_tokens
    #      mask, in place on a copy.
    has_sparse = batch.logit_bias is not None or batch.min_tokens_mask is not None
    if batch.forbidden_tokens is not None or has_sparse:
        logits = logits.clone()  # [B, V]
        if batch.forbidden_tokens is not None:
            logits.masked_fill_(batch.forbidden_tokens, float("-inf"))
        _add_sparse(logits, batch.logit_bias)
        _add_sparse(logits, batch.min_tokens_mask)
    # 3. Repetition penalty.
    if batch.repetition is not None:
        logits = apply_repetition_penalty(logits, batch.repetition)
    # 4. Presence and frequency penalties.
    if batch.occurrence is not None:
        logits = apply_occurrence_penalties(logits, batch.occurrence)
    # 5. Temperature.
    if batch.temperature is not None:
        logits = logits / batch.temperature[:, None]  # [B, V]
    # 6. Truncation.
    if batch.filters is not None:
        logits = apply_filters(logits, batch.filters)
    return logits


def _add_sparse(logits: Tensor, entries: SparseEntries | None) -> None:
    if entries is not None:
        # accumulate=True makes this an addition (bias, or -inf for a mask), not an overwrite.
        logits.index_put_((entries.row_ids, entries.token_ids), entries.values, accumulate=True)


def apply_repetition_penalty(logits: Tensor, repetition: RepetitionPenalty) -> Tensor:
    """logits: [B, V]; only tokens seen in the prompt or output are touched."""
    penalty = repetition.penalty[:, None]  # [B, 1]
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)  # [B, V]
    return torch.where(repetition.seen_token_mask, penalised, logits)


def apply_occurrence_penalties(logits: Tensor, occurrence: OccurrencePenalties) -> Tensor:
    """logits: [B, V]; logit -= frequency * count + presence * (count > 0)."""
    counts = occurrence.output_token_counts  # [B, V]
    frequency = occurrence.frequency[:, None]  # [B, 1]
    presence = occurrence.presence[:, None]  # [B, 1]
    return logits - (frequency * counts + presence * (counts > 0))  # [B, V]


def apply_filters(logits: Tensor, filters: Filters) -> Tensor:
    """Top-k, then top-p, then min-p; [B, V] -> [B, V] with dropped tokens at -inf."""
    if filters.top_k is not None and filters.top_p is not None:
        logits = _top_k_top_p(logits, filters.top_k, filters.top_p, filters)
    if filters.min_p is not None:
        logits = _min_p(logits, filters.min_p)
    return logits


def _top_k_top_p(logits: Tensor, top_k: Tensor, top_p: Tensor, filters: Filters) -> Tensor:
    """Both cuts from one partial sort of the K most likely tokens of every row.

    Order is canonical: logit descending, then token id ascending, so which of
    several tied tokens survives a cut never depends on K, on the sort used or
    on the rest of the batch. K exceeds every row's top_k; when a top-p-only
    nucleus, or a group of tokens tied at a cut, may reach past the K
    candidates, K grows eightfold, up to a full sort.
    """
    num_candidates = filters.num_candidates
    while True:
        result = _cut_among_candidates(logits, top_k, top_p, filters, num_candidates)
        if result is not None:
            return result
        num_candidates *= 8


def _cut_among_candidates(
    logits: Tensor, top_k: Tensor, top_p: Tensor, filters: Filters, num_candidates: int
) -> Tensor | None:
    """[B, V] cut logits, or None when K candidates cannot decide every row."""
    vocab_size = logits.shape[1]
    k = min(vocab_size, num_candidates)
    if k == vocab_size:
        # A stable sort keeps lower ids first among equal logits.
        values, ids = logits.sort(dim=-1, descending=True, stable=True)  # [B, K]
    else:
        values, ids = _canonical_order(*logits.topk(k, dim=-1, sorted=True))  # [B, K]
    rank = torch.arange(k, device=logits.device)  # [K]
    drop = rank >= top_k[:, None]  # [B, K]
    log_norm = values.masked_fill(drop, float("-inf")).logsumexp(dim=-1)  # [B]
    is_uncut = (top_k == vocab_size) & (top_p >= 1.0)  # [B]
    if k < vocab_size and filters.has_unbounded_top_p:
        # A row without top-k is normalised over the whole vocabulary.
        log_norm = torch.where(top_k < vocab_size, log_norm, logits.logsumexp(dim=-1))  # [B]
    cumulative = (values - log_norm[:, None]).exp().masked_fill(drop, 0.0).cumsum(dim=-1)  # [B, K]
    drop |= _past_nucleus(cumulative, top_p)
    if k < vocab_size and not _is_decided(values, drop, is_uncut):
        return None
    values = values.masked_fill(drop, float("-inf"))  # [B, K]
    if filters.has_uncut_rows and k < vocab_size:
        # Rows with neither cut keep the tokens outside the candidates.
        result = torch.where(is_uncut[:, None], logits, float("-inf"))  # [B, V]
    else:
        result = torch.full_like(logits, float("-inf"))  # [B, V]
    return result.scatter_(1, ids, values)


def _canonical_order(values: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
    """Reorder topk's [B, K] output to logit descending, then id ascending."""
    ids, by_id = ids.sort(dim=-1)  # [B, K]
    values = values.gather(1, by_id)  # [B, K]
    values, by_value = values.sort(dim=-1, descending=True, stable=True)  # [B, K]
    return values, ids.gather(1, by_value)


def _past_nucleus(cumulative: Tensor, top_p: Tensor) -> Tensor:
    """[B, K] bool: ranks outside the smallest prefix whose mass reaches top_p."""
    # Mass strictly before each rank: a token is needed while the tokens ranked
    # above it have not yet reached top_p.
    before = torch.cat([torch.zeros_like(cumulative[:, :1]), cumulative[:, :-1]], dim=1)  # [B, K]
    drop = before >= top_p[:, None]  # [B, K]
    # top_p == 1 keeps everything even when rounding makes the sum reach 1 early.
    drop &= top_p[:, None] < 1.0
    drop[:, 0] = False
    return drop


def _is_decided(values: Tensor, drop: Tensor, is_uncut: Tensor) -> bool:
    """Whether K candidates settle every row's cut (one host check: CPU only).

    A cut is unsettled when the last kept logit ties the last candidate: tokens
    past K (with lower ids) may tie it too. A nucleus still short of top_p
    keeps all K candidates, so it is caught by the same test.
    """
    num_kept = (~drop).sum(dim=-1, keepdim=True)  # [B, 1]; kept ranks form a prefix
    cut_value = values.gather(1, num_kept - 1)  # [B, 1]
    is_open = (values[:, -1:] == cut_value).squeeze(1) & ~is_uncut  # [B]
    return not bool(is_open.any())


def _min_p(logits: Tensor, min_p: Tensor) -> Tensor:
    """Drop tokens whose probability is below min_p times the top token's."""
    # p_i / p_max = exp(l_i - l_max) whatever the normalisation, so this needs
    # no sort, and runs after top-k/top-p without renormalising: the top token
    # always survives those.
    threshold = logits.amax(dim=-1) + torch.log(min_p)  # [B]; log(0) = -inf drops nothing
    return logits.masked_fill(logits < threshold[:, None], float("-inf"))
