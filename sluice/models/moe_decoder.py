"""Our decoder with mixture-of-experts MLPs: `MoeForCausalLM` (Qwen3-MoE, Qwen2-MoE).

Attention, norms and RoPE are llama.py's; a layer whose MLP is a mixture of
experts (`DecoderConfig.is_moe_layer`) runs `moe.MoeBlock` in its place, and
the others (Qwen3-MoE's `mlp_only_layers`) keep the dense MLP. The
checkpoint's tensors, as Hugging Face stores them:

    model.layers.N.mlp.gate.weight                      [E, H]  the router
    model.layers.N.mlp.experts.M.gate_proj.weight       [I, H]  rows 0..I of gate_up[M]
    model.layers.N.mlp.experts.M.up_proj.weight         [I, H]  rows I..2I of gate_up[M]
    model.layers.N.mlp.experts.M.down_proj.weight       [H, I]  down[M]
    model.layers.N.mlp.shared_expert.*_proj.weight              Qwen2-MoE's shared expert
    model.layers.N.mlp.shared_expert_gate.weight        [1, H]  its gate

(a GGUF's stacked `ffn_*_exps` tensors are split into these by the loader).
An MoE layer's steps of decode rows take its Python path, not the fused
native call (fused_decode.py).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from sluice.models.decoder_config import DecoderConfig
from sluice.models.linear import Linear
from sluice.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from sluice.models.moe import MoeBlock
from sluice.models.moe_blocks import BLOCKS, EXPERT_NAME, BlockExperts, adopt_expert_blocks
from sluice.models.native.qblock import QBlockMatrix
from sluice.models.weight_targets import WeightTarget


class MoeDecoderLayer(LlamaDecoderLayer):
    # Its MLP is the experts, which the fused decode chain does not run.
    supports_fused_decode: ClassVar[bool] = False

    def _build_mlp(self, config: DecoderConfig, p: dict) -> None:
        self.moe = MoeBlock(config, p["dtype"], p["device"])

    def matrices(self) -> tuple[Linear, ...]:
        return (self.qkv_proj, self.o_proj)  # the experts are the MoE block's (moe.py)

    def _mlp(self, x: Tensor) -> Tensor:  # [T, hidden]; row tiles inside (moe.py)
        return self.moe(x, self.swiglu)

    def expert_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """This layer's router and expert tensors, by HF name under `prefix`."""
        moe = self.moe
        width = moe.down.shape[2]  # [E, H, I]: the stacks, before any are dropped
        targets = {f"{prefix}mlp.gate.weight": WeightTarget(moe.router)}
        for expert in range(moe.gate_up.shape[0]):
            name = f"{prefix}mlp.experts.{expert}."
            gate_up = moe.gate_up[expert]  # [2 I, H], a view: copies land in the stack
            targets[name + "gate_proj.weight"] = WeightTarget(gate_up, 0, width)
            targets[name + "up_proj.weight"] = WeightTarget(gate_up, width, 2 * width)
            targets[name + "down_proj.weight"] = WeightTarget(moe.down[expert])
        if (shared := moe.shared) is not None:  # Qwen2-MoE's shared expert and its gate
            name, rows = f"{prefix}mlp.shared_expert.", shared.down.shape[1]
            targets[name + "gate_proj.weight"] = WeightTarget(shared.gate_up, 0, rows)
            targets[name + "up_proj.weight"] = WeightTarget(shared.gate_up, rows, 2 * rows)
            targets[name + "down_proj.weight"] = WeightTarget(shared.down)
            targets[f"{prefix}mlp.shared_expert_gate.weight"] = WeightTarget(shared.gate)
        return targets


