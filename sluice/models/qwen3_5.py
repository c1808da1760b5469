"""Qwen3.5 (dense text): Gated DeltaNet layers (sluice/models/gated_deltanet.py)
between gated full-attention layers, over the decoder of sluice/models/llama.py.

A full-attention layer is the decoder's with Qwen3's per-head q/k RMSNorm,
partial RoPE (a quarter of each head by default) and an output gate: q_proj
holds, per head, the query's rows then the gate's; the heads' attention
output is multiplied by sigmoid(gate) before o_proj (`GatedAttentionLayer`;
the gate's rows follow q, k and v in the fused `qkv_proj`, so the
row-invariant int8 scheme covers them as any q/k/v row). Every RMSNorm but the Gated DeltaNet's
own multiplies by (1 + weight): the offset is added as the weights load.

`Qwen3_5ConditionalTextModel` runs a multimodal `Qwen3_5ForConditionalGeneration`
checkpoint as its text decoder: weights under `model.language_model.`, the
vision tower skipped; multi-token-prediction weights (`mtp.*`) are skipped in
both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import Tensor

from sluice.models.attention import AttentionMetadata
from sluice.models.block_codes import BlockCodes
from sluice.models.decoder_config import LINEAR, DecoderConfig
from sluice.models.gated_deltanet import GatedDeltaNetLayer
from sluice.models.linear import Linear, in_row_tiles
from sluice.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from sluice.models.rope_norm import Float32Angles, RopeAngles
from sluice.models.weight_targets import WeightTarget, decoder_layer_targets

# Norms that multiply by (1 + weight) (transformers' Qwen3NextRMSNorm).
_CENTERED_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight",
                   "self_attn.q_norm.weight", "self_attn.k_norm.weight")  # fmt: skip
# Where the output gate's rows of q_proj load (no such tensor in the checkpoint).
_GATE_NAME = "self_attn.q_proj.weight(gate rows)"


class GatedAttentionLayer(LlamaDecoderLayer):
    supports_fused_decode: ClassVar[bool] = False

    def __init__(
        self,
        config: DecoderConfig,
        dtype: torch.dtype,
        device,
        batch_invariant: bool = False,
        is_sliding: bool = False,
    ):
        super().__init__(config, dtype, device, batch_invariant, is_sliding)
        # The torch rotation (RopeAngles), whichever part of a head rotates.
        self.rope_write_kv = None
        # Rows: q heads, k heads, v heads, then the gate's (Hq * D).
        self.num_qkv_rows = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        rows = self.num_qkv_rows + self.num_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, rows, False, dtype=dtype, device=device,
                               row_tile=self.row_tile)  # fmt: skip

    def forward(
        self,
        hidden: Tensor,  # [T, hidden], updated in place (the residual stream)
        rope: RopeAngles | Float32Angles,
        kv_cache: Tensor,
        attn: AttentionMetadata,
    ) -> Tensor:
        hidden += self._gated_attention(self.attention_norm(hidden), rope, kv_cache, attn)
        hidden += self._mlp(self.mlp_norm(hidden))
        return hidden

    def _gated_attention(
        self, x: Tensor, rope: RopeAngles | Float32Angles, kv_cache: Tensor, attn: AttentionMetadata
    ) -> Tensor:  # [T, hidden]
        assert isinstance(rope, RopeAngles), "partial rotary rotates on the torch path"
        # One rotation formula for every step size (RopeAngles' few-token one
        # rounds otherwise): a row's bits must not follow the step's size.
        rope = RopeAngles(rope.cos, rope.sin, None, None)
        num_tokens = x.shape[0]
        num_qk_heads = self.num_heads + self.num_kv_heads
        projected = self.qkv_proj(x)  # [T, (Hq + 2 Hkv) * D + Hq * D]
        qkv = projected[:, : self.num_qkv_rows].view(num_tokens, -1, self.head_dim)
        if self.qk_norms is not None:
            self._norm_qk(qkv)
        qk = rope.rotate(qkv[:, :num_qk_heads])  # [T, Hq + Hkv, D]
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        out = self.attend(q, k, qkv[:, num_qk_heads:], kv_cache, attn, self.scale)  # [T, Hq, D]
        gate = projected[:, self.num_qkv_rows :]  # [T, Hq * D]
        return self.o_proj(_gated(out.reshape(num_tokens, -1), gate))


def _gated(out: Tensor, gate: Tensor) -> Tensor:  # [T, Hq * D] each -> out * sigmoid(gate)
    """Row by row: the same shape, so the same vector and scalar lanes of
    sigmoid, for a row whatever the step's size or its threads' split."""
    width = out.shape[1]
    both = torch.cat((out, gate), dim=1)  # [T, 2 Hq * D]
    return in_row_tiles(lambda row: row[:, :width] * torch.sigmoid(row[:, width:]), both, 1)


class Qwen3_5ForCausalLM(LlamaForCausalLM):
    def _make_layer(self, index: int, dtype, device) -> LlamaDecoderLayer:
        if self.config.layer_types[index] == LINEAR:
            return GatedDeltaNetLayer(self.config, dtype, device, self.batch_invariant)
        return GatedAttentionLayer(self.config, dtype, device, self.batch_invariant)

    def load_weights(self, weights: Iterable[tuple[str, Tensor | BlockCodes]]) -> None:
        super().load_weights(self._as_targets(weights))

    def _as_targets(
        self, weights: Iterable[tuple[str, Tensor | BlockCodes]]
    ) -> Iterable[tuple[str, Tensor | BlockCodes]]:
        """q_proj split into the query's rows and the gate's; conv kernels
        [conv_dim, 1, L] squeezed; multi-token-prediction weights skipped."""
        num_heads, head_dim = self.config.num_attention_heads, self.config.head_dim
        for name, tensor in weights:
            if name.startswith("mtp."):
                continue
            if name.endswith("conv1d.weight") and isinstance(tensor, Tensor) and tensor.dim() == 3:
                tensor = tensor.squeeze(1)
            if name.endswith("self_attn.q_proj.weight") and isinstance(tensor, Tensor):
                halves = tensor.reshape(num_heads, 2, head_dim, -1)  # [Hq, (q, gate), D, hidden]
                yield name, halves[:, 0].reshape(num_heads * head_dim, -1)
                name, tensor = name.replace("self_attn.q_proj.weight", _GATE_NAME), halves[:, 1]
                tensor = tensor.reshape(num_heads * head_dim, -1)
            yield name, tensor

    def _weight_targets(self) -> dict[str, WeightTarget]:
        targets = {
            "model.embed_tokens.weight": WeightTarget(self.embed_tokens),
            "model.norm.weight": WeightTarget(self.norm, offset=1.0),
        }
        if not self.config.tie_word_embeddings:
            targets["lm_head.weight"] = WeightTarget(self.lm_head.weight)
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            decoder = decoder_layer_targets(prefix, layer, False)
            if isinstance(layer, GatedDeltaNetLayer):
                decoder = {k: v for k, v in decoder.items() if "self_attn." not in k}
                decoder.update(layer.weight_targets(prefix))
            elif isinstance(layer, GatedAttentionLayer):
                gate_end = layer.num_qkv_rows + layer.num_heads * layer.head_dim
                qkv = layer.qkv_proj.weight
                decoder[prefix + _GATE_NAME] = WeightTarget(qkv, layer.num_qkv_rows, gate_end)
            for name in _CENTERED_NORMS:
                if prefix + name in decoder:
                    decoder[prefix + name].offset = 1.0
            targets.update(decoder)
        return targets


class Qwen3_5ConditionalTextModel(Qwen3_5ForCausalLM):
    """The text decoder of a multimodal `Qwen3_5ForConditionalGeneration`
    checkpoint (module docstring)."""

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, Tensor | BlockCodes]]) -> None:
        super().load_weights(
            (_TEXT_NAMES.sub("model.", name), tensor)
            for name, tensor in weights
            if not name.startswith("model.visual.")
        )


_TEXT_NAMES = re.compile(r"^model\.language_model\.")
