"""The pooling model runner: one step's sequences -> one vector each.

An encoder (BERT) runs the step as one padded batch: padding is masked out
of attention and dropped before pooling, so a sequence's vector does not
depend on its neighbours. A decoder runs the step as one flat prefill over a
scratch paged KV cache sized for exactly these sequences and dropped after
the step (nothing is kept: a pooling request never decodes). Its vector is
the pooled hidden states (an embedder) or, for a yes/no reranker, the
probability of "yes" against "no" at the last token.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sluice.engine.pooling_params import PoolingInput
from sluice.loader.loaded_model import LoadedModel
from sluice.loader.pooling_model import LoadedPoolingModel
from sluice.models.attention import AttentionMetadata, allocate_kv_caches
from sluice.models.bert import BertEncoder
from sluice.models.pooling import pool

# Tokens per block of a decoder's scratch KV cache.
_SCRATCH_BLOCK_SIZE = 16


class PoolingRunner:
    def __init__(self, loaded: LoadedPoolingModel):
        self.loaded = loaded
        self.spec = loaded.spec

    @torch.inference_mode()
    def execute(self, inputs: list[PoolingInput]) -> Tensor:
        """[B, num_dimensions] float32: each input's vector, before `finish`
        (a score model's is its score, [B, 1])."""
        seq_lens = [len(one.token_ids) for one in inputs]
        if self.loaded.encoder is not None:
            return self._encode(self.loaded.encoder, inputs, seq_lens)
        assert self.loaded.decoder is not None, "a pooling model has an encoder or a decoder"
        return self._decode(self.loaded.decoder, inputs, seq_lens)

    def _encode(self, encoder: BertEncoder, inputs: list[PoolingInput], seq_lens: list[int]):
        batch, length = len(inputs), max(seq_lens)
        device = encoder.embeddings.word_embeddings.weight.device
        ids = torch.zeros(batch, length, dtype=torch.int64)  # [B, L], padded with 0
        types = torch.zeros(batch, length, dtype=torch.int64)  # [B, L]
        is_token = torch.zeros(batch, length, dtype=torch.bool)  # [B, L]
        for row, (one, n) in enumerate(zip(inputs, seq_lens, strict=True)):
            ids[row, :n] = torch.tensor(one.token_ids)
            if one.token_type_ids is not None:
                types[row, :n] = torch.tensor(one.token_type_ids)
            is_token[row, :n] = True
        ids, types, is_token = ids.to(device), types.to(device), is_token.to(device)
        hidden = encoder(ids, types, is_token)  # [B, L, H]
        if self.spec.pair_format == "pair":
            logits = encoder.classify(hidden)  # [B, 1]
            return torch.sigmoid(logits) if self.spec.apply_sigmoid else logits
        return pool(hidden[is_token], seq_lens, self.spec.pooling)  # [B, H]

    def _decode(self, decoder: LoadedModel, inputs: list[PoolingInput], seq_lens: list[int]):
        model = decoder.model
        device = model.embed_tokens.device
        block = _SCRATCH_BLOCK_SIZE
        tables: list[list[int]] = []
        for n in seq_lens:
            first = sum(len(table) for table in tables)
            tables.append(list(range(first, first + math.ceil(n / block))))
        num_blocks = sum(len(table) for table in tables)
        caches = allocate_kv_caches(model.config, num_blocks, block, model.dtype, device)
        meta = AttentionMetadata.build(seq_lens, [0] * len(seq_lens), tables, block, device)
        ids = torch.tensor([t for one in inputs for t in one.token_ids], device=device)  # [T]
        positions = torch.cat([torch.arange(n) for n in seq_lens]).to(device)  # [T]
        hidden = model(ids, positions, caches, meta)  # [T, H], after the final norm
        if self.spec.pair_format != "yes_no":
            return pool(hidden, seq_lens, self.spec.pooling)  # [B, H]
        last = pool(hidden, seq_lens, "last").to(hidden.dtype)  # [B, H]
        logits = model.compute_logits(last)  # [B, V] float32
        yes, no = self.spec.yes_token_id, self.spec.no_token_id
        return torch.sigmoid(logits[:, yes] - logits[:, no])[:, None]  # [B, 1]
