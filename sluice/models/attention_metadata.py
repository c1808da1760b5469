"""Per-step attention plans: which new tokens of a batch run as rows of the
decode kernel and which as prefill chunks, the cache slots their K/V go to,
and the block gathers each reads. Built once per step for all layers
(`AttentionMetadata.__post_init__`); the batch decides them, never the layer.
The cache layout and the attention they plan: sluice/models/attention.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from sluice.models.sequence_state import SequenceStates

# Which tokens of a multi-token chunk run as rows of the decode kernel, over
# exactly their own keys, as a decoded token does (`_num_row_tokens`): every
# token of a chunk of at most MAX_DECODE_ROW_CHUNK (a speculative step
# verifying k drafted tokens: each gets the bits decoding it would, so greedy
# output is the same with speculation on and off), and every token at a
# position below DECODE_ROW_POSITIONS. With the row-invariant matmuls, a
# sequence that stays below that length gets the same bits however its prompt
# is chunked, whether its prefix came from the cache, and after preemption
# (issue 28). Above it, the flash kernels: the decode kernel re-reads the
# keys for every row, which costs more than flash attention from about 512
# positions (benchmarks/attention_kernels.py). Where the prefill kernel is
# chunk-blind (module docstring) both give a row the same bits; these
# constants then choose speed only.
MAX_DECODE_ROW_CHUNK = 65  # 1 + the longest draft SpeculativeConfig allows (64)
DECODE_ROW_POSITIONS = 512


@dataclass(slots=True)
class DecodePlan:
    """How the single-token sequences of a batch read their context, batched."""

    # Flat token index of each decode query; None when the batch is all decodes
    # (then decode i is token i).
    token_indices: Tensor | None  # [num_decodes] int64
    # Cache blocks to gather, num_blocks per decode sequence, padded with block 0.
    block_ids: Tensor  # [num_decodes * num_blocks] int64, contiguous
    # Blocks per decode sequence: enough for the longest one.
    num_blocks: int
    # Keys each decode reads: the longest sequence's length.
    num_keys: int
    # True where a gathered key belongs to its sequence; None when every
    # decode sequence has num_keys tokens (no padding to hide).
    key_mask: Tensor | None  # [num_decodes, 1, 1, num_keys] bool
    # Keys of each decode sequence (its context plus the new token).
    seq_lens: Tensor  # [num_decodes] int64


@dataclass(slots=True)
class PrefillPlan:
    """How one multi-token chunk reads its context."""

    token_start: int
    token_end: int
    context_len: int
    seq_len: int
    # Cache blocks holding the sequence; None when context_len == 0, since then
    # the chunk's own new K/V are the whole sequence.
    block_ids: Tensor | None  # [ceil(seq_len / block_size)] int64
    # The same blocks whatever the context (rows of the decode kernel read them).
    seq_blocks: Tensor | None = None  # [ceil(seq_len / block_size)] int64


@dataclass(slots=True)
class TokenRows:
    """Every new token of a step as its own attention row (batch-invariant mode)."""

    # The cache blocks of each token's sequence, padded with block 0.
    block_ids: Tensor  # [num_tokens, max_num_blocks] int64, contiguous
    # Keys each token reads: its position + 1.
    seq_lens: Tensor  # [num_tokens] int64


@dataclass(slots=True)
class AttentionMetadata:
    # Flat cache slot (block_id * block_size + offset) of each new token's K/V.
    slot_mapping: Tensor  # [num_tokens] int64
    # Cumulative query lengths: sequence b's tokens are [loc[b], loc[b + 1]).
    query_start_loc: Tensor  # [B + 1] int64
    # context_len + query_len per sequence.
    seq_lens: Tensor  # [B] int64
    # Each sequence's cache blocks in position order, padded with 0.
    block_tables: Tensor  # [B, max_num_blocks] int64
    # Host copies of the lengths, for Python-side loops.
    query_lens: list[int]
    seq_lens_list: list[int]
    # Every sequence adds exactly one token.
    is_decode_only: bool
    block_size: int
    # Derived once per step for all layers (see module docstring).
    decode: DecodePlan | None = field(default=None, init=False)
    prefills: list[PrefillPlan] = field(default_factory=list, init=False)
    # Built by the first layer that asks (`token_rows`), then shared.
    _token_rows: TokenRows | None = field(default=None, init=False)
    # Hybrid models: each sequence's recurrent-state slot (sequence_state.py);
    # the runner sets it, a model without it runs each sequence standalone.
    sequence_states: SequenceStates | None = None
    # Host copies of the block tables, for the state's snapshot rows.
    block_table_lists: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.decode = _plan_decodes(self)
        self.prefills = _plan_prefills(self)

    def token_rows(self) -> TokenRows:
        if self._token_rows is None:
            self._token_rows = _plan_token_rows(self)
        return self._token_rows

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str,
    ) -> AttentionMetadata:
        """Describe a batch; vectorised over tokens, Python only over sequences."""
        seq_lens_list = [c + n for c, n in zip(context_lens, query_lens, strict=True)]
        for table, seq_len in zip(block_tables, seq_lens_list, strict=True):
            assert len(table) * block_size >= seq_len, "block table too short for its sequence"
        max_num_blocks = max(len(table) for table in block_tables)
        tables = torch.tensor(
            [table + [0] * (max_num_blocks - len(table)) for table in block_tables],
            dtype=torch.int64,
        )  # [B, max_num_blocks]
        query = torch.tensor(query_lens, dtype=torch.int64)  # [B]
        context = torch.tensor(context_lens, dtype=torch.int64)  # [B]
        query_start_loc = F.pad(query.cumsum(0), (1, 0))  # [B + 1]
        slot_mapping = _slot_mapping(query, context, query_start_loc, tables, block_size)
        return cls(
            slot_mapping=slot_mapping.to(device),
            query_start_loc=query_start_loc.to(device),
            seq_lens=(context + query).to(device),
            block_tables=tables.to(device),
            query_lens=list(query_lens),
            seq_lens_list=seq_lens_list,
            is_decode_only=all(n == 1 for n in query_lens),
            block_size=block_size,
            block_table_lists=block_tables,
        )


def _slot_mapping(
    query: Tensor, context: Tensor, query_start_loc: Tensor, tables: Tensor, block_size: int
) -> Tensor:
    num_tokens = int(query_start_loc[-1])
    seq_of_token = torch.repeat_interleave(torch.arange(len(query)), query)  # [num_tokens]
    offset_in_chunk = torch.arange(num_tokens) - query_start_loc[seq_of_token]  # [num_tokens]
    positions = context[seq_of_token] + offset_in_chunk  # [num_tokens]
    blocks = tables[seq_of_token, positions // block_size]  # [num_tokens]
    return blocks * block_size + positions % block_size  # [num_tokens]


def _num_row_tokens(query_len: int, context_len: int) -> int:
    """How many of a chunk's first tokens run as decode-kernel rows (see
    DECODE_ROW_POSITIONS); a decode's one token always does."""
    if query_len <= MAX_DECODE_ROW_CHUNK:
        return query_len
    return max(0, min(query_len, DECODE_ROW_POSITIONS - context_len))


