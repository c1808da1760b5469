"""Gemma 4 (text decoder, `Gemma4ForCausalLM`) on Gemma 3's layer, as transformers 5.24 runs it.

What Gemma 4 adds to Gemma 3, and where each lives:
- norms multiply by their weight (no 1 + weight: `norm_offset` 0); q and k
  heads get an RMSNorm, v heads one without weight (`DecoderConfig.v_norm`);
  scores are not scaled (the norms do it: `query_pre_attn_scalar` 1);
- full-attention layers have their own head size and KV heads
  (`full_head_dim`, `full_num_key_value_heads`) and may take V from k_proj's
  output (`full_attention_k_eq_v`); their RoPE is "proportional": the first
  quarter of a head's frequency pairs turn, the rest have frequency 0
  (rope_norm.py), on the whole head; sliding layers rotate with the local base;
- the last `num_kv_shared_layers` layers compute no K/V: each attends over
  the cache of the last earlier layer of its kind (the very tensor:
  attention.allocate_kv_caches), with that layer's K/V of the step, handed
  on in `SharedKV`; their MLP may be twice as wide (`double_wide_shared_mlp`);
- per-layer embeddings (PLE): a second table gives each token
  `per_layer_input_size` values per layer, mixed with a projection of the
  embedding (RMS-normed) and scaled by 2 ** -0.5; after its MLP each layer
  gates them by gelu(per_layer_input_gate(hidden)), projects back, norms and
  adds them to the residual;
- every layer's output is multiplied by its `layer_scalar`.
Those layers rotate q and k on the torch path (`RopeAngles.rotate`; no
native RoPE + K/V kernel) and are not the fused decode chain. The MoE
variant (`enable_moe_block`) is refused by the parser.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from sluice.models.attention import AttentionMetadata
from sluice.models.block_codes import BlockCodes
from sluice.models.decoder_config import FULL, SLIDING, DecoderConfig
from sluice.models.gemma3 import Gemma3DecoderLayer, Gemma3ForCausalLM
from sluice.models.linear import Linear, in_row_tiles, uninitialised_weight
from sluice.models.llama import LlamaDecoderLayer
from sluice.models.rope_norm import Float32Angles, RMSNorm, RopeAngles, rope_cos_sin
from sluice.models.weight_targets import WeightTarget

# Layer kind -> (K, V) of this step from the last unshared layer of that kind.
SharedKV = dict[str, tuple[Tensor, Tensor]]


def layer_config(config: DecoderConfig, index: int) -> DecoderConfig:
    """Layer `index`'s shapes: a full layer's own heads, a shared layer's MLP width."""
    num_kv_heads, head_dim = config.layer_kv_shape(index)
    is_shared = config.kv_source_layer(index) != index
    width = config.intermediate_size * (2 if is_shared and config.double_wide_shared_mlp else 1)
    return dataclasses.replace(
        config, head_dim=head_dim, rotary_dim=head_dim, num_key_value_heads=num_kv_heads,
        intermediate_size=width,
    )  # fmt: skip


