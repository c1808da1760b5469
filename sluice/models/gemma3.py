"""Gemma 3 (text) and Gemma 2 as our decoder with Gemma's own layer.

What differs from a Llama, and where each lives:
- norms multiply by (1 + weight): the 1 is added to every norm weight as it
  is loaded (`DecoderConfig.norm_offset`, in float32), so the plain RMSNorm
  and its native kernel serve Gemma unchanged;
- four norms per layer: before attention, on the attention's output, before
  the MLP and on its output (HF's `post_attention_layernorm` is the second):
  this module's layer and its weight names;
- q and k get a per-head norm before RoPE (`DecoderConfig.qk_norm`, Gemma 3);
- the embedding is multiplied by sqrt(hidden_size), rounded to the model
  dtype first, as transformers does (`DecoderConfig.embedding_scale`);
- the MLP is GeGLU: gelu (tanh approximation) of the gate times up;
- scores scale by query_pre_attn_scalar ** -0.5 (`DecoderConfig.attention_scale`);
- "sliding_attention" layers see the last `sliding_window` positions
  (sluice/models/sliding_window.py, which keeps all their KV blocks) and
  rotate with the local RoPE base (`DecoderConfig.rope_local_theta`);
  "full_attention" layers use the global base and its scaling;
- logits may be soft-capped: cap * tanh(logits / cap)
  (`DecoderConfig.final_logit_softcapping`), attention scores too (Gemma 2).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from sluice.models.attention import AttentionMetadata
from sluice.models.decoder_config import DecoderConfig
from sluice.models.linear import uninitialised_weight
from sluice.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from sluice.models.rope_norm import Float32Angles, RMSNorm, RopeAngles
from sluice.models.weight_targets import WeightTarget


class Gemma3DecoderLayer(LlamaDecoderLayer):
    # Norms on the attention's and the MLP's outputs: not the fused chain.
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
    layer_class: ClassVar[type[LlamaDecoderLayer]] = Gemma3DecoderLayer

    def _weight_targets(self) -> dict[str, WeightTarget]:
        targets = super()._weight_targets()
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
                targets[f"{prefix}{name}.weight"] = WeightTarget(getattr(layer, name))
        return targets
