"""Gemma 3 (text) as our Llama decoder with Gemma's differences.

What differs from `LlamaForCausalLM`, and where each lives:
- norms multiply by (1 + weight): the 1 is added to every norm weight as it
  is loaded (`WeightTarget.offset`, in float32), so the plain RMSNorm and its
  native kernel serve Gemma unchanged;
- four norms per layer: before attention, on the attention's output, before
  the MLP and on its output (HF's `post_attention_layernorm` is the second);
- q and k get a per-head norm before RoPE (the decoder's `qk_norms`);
- the embedding is multiplied by sqrt(hidden_size), rounded to the model
  dtype first, as transformers does;
- the MLP is GeGLU: gelu (tanh approximation) of the gate times up;
- scores scale by query_pre_attn_scalar ** -0.5 (`LlamaConfig.attention_scale`);
- "sliding_attention" layers see the last `sliding_window` positions
  (sluice/models/sliding_window.py, which keeps all their KV blocks) and
  rotate with the local RoPE base; "full_attention" layers use the global
  base and its scaling, and every engine path of a Llama layer;
- logits may be soft-capped: cap * tanh(logits / cap).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from sluice.models.attention import AttentionMetadata
from sluice.models.config import SLIDING, LlamaConfig
from sluice.models.linear import uninitialised_weight
from sluice.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from sluice.models.rope_norm import Float32Angles, RMSNorm, RopeAngles, rope_cos_sin
from sluice.models.weight_targets import WeightTarget


class Gemma3DecoderLayer(LlamaDecoderLayer):
    # Norms on the attention's and the MLP's outputs: not the fused chain.
    supports_fused_decode: ClassVar[bool] = False

    def __init__(
        self, config: LlamaConfig, index: int, dtype: torch.dtype, device, batch_invariant: bool
    ):
        is_sliding = config.layer_types[index] == SLIDING
        super().__init__(config, dtype, device, batch_invariant, is_sliding)
        p = {"dtype": dtype, "device": device}
        self.pre_feedforward_layernorm = uninitialised_weight(config.hidden_size, **p)
        self.post_feedforward_layernorm = uninitialised_weight(config.hidden_size, **p)
        self.swiglu = _geglu

    def finish_loading(self) -> None:
        super().finish_loading()
        norms = (self.post_attention_layernorm, self.pre_feedforward_layernorm,
                 self.post_feedforward_layernorm)  # fmt: skip
        self.attention_out_norm, self.mlp_norm, self.mlp_out_norm = (
            RMSNorm(weight, self.eps, self.batch_invariant) for weight in norms
        )

    def forward(
        self,
        hidden: Tensor,  # [T, hidden], updated in place (the residual stream)
        rope: RopeAngles | Float32Angles,
        kv_cache: Tensor,
        attn: AttentionMetadata,
    ) -> Tensor:
        attended = self._attention(self.attention_norm(hidden), rope, kv_cache, attn)
        hidden += self.attention_out_norm(attended)
        hidden += self.mlp_out_norm(self._mlp(self.mlp_norm(hidden)))
        return hidden


def _geglu(gate_up: Tensor) -> Tensor:  # [T, 2 I] (gate, then up) -> [T, I]
    gate, up = gate_up.chunk(2, dim=-1)  # [T, I] each
    return F.gelu(gate, approximate="tanh").mul_(up)


class Gemma3ForCausalLM(LlamaForCausalLM):
    def __init__(
        self,
        config: LlamaConfig,
        dtype: torch.dtype,
        device: torch.device | str,
        batch_invariant: bool = False,
    ):
        super().__init__(config, dtype, device, batch_invariant)
        self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=dtype, device=device)
        # The sliding layers' own RoPE base, unscaled.
        local = dataclasses.replace(config, rope_theta=config.rope_local_theta, rope_scaling=None)
        cos, sin = rope_cos_sin(local, self.rope_cos.dtype, device)
        self.register_buffer("rope_local_cos", cos, persistent=False)  # [max_pos, head_dim // 2]
        self.register_buffer("rope_local_sin", sin, persistent=False)  # [max_pos, head_dim // 2]

    def forward(
        self,
        input_ids: Tensor,  # [num_tokens] int64, flat over the batch
        positions: Tensor,  # [num_tokens] int64
        kv_caches: list[Tensor],  # per layer [2, num_blocks, block_size, Hkv, head_dim]
        attn: AttentionMetadata,
    ) -> Tensor:  # [num_tokens, hidden], after the final norm
        hidden = F.embedding(input_ids, self.embed_tokens).mul_(self.embed_scale)  # [T, hidden]
        global_rope = self._rope_at(self.rope_cos, self.rope_sin, positions)
        local_rope = self._rope_at(self.rope_local_cos, self.rope_local_sin, positions)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer(hidden, local_rope if layer.is_sliding else global_rope, kv_cache, attn)
        return self.final_norm(hidden)

    def compute_logits(self, hidden: Tensor) -> Tensor:  # [n, hidden] -> [n, vocab] float32
        logits = super().compute_logits(hidden)
        cap = self.config.final_logit_softcapping
        if cap is None:
            return logits
        return logits.div_(cap).tanh_().mul_(cap)

    def _make_layer(self, index: int, dtype: torch.dtype, device) -> Gemma3DecoderLayer:
        return Gemma3DecoderLayer(self.config, index, dtype, device, self.batch_invariant)

    def _weight_targets(self) -> dict[str, WeightTarget]:
        targets = super()._weight_targets()
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
                targets[f"{prefix}{name}.weight"] = WeightTarget(getattr(layer, name))
        for name, target in targets.items():
            if name.endswith("norm.weight"):
                target.offset = 1.0  # Gemma's (1 + weight)
        return targets
