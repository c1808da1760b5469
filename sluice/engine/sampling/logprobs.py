"""Logprobs from the model's own distribution, and the one transfer to the host.

Choice: logprobs are log_softmax of the RAW logits, before logit_bias,
penalties, temperature and filtering (what vLLM calls "raw logprobs"). They
describe the model, not the sampling recipe, so they stay comparable across
requests with different parameters, and a sampled token that filtering would
have reweighted still gets a finite, honest logprob.

Invariant: everything the host needs from a step (ids, and logprobs when some
row asked) crosses in a single `.tolist()`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sluice.engine.outputs import PromptLogprobs
from sluice.engine.sampled import SampledToken
from sluice.engine.sampling_params import SamplingParams


@dataclass(slots=True)
class LogprobsTensors:
    sampled: Tensor  # [B] float32, logprob of each sampled token
    top_ids: Tensor  # [B, k] int64, most likely first
    top_logprobs: Tensor  # [B, k] float32


def gather_logprobs(raw_logits: Tensor, token_ids: Tensor, num_top: int) -> LogprobsTensors:
    """raw_logits [B, V], token_ids [B]; num_top is the most any row asked for."""
    logprobs = raw_logits.log_softmax(dim=-1)  # [B, V]
    sampled = logprobs.gather(1, token_ids[:, None]).squeeze(1)  # [B]
    top_logprobs, top_ids = logprobs.topk(num_top, dim=-1, sorted=True)  # [B, k]
    return LogprobsTensors(sampled=sampled, top_ids=top_ids, top_logprobs=top_logprobs)


def prompt_logprobs(raw_logits: Tensor, target_ids: Tensor, num_top: int) -> PromptLogprobs:
    """raw_logits [m, V] at m prompt positions, target_ids [m] the prompt token
    after each: their logprobs, ranks and top `num_top`, in one transfer."""
    logprobs = raw_logits.float().log_softmax(dim=-1)  # [m, V]
    target = logprobs.gather(1, target_ids[:, None])  # [m, 1]
    ranks = (logprobs > target).sum(dim=1) + 1  # [m]
    top_logprobs, top_ids = logprobs.topk(num_top, dim=-1, sorted=True)  # [m, k]
    packed = torch.cat(
        [target.double(), ranks[:, None].double(), top_ids.double(), top_logprobs.double()],
        dim=1,
    ).tolist()  # [m, 2 + 2k]
    k = num_top
    return PromptLogprobs(
        logprobs=tuple(row[0] for row in packed),
        ranks=tuple(int(row[1]) for row in packed),
        top_token_ids=tuple(tuple(int(t) for t in row[2 : 2 + k]) for row in packed),
        top_logprobs=tuple(tuple(row[2 + k :]) for row in packed),
    )


def to_sampled_tokens(
    token_ids: Tensor, logprobs: LogprobsTensors | None, params: list[SamplingParams]
) -> list[SampledToken]:
    """Bring a step's results to the host in one transfer and split them by row."""
    if logprobs is None:
        return [SampledToken(token_id=t) for t in token_ids.tolist()]
    k = logprobs.top_ids.shape[1]
    # float64 holds every token id exactly (ids < 2**53), so one packed tensor
    # carries ids and logprobs across in a single sync.
    packed = torch.cat(
        [
            token_ids[:, None].double(),
            logprobs.sampled[:, None].double(),
            logprobs.top_ids.double(),
            logprobs.top_logprobs.double(),
        ],
        dim=1,
    ).tolist()  # [B, 2 + 2k]
    return [_row_token(row, p.logprobs, k) for row, p in zip(packed, params, strict=True)]


def _row_token(row: list[float], num_asked: int | None, k: int) -> SampledToken:
    token_id = int(row[0])
    if num_asked is None:
        return SampledToken(token_id=token_id)
    return SampledToken(
        token_id=token_id,
        logprob=row[1],
        top_token_ids=tuple(int(t) for t in row[2 : 2 + num_asked]),
        top_logprobs=tuple(row[2 + k : 2 + k + num_asked]),
    )
