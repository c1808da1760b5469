"""Teacher-forced log-likelihood of a token sequence, over the paged KV cache.

`token_logprobs(model, token_ids)` feeds the sequence through the model in
chunks of `chunk_tokens` (the way the engine prefills; chunks of up to 8
tokens take the same weight-only quantized kernels as decode steps) and
returns, for each token after the first, the log-probability the model gave
it. Its mean is the negative log-likelihood per token; exp(-mean) the
perplexity (`perplexity`). Used to hold the default dtype and quantization to float32's
quality (tests/test_quality_gate.py, benchmarks/quality.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from sluice.models.attention import AttentionMetadata, allocate_kv_caches
from sluice.models.llama import LlamaForCausalLM

_BLOCK_SIZE = 16


@torch.inference_mode()
def forward_chunks(
    model: LlamaForCausalLM,
    token_ids: list[int],
    chunk_tokens: int,
    kv_dtype: torch.dtype | None = None,
) -> Iterator[tuple[int, int, Tensor]]:
    """(start, end, hidden [end - start, hidden]) for each chunk of `token_ids`,
    fed through the model in order over a paged KV cache of its own (in
    `kv_dtype`, int8 for models/kv_int8.py's pool; None: the model's)."""
    num_blocks = -(-len(token_ids) // _BLOCK_SIZE)
    device = model.norm.device  # the final norm: a tensor on every path (lm_head may be blocks)
    caches = allocate_kv_caches(
        model.config, num_blocks, _BLOCK_SIZE, model.dtype, device, kv_dtype=kv_dtype
    )
    table = [list(range(num_blocks))]
    ids = torch.tensor(token_ids, dtype=torch.int64, device=device)
    for start in range(0, len(token_ids), chunk_tokens):
        end = min(start + chunk_tokens, len(token_ids))
        meta = AttentionMetadata.build([end - start], [start], table, _BLOCK_SIZE, device)
        positions = torch.arange(start, end, device=device)
        yield start, end, model(ids[start:end], positions, caches, meta)


@torch.inference_mode()
def token_logprobs(
    model: LlamaForCausalLM,
    token_ids: list[int],
    chunk_tokens: int = 8,
    kv_dtype: torch.dtype | None = None,
) -> list[float]:
    """log p(token_i | tokens before it) for i = 1 .. len(token_ids) - 1."""
    targets = torch.tensor(token_ids[1:], dtype=torch.int64, device=model.norm.device)
    logprobs: list[float] = []
    for start, end, hidden in forward_chunks(model, token_ids[:-1], chunk_tokens, kv_dtype):
        log_probs = torch.log_softmax(model.compute_logits(hidden), dim=-1)  # [n, vocab] f32
        logprobs += log_probs.gather(1, targets[start:end, None])[:, 0].tolist()
    return logprobs


def perplexity(
    model: LlamaForCausalLM,
    token_ids: list[int],
    chunk_tokens: int = 8,
    kv_dtype: torch.dtype | None = None,
) -> float:
    """exp of the mean negative log-likelihood of `token_ids` after the first."""
    logprobs = token_logprobs(model, token_ids, chunk_tokens, kv_dtype)
    return math.exp(-sum(logprobs) / len(logprobs))