class MoeForCausalLM(LlamaForCausalLM):
    layer_class: ClassVar[type[LlamaDecoderLayer]] = MoeDecoderLayer

    def _adopt_block_codes(self, arrived: list[tuple[str, WeightTarget, QBlockMatrix]]) -> None:
        """Experts that came as GGUF blocks stay in them (moe_blocks.py)."""
        is_expert = [EXPERT_NAME.fullmatch(name) is not None for name, _, _ in arrived]
        adopt_expert_blocks(self.layers, [e for e, x in zip(arrived, is_expert, strict=True) if x])
        super()._adopt_block_codes([e for e, x in zip(arrived, is_expert, strict=True) if not x])

    def _make_layer(self, index: int, dtype: torch.dtype, device) -> LlamaDecoderLayer:
        if self.config.is_moe_layer(index):
            return super()._make_layer(index, dtype, device)
        return LlamaDecoderLayer(self.config, dtype, device, self.batch_invariant)

    def _weight_targets(self) -> dict[str, WeightTarget]:
        targets = super()._weight_targets()
        for i, layer in enumerate(self.layers):
            if isinstance(layer, MoeDecoderLayer):
                targets.update(layer.expert_targets(f"model.layers.{i}."))
        return targets

    def expert_bytes(self) -> int:
        """Bytes the experts' weights hold."""
        return sum(layer.moe.expert_bytes() for layer in self.layers
                   if isinstance(layer, MoeDecoderLayer))  # fmt: skip

    def expert_format(self) -> str:
        """How the experts are held, each way once in layer order, every layer's
        GGUF block types in one list: 'GGUF blocks (Q4_K, Q6_K) and float32'."""
        ways: dict[str, None] = {}
        block_types: set[str] = set()
        for layer in self.layers:
            if isinstance(layer, MoeDecoderLayer):
                kept = layer.moe.kept
                if isinstance(kept, BlockExperts):
                    block_types.update(kept.formats)
                ways[BLOCKS if isinstance(kept, BlockExperts) else layer.moe.expert_format()] = None
        blocks = f"{BLOCKS} ({', '.join(sorted(block_types))})"
        return " and ".join(blocks if way == BLOCKS else way for way in ways)


def parameter_counts(config: DecoderConfig) -> tuple[int, int]:
    """(total, active per token) parameters of a decoder: the active count
    holds k experts of each MoE layer, the total all of them."""
    hidden, head_dim = config.hidden_size, config.head_dim
    attention = (
        hidden * head_dim * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    )
    norms = 2 * hidden + (2 * head_dim if config.qk_norm else 0)
    if config.attention_bias:  # q, k and v
        attention += head_dim * (config.num_attention_heads + 2 * config.num_key_value_heads)
    if config.o_proj_bias:
        attention += hidden
    embedding = config.vocab_size * hidden * (1 if config.tie_word_embeddings else 2)
    total = active = embedding + hidden
    for index in range(config.num_hidden_layers):
        total += attention + norms
        active += attention + norms
        if not config.is_moe_layer(index):
            total += 3 * hidden * config.intermediate_size
            active += 3 * hidden * config.intermediate_size
            continue
        expert = 3 * hidden * config.moe_intermediate_size
        every_token = config.num_experts * hidden  # the router, and a shared expert's MLP
        if shared := config.shared_expert_intermediate_size:
            every_token += 3 * hidden * shared + hidden
        total += every_token + config.num_experts * expert
        active += every_token + config.num_experts_per_tok * expert
    return total, active


def describe_experts(model: LlamaForCausalLM) -> str | None:
    """The startup line's note on a mixture of experts; None for a dense model."""
    config = model.config
    if not isinstance(model, MoeForCausalLM):
        return None
    total, active = parameter_counts(config)
    num_bytes = model.expert_bytes()
    size = f"{num_bytes / 2**30:.2f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.1f} MiB"
    return (
        f"mixture of experts: {config.num_experts} experts, {config.num_experts_per_tok} per "
        f"token; {_count(total)} parameters, {_count(active)} active; expert weights {size} "
        f"in {model.expert_format()}"
    )


def _count(number: int) -> str:
    """30.53B, 3.35B, 226.85K: parameters as model cards write them."""
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if number >= size:
            return f"{number / size:.2f}{unit}"
    return str(number)