class Gemma4DecoderLayer(Gemma3DecoderLayer):
    supports_fused_decode: ClassVar[bool] = False

    def __init__(
        self,
        config: DecoderConfig,  # this layer's own (`layer_config`)
        dtype: torch.dtype,
        device,
        batch_invariant: bool = False,
        is_sliding: bool = False,
        *,
        is_kv_shared: bool = False,
        takes_v_from_k: bool = False,
    ):
        super().__init__(config, dtype, device, batch_invariant, is_sliding)
        self.kind = SLIDING if is_sliding else FULL
        self.is_kv_shared = is_kv_shared
        self.takes_v_from_k = takes_v_from_k and not is_kv_shared
        self.rope_write_kv = None  # whole-head kernel: Gemma 4 rotates on the torch path
        p = {"dtype": dtype, "device": device}
        q_rows, kv_rows = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        num_kv_projections = 0 if is_kv_shared else 1 if self.takes_v_from_k else 2
        # Rows: q heads, then k heads, then v heads (those it has).
        rows = q_rows + num_kv_projections * kv_rows
        self.qkv_proj = Linear(config.hidden_size, rows, False, **p, row_tile=self.row_tile)
        if is_kv_shared:
            self.k_norm = None
        self.layer_scalar = uninitialised_weight(1, **p)
        self.per_layer_size = config.per_layer_input_size
        if self.per_layer_size:
            hidden, size = config.hidden_size, self.per_layer_size
            self.per_layer_input_gate = Linear(hidden, size, False, **p, row_tile=self.row_tile)
            self.per_layer_projection = Linear(size, hidden, False, **p, row_tile=self.row_tile)
            self.post_per_layer_input_norm = uninitialised_weight(hidden, **p)
        self.v_ones = torch.ones(self.head_dim, **p)  # v's norm has no weight

    def finish_loading(self) -> None:
        def norm(weight: Tensor) -> RMSNorm:
            return RMSNorm(weight, self.eps, self.batch_invariant)

        self.attention_norm = norm(self.input_layernorm)
        self.attention_out_norm = norm(self.post_attention_layernorm)
        self.mlp_norm = norm(self.pre_feedforward_layernorm)
        self.mlp_out_norm = norm(self.post_feedforward_layernorm)
        assert self.q_norm is not None, "Gemma 4 norms every q head (qk_norm)"
        self.q_head_norm = norm(self.q_norm)
        self.k_head_norm = None if self.k_norm is None else norm(self.k_norm)
        self.v_head_norm = norm(self.v_ones)
        if self.per_layer_size:
            self.per_layer_norm = norm(self.post_per_layer_input_norm)

    def forward(
        self,
        hidden: Tensor,  # [T, hidden], updated in place (the residual stream)
        rope: RopeAngles | Float32Angles,
        kv_cache: Tensor,
        attn: AttentionMetadata,
        per_layer_input: Tensor | None = None,  # [T, per_layer_input_size], or None
        shared: SharedKV | None = None,  # the step's K/V by kind, for the shared layers
    ) -> Tensor:
        assert isinstance(rope, RopeAngles), "Gemma 4 rotates on the torch path"
        assert shared is not None, "Gemma 4's model hands every layer the step's SharedKV"
        attended = self._attend(self.attention_norm(hidden), rope, kv_cache, attn, shared)
        hidden += self.attention_out_norm(attended)
        hidden += self.mlp_out_norm(self._mlp(self.mlp_norm(hidden)))
        if per_layer_input is not None:
            both = torch.cat((hidden, per_layer_input), dim=1)  # [T, hidden + P]
            if self.row_tile is not None:  # the gelu on fixed tiles too (_mlp's reason)
                gated = in_row_tiles(self._gate_per_layer_input, both, self.row_tile)
            else:
                gated = self._gate_per_layer_input(both)
            hidden += self.per_layer_norm(gated)
        return hidden.mul_(self.layer_scalar)

    def _gate_per_layer_input(self, both: Tensor) -> Tensor:  # [T, hidden + P] -> [T, hidden]
        hidden, own = both.split([both.shape[1] - self.per_layer_size, self.per_layer_size], 1)
        gate = F.gelu(self.per_layer_input_gate(hidden), approximate="tanh")  # [T, P]
        return self.per_layer_projection(gate * own)

    def _attend(
        self, x: Tensor, rope: RopeAngles, kv_cache: Tensor, attn: AttentionMetadata,
        shared: SharedKV,
    ) -> Tensor:  # fmt: skip
        num_tokens, heads, size = x.shape[0], self.num_heads, self.head_dim
        qkv = self.qkv_proj(x)  # [T, (Hq + Hkv projections) * D]
        q = self._head_norm(self.q_head_norm, qkv[:, : heads * size], heads)
        q = rope.rotate(q)  # [T, Hq, D]
        if self.is_kv_shared:
            k, v = shared[self.kind]
        else:
            kv = qkv[:, heads * size :].view(num_tokens, -1, size)  # [T, Hkv (+ Hkv), D]
            raw_k = kv[:, : self.num_kv_heads]
            raw_v = raw_k if self.takes_v_from_k else kv[:, self.num_kv_heads :]
            assert self.k_head_norm is not None, "an unshared layer has its k norm"
            k = rope.rotate(self._head_norm(self.k_head_norm, raw_k, self.num_kv_heads))
            v = self._head_norm(self.v_head_norm, raw_v, self.num_kv_heads)
            shared[self.kind] = (k, v)  # the last unshared layer of a kind writes last
        out = self.attend(q, k, v, kv_cache, attn, self.scale)  # [T, Hq, D]
        return self.o_proj(out.reshape(num_tokens, -1))

    def _head_norm(self, norm: RMSNorm, heads: Tensor, num_heads: int) -> Tensor:
        # [T, H * D] or [T, H, D] -> [T, H, D], each head normed over its D values
        rows = heads.reshape(-1, self.head_dim)
        return norm(rows).view(-1, num_heads, self.head_dim)


