"""Liquid's LFM2: short gated convolution layers (sluice/models/short_conv.py)
between attention layers, over the decoder of sluice/models/llama.py.

An attention layer is the decoder's (q/k RMSNorm per head, full RoPE,
SwiGLU); a "conv" layer (`DecoderConfig.layer_types`) keeps a per-sequence
state instead of K/V (sluice/models/sequence_state.py), whose slot each
step names in `AttentionMetadata.sequence_states`. Only the tensor names
differ from the decoder's: `operator_norm`/`ffn_norm` around each half,
`feed_forward.w1/w3/w2` for gate/up/down, `out_proj`, `q_layernorm`, and
the final norm `embedding_norm`.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor

from sluice.models.block_codes import BlockCodes
from sluice.models.decoder_config import CONV
from sluice.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from sluice.models.short_conv import ShortConvLayer
from sluice.models.weight_targets import WeightTarget, decoder_layer_targets

# The decoder's tensor names -> LFM2's, within a layer.
_LAYER_NAMES = {
    "input_layernorm.": "operator_norm.",
    "post_attention_layernorm.": "ffn_norm.",
    "self_attn.o_proj.": "self_attn.out_proj.",
    "self_attn.q_norm.": "self_attn.q_layernorm.",
    "self_attn.k_norm.": "self_attn.k_layernorm.",
    "mlp.gate_proj.": "feed_forward.w1.",
    "mlp.up_proj.": "feed_forward.w3.",
    "mlp.down_proj.": "feed_forward.w2.",
}


class Lfm2ForCausalLM(LlamaForCausalLM):
    def _make_layer(self, index: int, dtype, device) -> LlamaDecoderLayer:
        if self.config.layer_types[index] == CONV:
            return ShortConvLayer(self.config, dtype, device, self.batch_invariant)
        return LlamaDecoderLayer(self.config, dtype, device, self.batch_invariant)

    def load_weights(self, weights: Iterable[tuple[str, Tensor | BlockCodes]]) -> None:
        """transformers' conv kernels [hidden, 1, L] load as llama.cpp's [hidden, L]."""
        super().load_weights(_squeezed_kernels(weights))

    def _weight_targets(self) -> dict[str, WeightTarget]:
        targets = {
            "model.embed_tokens.weight": WeightTarget(self.embed_tokens),
            "model.embedding_norm.weight": WeightTarget(self.norm),
        }
        if not self.config.tie_word_embeddings:
            targets["lm_head.weight"] = WeightTarget(self.lm_head.weight)
        for i, layer in enumerate(self.layers):
            prefix = f"model.layers.{i}."
            decoder = decoder_layer_targets(prefix, layer, False)
            if isinstance(layer, ShortConvLayer):
                # The conv layer's own matrices, not attention's.
                decoder = {k: v for k, v in decoder.items() if "self_attn." not in k}
                targets.update(layer.weight_targets(prefix))
            targets.update({_lfm2_name(prefix, name): t for name, t in decoder.items()})
        return targets


def _squeezed_kernels(
    weights: Iterable[tuple[str, Tensor | BlockCodes]],
) -> Iterable[tuple[str, Tensor | BlockCodes]]:
    for name, tensor in weights:
        if name.endswith("conv.conv.weight") and isinstance(tensor, Tensor) and tensor.dim() == 3:
            tensor = tensor.squeeze(1)  # [hidden, 1, L] -> [hidden, L]
        yield name, tensor


def _lfm2_name(prefix: str, name: str) -> str:
    rest = name[len(prefix) :]
    for ours, theirs in _LAYER_NAMES.items():
        if rest.startswith(ours):
            return prefix + theirs + rest[len(ours) :]
    return name
