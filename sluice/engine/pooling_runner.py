"""The pooling model runner: one step's sequences -> one vector each.

An encoder (BERT) runs the step as one flat batch (`EncoderBatch`: no
padding but inside attention, where it is masked out), so a sequence's
vector does not depend on its neighbours. A decoder runs the step as one flat prefill over a
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
from sluice.models.bert import BertEncoder, EncoderBatch
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
        device = encoder.embeddings.word_embeddings.weight.device
        batch = EncoderBatch.build(
            [one.token_ids for one in inputs], [one.token_type_ids for one in inputs], device
        )
        hidden = encoder(batch)  # [T, H]
        if self.spec.pair_format == "pair":
            logits = encoder.classify(hidden, batch)  # [B, 1]
            return torch.sigmoid(logits) if self.spec.apply_sigmoid else logits
        return pool(hidden, seq_lens, self.spec.pooling)  # [B, H]

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
