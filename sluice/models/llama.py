"""Our decoder (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5, Qwen3, Phi-3) over a paged KV cache.

Gemma 2 and 3 are this decoder with their own layer (sluice/models/gemma3.py).
What differs between families is read from `DecoderConfig` (q/k norms, norm
offsets, the embedding's scale, soft caps, sliding layers and their RoPE
base), set by each family's parser (sluice/models/families/).

The model sees a flat batch: `input_ids` and `positions` are `[num_tokens]`
over every sequence of the step, and `AttentionMetadata` says which tokens
belong to which sequence and where their K/V live. There is no HF
`past_key_values`: the engine owns the cache tensors and passes them in.

Layout choices, made for single-stream CPU decode where every op's overhead
counts:
- q/k/v are one fused matrix and gate/up another (`load_weights` writes the HF
  tensors into row slices of them), so a layer runs four matmuls;
- on CPU, `load_weights` finally repacks every matrix into oneDNN's blocked
  layout (`Linear.prepack`): 1.3-1.7x faster bfloat16 matmuls at decode batch
  sizes. A tied lm_head then gets its own packed copy of the embedding;
- `quantize(mode)`, if asked, then gives every decoder matrix a weight-only
  int8 or int4 copy that serves steps of a few tokens: fewer bytes read per
  decode step (sluice/models/quantization.py);
- a layer's forward is plain functional code around its four matmuls
  (`sluice/models/linear.py`), its norms and its rotary embedding
  (`sluice/models/rope_norm.py`, with few-op paths for decode steps);
- `batch_invariant=True` selects, at construction, kernels whose result for
  a token never depends on the rest of its step: matmuls (and the MLP's
  activation) on fixed tiles of rows (`linear.in_row_tiles`), every token's
  attention as one decode-kernel row (`attention.batch_invariant_attention`),
  one RMSNorm and one rotary path for every step size. Greedy tokens and
  logprobs are then the same bits alone, in any batch, in any prefill
  chunking, after preemption, with or without a prefix-cache hit;
- Qwen3's per-head q/k RMSNorm runs on the fused q/k/v output before RoPE,
  in place, so the native RoPE + K/V write kernel still serves it;
- the RoPE cos/sin table covers `max_position_embeddings` and is computed once,
  in float32 like transformers, then stored in the model dtype; each forward
  indexes it once for all layers (`RopeAngles`).

Parameters are created uninitialised: a model is usable only after
`load_weights`, which refuses any missing or unexpected tensor.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sluice.errors import ModelLoadError
from sluice.models.attention import (
    AttentionMetadata,
    batch_invariant_attention,
    paged_attention,
)
from sluice.models.block_codes import BlockCodes
from sluice.models.decoder_config import SLIDING, DecoderConfig
from sluice.models.fused_decode import FusedDecode, runs_every_row_packed
from sluice.models.linear import (
    BATCH_INVARIANT_ROW_TILE,
    Linear,
    can_prepack,
    in_row_tiles,
    uninitialised_weight,
)
from sluice.models.native import decode_attention_kernel, silu_mul_kernel
from sluice.models.native.qblock import QBlockMatrix
from sluice.models.native.rope import rope_write_kv_kernel
from sluice.models.qblock_linear import adopt_block_codes, on_huge_pages
from sluice.models.quantization import check_quantization
from sluice.models.rope_norm import Float32Angles, RMSNorm, RopeAngles, rope_cos_sin
from sluice.models.sequence_state import SequenceStates
from sluice.models.sliding_window import sliding_window_attention
from sluice.models.weight_targets import (
    WeightTarget,
    decoder_layer_targets,
    few_names,
    with_norm_offset,
)


class LlamaDecoderLayer(nn.Module):
    # Its forward, for a step of decode rows, is native/decode_layer.c's chain
    # (fused_decode.py) when built for it (`decodes_as_native_chain`); a
    # subclass with another forward sets this False.
    supports_fused_decode: ClassVar[bool] = True

    def __init__(
        self,
        config: DecoderConfig,
        dtype: torch.dtype,
        device,
        batch_invariant: bool = False,
        is_sliding: bool = False,
    ):
        super().__init__()
        self.batch_invariant = batch_invariant
        self.row_tile = BATCH_INVARIANT_ROW_TILE if batch_invariant else None
        self.attend = batch_invariant_attention if batch_invariant else paged_attention
        # Attends within config.sliding_window (Gemma 3's local layers, Phi-3).
        self.is_sliding = is_sliding
        cap = config.attn_logit_softcapping
        # Whether `attend` is paged_attention: the backend the execution plan
        # binds to its kernels (plan_apply.py) and the fused chain runs.
        self.attends_paged = not batch_invariant and not is_sliding and cap is None
        if is_sliding or cap is not None:
            # Capped scores (Gemma 2) need the torch path on global layers too:
            # there the window is the whole context.
            window = config.sliding_window if is_sliding else config.max_position_embeddings
            self.attend = functools.partial(
                sliding_window_attention,
                window=window,
                is_batch_invariant=batch_invariant,
                softcap=cap,
            )
        hidden, head_dim = config.hidden_size, config.head_dim
        partial_rotary = config.has_partial_rotary
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim
        self.scale = config.attention_scale
        self.eps = config.rms_norm_eps
        qkv_rows = (self.num_heads + 2 * self.num_kv_heads) * head_dim
        p = {"dtype": dtype, "device": device}
        self.input_layernorm = uninitialised_weight(hidden, **p)
        p["row_tile"] = self.row_tile
        # Rows: q heads, then k heads, then v heads.
        self.qkv_proj = Linear(hidden, qkv_rows, config.attention_bias, **p)
        self.o_proj = Linear(self.num_heads * head_dim, hidden, config.o_proj_bias, **p)
        self.post_attention_layernorm = uninitialised_weight(hidden, dtype=dtype, device=device)
        # Per-head RMSNorm weights of q and k (Qwen3, Gemma 3), else None.
        self.q_norm = self.k_norm = None
        if config.qk_norm:
            self.q_norm = uninitialised_weight(head_dim, dtype=dtype, device=device)
            self.k_norm = uninitialised_weight(head_dim, dtype=dtype, device=device)
        self._build_mlp(config, p)
        # silu(gate) * up in one pass where the CPU kernel is there (same roundings).
        kernel = silu_mul_kernel(dtype) if torch.device(device).type == "cpu" else None
        self.swiglu = kernel or _swiglu
        self.has_native_swiglu = kernel is not None
        # RoPE of q and k and the K/V cache write in one native call (CPU,
        # bfloat16); batch-invariant mode keeps its own attention path. The
        # kernel rotates whole heads: partial rotary (Phi-4-mini) takes `rotate`.
        self.rope_write_kv = None
        if torch.device(device).type == "cpu" and not batch_invariant and not partial_rotary:
            self.rope_write_kv = rope_write_kv_kernel(dtype)
        # The whole layer in one native call for steps of decode rows, given
        # by the execution plan's apply where the layer is that chain
        # (`decodes_as_native_chain`, fused_decode.py).
        self.fused_decode: FusedDecode | None = None

    def _build_mlp(self, config: DecoderConfig, p: dict) -> None:
        """The gated MLP's matrices (an MoE layer builds its experts instead: moe_decoder.py)."""
        # Rows: gate, then up.
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, False, **p)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, False, **p)

    def decodes_as_native_chain(self) -> bool:
        """Whether this layer's Python path for a step of decode rows is
        native/decode_layer.c's chain, as built, loaded and quantized: its
        class's forward (`supports_fused_decode`), bfloat16 on the CPU, paged
        attention with the native decode kernel, native RoPE + K/V write, no
        q/k norm, native RMSNorm and SwiGLU, and every matrix one packed
        matmul at every row count."""
        if not self.supports_fused_decode:  # an MoE layer has no gate/up or down matrix
            return False
        weight = self.input_layernorm
        return (
            weight.dtype == torch.bfloat16
            and weight.device.type == "cpu"
            and self.attends_paged
            and self.rope_write_kv is not None
            and self.qk_norms is None
            and self.has_native_swiglu
            and self.attention_norm._kernel is not None
            and self.mlp_norm._kernel is not None
            and decode_attention_kernel(torch.bfloat16) is not None
            and all(runs_every_row_packed(linear) for linear in self.matrices())
        )

    def matrices(self) -> tuple[Linear, ...]:
        """The layer's matrices that `quantize` gives a weight-only copy."""
        return (self.qkv_proj, self.o_proj, self.gate_up_proj, self.down_proj)

    def finish_loading(self) -> None:
        """Bind the norms to their loaded weights (called once, by `load_weights`)."""
        self.attention_norm = RMSNorm(self.input_layernorm, self.eps, self.batch_invariant)
        self.mlp_norm = RMSNorm(self.post_attention_layernorm, self.eps, self.batch_invariant)
        self.qk_norms = None
        if self.q_norm is not None:
            q_norm = RMSNorm(self.q_norm, self.eps, self.batch_invariant)
            self.qk_norms = (q_norm, RMSNorm(self.k_norm, self.eps, self.batch_invariant))

    def forward(
        self,
        hidden: Tensor,  # [T, hidden], updated in place (the residual stream)
        rope: RopeAngles | Float32Angles,
        kv_cache: Tensor,
        attn: AttentionMetadata,
    ) -> Tensor:
        fused = self.fused_decode
        if fused is not None and fused.serves(hidden, rope, kv_cache, attn):
            fused(hidden, rope, kv_cache, attn)  # this same chain in one native call
            return hidden
        hidden += self._attention(self.attention_norm(hidden), rope, kv_cache, attn)
        hidden += self._mlp(self.mlp_norm(hidden))
        return hidden

    def _attention(
        self, x: Tensor, rope: RopeAngles | Float32Angles, kv_cache: Tensor, attn: AttentionMetadata
    ) -> Tensor:  # [T, hidden]
        num_tokens = x.shape[0]
        num_qk_heads = self.num_heads + self.num_kv_heads
        qkv = self.qkv_proj(x)  # [T, (Hq + 2 Hkv) * D]
        qkv = qkv.view(num_tokens, num_qk_heads + self.num_kv_heads, self.head_dim)
        if self.qk_norms is not None:
            self._norm_qk(qkv)
        v = qkv[:, num_qk_heads:]  # [T, Hkv, D]
        if isinstance(rope, Float32Angles):
            # Rotated q and k; k and v already in the cache at attn.slot_mapping.
            q, k = self.rope_write_kv(qkv, self.num_heads, rope.cos, rope.sin, kv_cache,
                                      attn.slot_mapping)  # fmt: skip
            out = self.attend(q, k, v, kv_cache, attn, self.scale, kv_written=True)
        else:
            qk = rope.rotate(qkv[:, :num_qk_heads])  # [T, Hq + Hkv, D]
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]  # [T, Hq, D], [T, Hkv, D]
            out = self.attend(q, k, v, kv_cache, attn, self.scale)  # [T, Hq, D]
        return self.o_proj(out.reshape(num_tokens, -1))

    def _norm_qk(self, qkv: Tensor) -> None:  # [T, Hq + 2 Hkv, D], q and k normed in place
        q_norm, k_norm = self.qk_norms
        for norm, start, end in ((q_norm, 0, self.num_heads),
                                 (k_norm, self.num_heads, self.num_heads + self.num_kv_heads)):  # fmt: skip
            heads = qkv[:, start:end]  # [T, H, D]
            heads.copy_(norm(heads.reshape(-1, self.head_dim)).view(heads.shape))

    def _mlp(self, x: Tensor) -> Tensor:  # [T, hidden]
        if self.row_tile is not None:
            # The activation on fixed tiles too: its vectorised and scalar loops
            # (exp) may round differently, and which elements take which depends
            # on the tensor's size.
            return in_row_tiles(self._mlp_rows, x, self.row_tile)
        return self._mlp_rows(x)

    def _mlp_rows(self, x: Tensor) -> Tensor:  # [T, hidden]
        return self.down_proj(
            self.swiglu(self.gate_up_proj(x))
        )  # [T, 2 I] -> [T, I] -> [T, hidden]


