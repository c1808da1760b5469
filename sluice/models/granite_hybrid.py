"""IBM Granite 4.0-H (`GraniteMoeHybridForCausalLM`): Mamba-2 layers
(sluice/models/mamba2.py) interleaved with attention layers, over our decoder.

What differs from the decoder, as transformers 5.24's granitemoehybrid runs it:
- every layer's two halves are scaled before joining the residual stream:
  `hidden + out * residual_multiplier`; the embedding is multiplied by
  `embedding_multiplier` (`DecoderConfig.embedding_scale`), attention scores by
  `attention_multiplier` (`query_pre_attn_scalar`), and the logits divided by
  `logits_scaling`;
- the MLP half is the dense `shared_mlp` (SwiGLU, `input_linear` holding gate
  then up), plus in the MoE sizes a mixture of experts (moe.py, top-k logits
  then softmax) whose output is added before the shared MLP's;
- attention without RoPE where `position_embedding_type` is not "rope"
  (Granite 4.0-H): those layers are `nope_layers`, rotated by angle 0.

The checkpoint's MoE tensors come under granitemoe's names
(`block_sparse_moe.input_linear` [E, 2I, H], `output_linear` [E, H, I],
`router.layer`) or transformers 5's (`experts.gate_up_proj`,
`experts.down_proj`, `router.weight`); both load. The fused `input_linear`
(shared and experts) loads as its gate and up halves, under the names a
granitehybrid GGUF gives them (`shared_mlp.gate_proj` / `up_proj`,
`block_sparse_moe.gate_proj` / `up_proj`: families/granite_hybrid.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from sluice.models.attention import AttentionMetadata
from sluice.models.block_codes import BlockCodes
from sluice.models.decoder_config import MAMBA, DecoderConfig
from sluice.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from sluice.models.mamba2 import Mamba2Layer
from sluice.models.mamba2_config import MambaDecoderConfig
from sluice.models.moe import MoeBlock
from sluice.models.rope_norm import Float32Angles, RopeAngles
from sluice.models.weight_targets import WeightTarget

# transformers 5's MoE names -> granitemoe's, which the targets use.
_MOE_NAMES = {
    "block_sparse_moe.experts.gate_up_proj": "block_sparse_moe.input_linear.weight",
    "block_sparse_moe.experts.down_proj": "block_sparse_moe.output_linear.weight",
    "block_sparse_moe.router.weight": "block_sparse_moe.router.layer.weight",
}


@dataclass(frozen=True, slots=True)
class GraniteHybridConfig(MambaDecoderConfig):
    """Granite 4.0-H: Mamba-2 and attention layers, and Granite's scalings."""

    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0


class GraniteAttentionLayer(LlamaDecoderLayer):
    supports_fused_decode = False  # the fused chain has no residual scaling
    moe: MoeBlock | None
    residual_multiplier: float

    def _build_mlp(self, config: DecoderConfig, p: dict) -> None:
        _build_granite_mlp(self, config, p)

    def _mlp(self, x: Tensor) -> Tensor:
        return _granite_mlp(self, x)

    def forward(
        self,
        hidden: Tensor,  # [T, hidden], updated in place (the residual stream)
        rope: RopeAngles | Float32Angles,
        kv_cache: Tensor,
        attn: AttentionMetadata,
    ) -> Tensor:
        m = self.residual_multiplier
        hidden += _scaled(self._attention(self.attention_norm(hidden), rope, kv_cache, attn), m)
        hidden += _scaled(self._mlp(self.mlp_norm(hidden)), m)
        return hidden


class GraniteMambaLayer(Mamba2Layer):
    moe: MoeBlock | None
    residual_multiplier: float

    def _build_mlp(self, config: DecoderConfig, p: dict) -> None:
        _build_granite_mlp(self, config, p)

    def _mlp(self, x: Tensor) -> Tensor:
        return _granite_mlp(self, x)

    def forward(
        self,
        hidden: Tensor,  # [T, hidden], updated in place (the residual stream)
        rope: RopeAngles | Float32Angles,
        kv_cache: Tensor,  # this layer's state rows (mamba2_config.py)
        attn: AttentionMetadata,
    ) -> Tensor:
        m = self.residual_multiplier
        hidden += _scaled(self.mix(self.attention_norm(hidden), kv_cache, attn), m)
        hidden += _scaled(self._mlp(self.mlp_norm(hidden)), m)
        return hidden


GraniteLayer = GraniteAttentionLayer | GraniteMambaLayer


def _build_granite_mlp(layer: GraniteLayer, config: DecoderConfig, p: dict) -> None:
    """The shared MLP (the decoder's gate_up/down), the experts where the
    model has them, and the residual scaling."""
    assert isinstance(config, GraniteHybridConfig), "a Granite layer needs its config"
    LlamaDecoderLayer._build_mlp(layer, config, p)
    layer.moe = MoeBlock(config, p["dtype"], p["device"]) if config.num_experts else None
    layer.residual_multiplier = config.residual_multiplier


def _granite_mlp(layer: GraniteLayer, x: Tensor) -> Tensor:  # [T, hidden]
    shared = LlamaDecoderLayer._mlp(layer, x)
    if layer.moe is None:
        return shared
    return layer.moe(x, layer.swiglu) + shared  # as transformers adds them