class Gemma4ForCausalLM(Gemma3ForCausalLM):
    layer_class: ClassVar[type[LlamaDecoderLayer]] = Gemma4DecoderLayer

    def __init__(self, config: DecoderConfig, dtype: torch.dtype, device, batch_invariant=False):
        super().__init__(config, dtype, device, batch_invariant)
        p = {"dtype": dtype, "device": device}
        self.per_layer_size = config.per_layer_input_size
        if self.per_layer_size:
            width = config.num_hidden_layers * self.per_layer_size
            self.embed_tokens_per_layer = uninitialised_weight(
                config.per_layer_vocab_size, width, **p
            )
            self.per_layer_model_projection = Linear(
                config.hidden_size, width, False, **p, row_tile=self.lm_head.row_tile
            )
            self.per_layer_projection_norm = uninitialised_weight(self.per_layer_size, **p)
            self.per_layer_embed_scale = torch.tensor(self.per_layer_size**0.5, **p)

    def _make_layer(self, index: int, dtype: torch.dtype, device) -> LlamaDecoderLayer:
        config = self.config
        is_sliding = bool(config.layer_types) and config.layer_types[index] == SLIDING
        return Gemma4DecoderLayer(
            layer_config(config, index), dtype, device, self.batch_invariant, is_sliding,
            is_kv_shared=config.kv_source_layer(index) != index,
            takes_v_from_k=config.full_attention_k_eq_v and not is_sliding,
        )  # fmt: skip

    def _register_rope_tables(self, dtype: torch.dtype, device) -> None:
        """As Gemma 3's, the global table over the full layers' own head size."""
        super()._register_rope_tables(dtype, device)
        size = self.config.full_head_dim or self.config.head_dim
        full = dataclasses.replace(self.config, head_dim=size, rotary_dim=size)
        cos, sin = rope_cos_sin(full, dtype, device)
        self.register_buffer("rope_cos", cos, persistent=False)  # [max_pos, full head // 2]
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(
        self,
        input_ids: Tensor,  # [num_tokens] int64, flat over the batch
        positions: Tensor,  # [num_tokens] int64
        kv_caches: list[Tensor],  # per layer; a KV-shared layer's is its source's
        attn: AttentionMetadata,
    ) -> Tensor:  # [num_tokens, hidden], after the final norm
        assert self.embed_scale is not None, "Gemma scales its embedding"
        hidden = F.embedding(input_ids, self.embed_tokens).mul_(self.embed_scale)  # [T, hidden]
        per_layer = self._per_layer_inputs(input_ids, hidden)  # [T, L, P] or None
        shared: SharedKV = {}
        layer_angles = self._layer_angles(positions)
        for index, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            own = None if per_layer is None else per_layer[:, index]  # [T, P]
            hidden = layer(hidden, layer_angles[index], kv_cache, attn, own, shared)
        return self.final_norm(hidden)

    def _per_layer_inputs(self, input_ids: Tensor, embedded: Tensor) -> Tensor | None:
        """PLE: (norm(projection of the embedding) + the token's own rows) / sqrt(2)."""
        if not self.per_layer_size:
            return None
        num_tokens, num_layers = input_ids.shape[0], self.config.num_hidden_layers
        own = F.embedding(input_ids, self.embed_tokens_per_layer).mul_(self.per_layer_embed_scale)
        projected = self.per_layer_model_projection(embedded) * self.config.hidden_size**-0.5
        normed = self.per_layer_input_norm(projected.view(-1, self.per_layer_size))
        mixed = normed.view(num_tokens, num_layers, -1) + own.view(num_tokens, num_layers, -1)
        return mixed * 2.0**-0.5  # [T, L, P]

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, Tensor | BlockCodes]]) -> None:
        super().load_weights(weights)
        if self.per_layer_size:
            norm = RMSNorm(self.per_layer_projection_norm, self.config.rms_norm_eps,
                           self.batch_invariant)  # fmt: skip
            self.per_layer_input_norm = norm

    def _weight_targets(self) -> dict[str, WeightTarget]:
        targets = {
            "model.embed_tokens.weight": WeightTarget(self.embed_tokens),
            "model.norm.weight": WeightTarget(self.norm),
        }
        if not self.config.tie_word_embeddings:
            targets["lm_head.weight"] = WeightTarget(self.lm_head.weight)
        if self.per_layer_size:
            targets["model.embed_tokens_per_layer.weight"] = WeightTarget(
                self.embed_tokens_per_layer
            )
            targets["model.per_layer_model_projection.weight"] = WeightTarget(
                self.per_layer_model_projection.weight
            )
            targets["model.per_layer_projection_norm.weight"] = WeightTarget(
                self.per_layer_projection_norm
            )
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, Gemma4DecoderLayer)
            targets.update(_layer_targets(f"model.layers.{i}.", layer))
        return targets