def _swiglu(gate_up: Tensor) -> Tensor:  # [T, 2 I] (gate, then up) -> [T, I]
    gate, up = gate_up.chunk(2, dim=-1)  # [T, I] each
    # In place on the gate half: SwiGLU needs no new [T, I] buffers.
    return F.silu(gate, inplace=True).mul_(up)


class LlamaForCausalLM(nn.Module):
    # The decoder layer every layer is (a family's own subclass where it differs).
    layer_class: ClassVar[type[LlamaDecoderLayer]] = LlamaDecoderLayer

    def __init__(
        self,
        config: DecoderConfig,
        dtype: torch.dtype,
        device: torch.device | str,
        batch_invariant: bool = False,
    ):
        super().__init__()
        self.config = config
        self.dtype = dtype
        # Kernels whose per-token result ignores the batch (module docstring).
        self.batch_invariant = batch_invariant
        p = {"dtype": dtype, "device": device}
        self.embed_tokens = uninitialised_weight(config.vocab_size, config.hidden_size, **p)
        self.layers = nn.ModuleList(
            self._make_layer(index, dtype, device) for index in range(config.num_hidden_layers)
        )
        self.norm = uninitialised_weight(config.hidden_size, **p)
        row_tile = BATCH_INVARIANT_ROW_TILE if batch_invariant else None
        self.lm_head = Linear(config.hidden_size, config.vocab_size, False, **p, row_tile=row_tile)
        if config.tie_word_embeddings:
            # Shared until prepacking, which gives lm_head its own packed copy.
            self.lm_head.weight = self.embed_tokens
        self.is_loaded = False
        # The embedding lookup of a table kept in GGUF blocks (qblock_linear.py), else None.
        self.token_embedding: nn.Module | None = None
        # The weight-only mode `quantize` applied ("int8", "int4"), or None.
        self.quantization: str | None = None
        # "int8" once calibration.quantize_activations gave the decoder W8A8.
        self.activation_quantization: str | None = None
        # The embedding's scale in the model dtype, as transformers rounds it (Gemma).
        self.embed_scale = None
        if config.embedding_scale is not None:
            self.embed_scale = torch.tensor(config.embedding_scale, dtype=dtype, device=device)
        # Where every layer has the native RoPE kernel, it reads float32
        # angles; the torch path reads them in the model's dtype.
        self.native_rope = all(layer.rope_write_kv is not None for layer in self.layers)
        self._register_rope_tables(torch.float32 if self.native_rope else dtype, device)

    def _register_rope_tables(self, dtype: torch.dtype, device) -> None:
        """cos/sin of every position; the sliding layers' own, unscaled, where
        their RoPE base differs (Gemma 3's local base; Gemma 2 sets the global one)."""
        cos, sin = rope_cos_sin(self.config, dtype, device)
        self.register_buffer("rope_cos", cos, persistent=False)  # [max_pos, rotary_dim // 2]
        self.register_buffer("rope_sin", sin, persistent=False)  # [max_pos, rotary_dim // 2]
        local_cos = local_sin = None
        if self.config.rope_local_theta is not None:
            local = dataclasses.replace(
                self.config, rope_theta=self.config.rope_local_theta, rope_scaling=None
            )
            local_cos, local_sin = rope_cos_sin(local, dtype, device)
        self.register_buffer("rope_local_cos", local_cos, persistent=False)  # same, or None
        self.register_buffer("rope_local_sin", local_sin, persistent=False)
        # NoPE layers (SmolLM3) rotate by angle 0: one row of cos 1, sin 0,
        # which leaves q and k bit for bit as they are on every RoPE path.
        half = (self.config.rotary_dim or self.config.head_dim) // 2
        identity = None
        if self.config.nope_layers:
            identity = torch.ones(1, half, dtype=dtype, device=device)
        # [1, R // 2] each, or None
        self.register_buffer("rope_identity_cos", identity, persistent=False)
        self.register_buffer(
            "rope_identity_sin", None if identity is None else torch.zeros_like(identity),
            persistent=False,
        )  # fmt: skip

    def forward(
        self,
        input_ids: Tensor,  # [num_tokens] int64, flat over the batch
        positions: Tensor,  # [num_tokens] int64
        kv_caches: list[Tensor],  # per layer [2, num_blocks, block_size, Hkv, head_dim]
        attn: AttentionMetadata,
    ) -> Tensor:  # [num_tokens, hidden], after the final norm
        if attn.sequence_states is None and self.config.has_sequence_state:
            # A hybrid run outside the engine's slots (calibration, scoring, tests):
            # sequence b in slot b, its state carried from step to step.
            attn.sequence_states = SequenceStates.standalone(len(attn.query_lens))
        if self.token_embedding is None:
            hidden = F.embedding(input_ids, self.embed_tokens)  # [T, hidden]
        else:
            hidden = self.token_embedding(input_ids)  # a table kept in its GGUF blocks
        if self.embed_scale is not None:
            hidden.mul_(self.embed_scale)
        layer_angles = self._layer_angles(positions)
        for layer, kv_cache, angles in zip(self.layers, kv_caches, layer_angles, strict=True):
            hidden = layer(hidden, angles, kv_cache, attn)
        return self.final_norm(hidden)

    def _layer_angles(self, positions: Tensor) -> list[RopeAngles | Float32Angles]:
        """Each layer's rotation of one step: the global tables, the sliding
        layers' own (Gemma's local base), or angle 0 (NoPE layers)."""
        rope = self._rope_at(self.rope_cos, self.rope_sin, positions)
        local_rope = no_rope = rope
        if self.rope_local_cos is not None:
            local_rope = self._rope_at(self.rope_local_cos, self.rope_local_sin, positions)
        if self.rope_identity_cos is not None:
            row = torch.zeros_like(positions)  # every token at angle 0
            no_rope = self._rope_at(self.rope_identity_cos, self.rope_identity_sin, row)
        nope = self.config.nope_layers
        return [
            no_rope if index in nope else local_rope if layer.is_sliding else rope
            for index, layer in enumerate(self.layers)
        ]

    def compute_logits(self, hidden: Tensor) -> Tensor:  # [n, hidden] -> [n, vocab] float32
        logits = self.lm_head(hidden).float()
        cap = self.config.final_logit_softcapping
        if cap is None:
            return logits
        return logits.div_(cap).tanh_().mul_(cap)  # cap * tanh(logits / cap) (Gemma)

    def weight_bytes(self) -> int:
        """Bytes the model's tensors hold (each storage once: a tied head counts
        once until prepacking gives it its own copy; quantized copies count)."""
        seen: set[int] = set()
        total = 0
        for module in self.modules():
            for tensor in (*module._parameters.values(), *module._buffers.values()):
                if tensor is None:
                    continue
                if tensor.is_mkldnn:  # oneDNN's packed layout: no storage to ask
                    total += tensor.numel() * tensor.element_size()
                elif (storage := tensor.untyped_storage()).data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    total += storage.nbytes()
        return total

    def _make_layer(self, index: int, dtype: torch.dtype, device) -> LlamaDecoderLayer:
        is_sliding = bool(self.config.layer_types) and self.config.layer_types[index] == SLIDING
        return self.layer_class(self.config, dtype, device, self.batch_invariant, is_sliding)

    def _rope_at(
        self, cos: Tensor, sin: Tensor, positions: Tensor
    ) -> RopeAngles | Float32Angles:  # one step's angles from [max_pos, D // 2] tables
        if self.native_rope:
            return Float32Angles.at(cos, sin, positions)
        return RopeAngles.at(cos, sin, positions, self.batch_invariant)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, Tensor | BlockCodes]]) -> None:
        """Copy HF-named tensors in (converting dtype); refuse missing or unexpected ones.

        Called once per model: on success the matrices may be prepacked, after
        which they no longer accept HF tensors.
        """
        if self.is_loaded:
            raise ModelLoadError("weights were already loaded into this model")
        targets = with_norm_offset(self._weight_targets(), self.config.norm_offset)
        loaded: set[str] = set()
        unexpected: list[str] = []
        # Matrices that stay in their GGUF blocks (loader/gguf_tensors.py).
        block_codes: list[tuple[str, WeightTarget, QBlockMatrix]] = []
        for name, tensor in weights:
            if name.endswith("rotary_emb.inv_freq"):
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # some tied checkpoints store the shared matrix twice
            target = targets.get(name)
            if target is None:
                unexpected.append(name)
                continue
            if isinstance(tensor, BlockCodes):
                # Onto huge pages as each arrives (the packing's copy freed at once).
                block_codes.append((name, target, on_huge_pages(QBlockMatrix.from_codes(tensor))))
            else:
                target.copy_from(name, tensor)
            loaded.add(name)
        missing = sorted(set(targets) - loaded)
        if missing or unexpected:
            raise ModelLoadError(
                f"checkpoint does not match {self.config.architecture}: "
                f"missing {few_names(missing)}; unexpected {few_names(unexpected)}"
            )
        self.is_loaded = True
        self._adopt_block_codes(block_codes)
        for layer in self.layers:
            layer.finish_loading()
        self.final_norm = RMSNorm(self.norm, self.config.rms_norm_eps, self.batch_invariant)
        if can_prepack(self.dtype, self.embed_tokens.device):
            for module in self.modules():
                if isinstance(module, Linear):
                    module.prepack()

    def _adopt_block_codes(self, arrived: list[tuple[str, WeightTarget, QBlockMatrix]]) -> None:
        """Swap in the modules that run the matrices that came as block codes."""
        if arrived:
            adopt_block_codes(self, arrived)

    @torch.no_grad()
    def quantize(self, mode: str) -> None:
        """Quantize every decoder matrix (`Linear.quantize`); called once, after
        `load_weights`.

        lm_head and the embedding keep the model dtype: an int8 head measured
        no faster than the bfloat16 oneDNN one (the int8 kernel is compute-bound
        at about 6 G weights/s here), and an int4 head, 2.4 ms faster per step,
        cut the embedded model's greedy agreement with float32 from 99% to 85%.
        """
        check_quantization(mode, self.embed_tokens.device)
        if not self.is_loaded:
            raise ModelLoadError("quantize needs the weights loaded first")
        if self.quantization is not None:
            raise ModelLoadError(f"this model is already quantized ({self.quantization})")
        for layer in self.layers:
            for linear in layer.matrices():
                linear.quantize(mode)
        self.quantization = mode

    def _weight_targets(self) -> dict[str, WeightTarget]:
        """HF tensor name -> where it goes (fused tensors take row slices)."""
        targets = {
            "model.embed_tokens.weight": WeightTarget(self.embed_tokens),
            "model.norm.weight": WeightTarget(self.norm),
        }
        if not self.config.tie_word_embeddings:
            targets["lm_head.weight"] = WeightTarget(self.lm_head.weight)
        for i, layer in enumerate(self.layers):
            targets.update(
                decoder_layer_targets(f"model.layers.{i}.", layer, self.config.fused_checkpoint)
            )
        return targets