def _plan_decodes(meta: AttentionMetadata) -> DecodePlan | None:
    """Every token that runs as a decode-kernel row, batched into one call."""
    if meta.is_decode_only:
        sequences, keys = list(range(len(meta.query_lens))), meta.seq_lens_list
        token_indices, tables, seq_lens = None, meta.block_tables, meta.seq_lens
    else:
        tokens: list[int] = []
        sequences, keys, start = [], [], 0
        for b, (query_len, seq_len) in enumerate(
            zip(meta.query_lens, meta.seq_lens_list, strict=True)
        ):
            context_len = seq_len - query_len
            count = _num_row_tokens(query_len, context_len)
            sequences += [b] * count
            tokens += range(start, start + count)
            keys += range(context_len + 1, context_len + count + 1)
            start += query_len
        if not tokens:
            return None
        device = meta.block_tables.device
        token_indices = None if len(tokens) == start else torch.tensor(tokens, device=device)
        tables = meta.block_tables[torch.tensor(sequences, device=device)]
        seq_lens = torch.tensor(keys, dtype=torch.int64, device=device)  # [num_rows]
    max_len = max(keys)
    num_blocks = -(-max_len // meta.block_size)
    key_mask = None
    if any(length != max_len for length in keys):
        key_pos = torch.arange(max_len, device=seq_lens.device)  # [max_len]
        key_mask = (key_pos[None, :] < seq_lens[:, None])[:, None, None, :]
    return DecodePlan(
        token_indices=token_indices,
        block_ids=tables[:, :num_blocks].contiguous().view(-1),
        num_blocks=num_blocks,
        num_keys=max_len,
        key_mask=key_mask,
        seq_lens=seq_lens,
    )


def _plan_token_rows(meta: AttentionMetadata) -> TokenRows:
    device = meta.block_tables.device
    query = torch.tensor(meta.query_lens, dtype=torch.int64, device=device)  # [B]
    seq_of_token = torch.repeat_interleave(torch.arange(len(query), device=device), query)
    token_index = torch.arange(seq_of_token.shape[0], device=device)  # [num_tokens]
    # A sequence's last new token reads all seq_len keys, the one before it one fewer...
    tokens_after = meta.query_start_loc[1:][seq_of_token] - 1 - token_index  # [num_tokens]
    seq_lens = meta.seq_lens[seq_of_token] - tokens_after  # [num_tokens]
    return TokenRows(block_ids=meta.block_tables[seq_of_token], seq_lens=seq_lens)


def _plan_prefills(meta: AttentionMetadata) -> list[PrefillPlan]:
    """Each chunk's tokens past its decode-kernel rows, as one flash call."""
    plans = []
    token_start = 0
    for b, (query_len, seq_len) in enumerate(zip(meta.query_lens, meta.seq_lens_list, strict=True)):
        num_rows = _num_row_tokens(query_len, seq_len - query_len)
        context_len = seq_len - query_len + num_rows
        if num_rows < query_len:
            seq_blocks = meta.block_tables[b, : -(-seq_len // meta.block_size)]
            block_ids = seq_blocks if context_len > 0 else None
            start, end = token_start + num_rows, token_start + query_len
            plans.append(PrefillPlan(start, end, context_len, seq_len, block_ids, seq_blocks))
        token_start += query_len
    return plans