def _expert_targets(layer: GraniteLayer, prefix: str) -> dict[str, WeightTarget]:
    if (moe := layer.moe) is None:
        return {}
    width = moe.down.shape[2]  # [E, H, I]
    return {
        prefix + "block_sparse_moe.router.layer.weight": WeightTarget(moe.router),
        # Views of the [E, 2I, H] stack: copies land in it.
        prefix + "block_sparse_moe.gate_proj.weight": WeightTarget(moe.gate_up[:, :width]),
        prefix + "block_sparse_moe.up_proj.weight": WeightTarget(moe.gate_up[:, width:]),
        prefix + "block_sparse_moe.output_linear.weight": WeightTarget(moe.down),
    }


def _scaled(out: Tensor, multiplier: float) -> Tensor:
    return out if multiplier == 1.0 else out.mul_(multiplier)


class GraniteHybridForCausalLM(LlamaForCausalLM):
    layer_class = GraniteAttentionLayer

    def _make_layer(self, index: int, dtype: torch.dtype, device) -> LlamaDecoderLayer:
        if self.config.layer_types[index] == MAMBA:
            return GraniteMambaLayer(self.config, dtype, device, self.batch_invariant)
        return GraniteAttentionLayer(self.config, dtype, device, self.batch_invariant)

    def compute_logits(self, hidden: Tensor) -> Tensor:  # [n, hidden] -> [n, vocab] float32
        assert isinstance(self.config, GraniteHybridConfig), "Granite's logits need its config"
        logits = super().compute_logits(hidden)
        scaling = self.config.logits_scaling
        return logits if scaling == 1.0 else logits.div_(scaling)

    def load_weights(self, weights: Iterable[tuple[str, Tensor | BlockCodes]]) -> None:
        super().load_weights(_granite_names(weights))

    def _weight_targets(self) -> dict[str, WeightTarget]:
        targets = {
            "model.embed_tokens.weight": WeightTarget(self.embed_tokens),
            "model.norm.weight": WeightTarget(self.norm),
        }
        if not self.config.tie_word_embeddings:
            targets["lm_head.weight"] = WeightTarget(self.lm_head.weight)
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, GraniteAttentionLayer | GraniteMambaLayer), "a Granite layer"
            prefix = f"model.layers.{i}."
            targets.update(_layer_targets(prefix, layer))
        return targets


def _layer_targets(prefix: str, layer: GraniteLayer) -> dict[str, WeightTarget]:
    width = layer.down_proj.weight.shape[1]  # the shared MLP's
    targets = {
        prefix + "input_layernorm.weight": WeightTarget(layer.input_layernorm),
        prefix + "post_attention_layernorm.weight": WeightTarget(layer.post_attention_layernorm),
        prefix + "shared_mlp.gate_proj.weight": WeightTarget(layer.gate_up_proj.weight, 0, width),
        prefix + "shared_mlp.up_proj.weight": WeightTarget(
            layer.gate_up_proj.weight, width, 2 * width
        ),
        prefix + "shared_mlp.output_linear.weight": WeightTarget(layer.down_proj.weight),
        **_expert_targets(layer, prefix),
    }
    if isinstance(layer, GraniteMambaLayer):
        return targets | layer.weight_targets(prefix + "mamba.")
    rows = {"q": layer.num_heads * layer.head_dim, "k": layer.num_kv_heads * layer.head_dim}
    rows["v"] = rows["k"]
    start = 0
    qkv = layer.qkv_proj
    for proj, count in rows.items():
        targets[f"{prefix}self_attn.{proj}_proj.weight"] = WeightTarget(
            qkv.weight, start, start + count
        )
        if qkv.bias is not None:
            targets[f"{prefix}self_attn.{proj}_proj.bias"] = WeightTarget(
                qkv.bias, start, start + count
            )
        start += count
    targets[prefix + "self_attn.o_proj.weight"] = WeightTarget(layer.o_proj.weight)
    if layer.o_proj.bias is not None:
        targets[prefix + "self_attn.o_proj.bias"] = WeightTarget(layer.o_proj.bias)
    return targets


def _granite_names(
    weights: Iterable[tuple[str, Tensor | BlockCodes]],
) -> Iterable[tuple[str, Tensor | BlockCodes]]:
    """transformers 5's MoE names to granitemoe's; conv kernels [C, 1, L] -> [C, L];
    a fused `input_linear` [..., 2I, H] as its gate and up halves."""
    for name, tensor in weights:
        for new, old in _MOE_NAMES.items():
            if name.endswith(new):
                name = name[: -len(new)] + old
        if (
            isinstance(tensor, Tensor)
            and name.endswith("mamba.conv1d.weight")
            and tensor.dim() == 3
        ):
            tensor = tensor.squeeze(1)  # [conv_dim, 1, L] -> [conv_dim, L]
        if isinstance(tensor, Tensor) and name.endswith(".input_linear.weight"):
            stem = name.removesuffix("input_linear.weight")
            gate, up = tensor.chunk(2, dim=-2)
            yield stem + "gate_proj.weight", gate
            yield stem + "up_proj.weight", up
            continue
        yield name, tensor