class Gemma4ConditionalTextModel(Gemma4ForCausalLM):
    """The text decoder of a multimodal `Gemma4ForConditionalGeneration`
    checkpoint: its weights under `model.language_model.`, its vision and
    audio towers and their embedders skipped (text in, text out)."""

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, Tensor | BlockCodes]]) -> None:
        super().load_weights(
            (_TEXT_NAMES.sub("model.", name), tensor)
            for name, tensor in weights
            if not name.startswith(_OTHER_MODALITIES)
        )


# How the multimodal checkpoint names the text decoder's tensors, and the rest.
_TEXT_NAMES = re.compile(r"^model\.language_model\.")
_OTHER_MODALITIES = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.",
                     "model.embed_audio.")  # fmt: skip


def _layer_targets(prefix: str, layer: Gemma4DecoderLayer) -> dict[str, WeightTarget]:
    q_rows, kv_rows = layer.num_heads * layer.head_dim, layer.num_kv_heads * layer.head_dim
    width = layer.down_proj.weight.shape[1]
    assert layer.q_norm is not None, "Gemma 4 norms every q head (qk_norm)"
    targets = {
        "self_attn.q_proj.weight": WeightTarget(layer.qkv_proj.weight, 0, q_rows),
        "self_attn.q_norm.weight": WeightTarget(layer.q_norm),
        "self_attn.o_proj.weight": WeightTarget(layer.o_proj.weight),
        "mlp.gate_proj.weight": WeightTarget(layer.gate_up_proj.weight, 0, width),
        "mlp.up_proj.weight": WeightTarget(layer.gate_up_proj.weight, width, 2 * width),
        "mlp.down_proj.weight": WeightTarget(layer.down_proj.weight),
        "layer_scalar": WeightTarget(layer.layer_scalar),
    }
    for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"):  # fmt: skip
        targets[f"{name}.weight"] = WeightTarget(getattr(layer, name))
    if not layer.is_kv_shared:
        targets["self_attn.k_proj.weight"] = WeightTarget(
            layer.qkv_proj.weight, q_rows, q_rows + kv_rows
        )
        assert layer.k_norm is not None, "an unshared layer norms its k heads"
        targets["self_attn.k_norm.weight"] = WeightTarget(layer.k_norm)
        if not layer.takes_v_from_k:
            targets["self_attn.v_proj.weight"] = WeightTarget(
                layer.qkv_proj.weight, q_rows + kv_rows, q_rows + 2 * kv_rows
            )
    if layer.per_layer_size:
        targets["per_layer_input_gate.weight"] = WeightTarget(layer.per_layer_input_gate.weight)
        targets["per_layer_projection.weight"] = WeightTarget(layer.per_layer_projection.weight)
        targets["post_per_layer_input_norm.weight"] = WeightTarget(layer.post_per_layer_input_norm)
    return {prefix + name: target for name, target in targets.items()}
