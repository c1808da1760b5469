"""gpt-oss (gpt-oss-20b, gpt-oss-120b) on our MoE decoder: `GptOssForCausalLM`.

What it adds to moe_decoder.py's layer, as transformers 5.24's
`models/gpt_oss` computes it:
- attention sinks: a learned logit per query head sits in the softmax's
  denominator beside the keys and attends to nothing (`self_attn.sinks`);
  every layer, sliding (`layer_types`, window `sliding_window`) or full,
  attends on sliding_window.py's torch path, which adds it: the native
  attention kernels have no sink;
- biases on q/k/v and o (`attention_bias`), on the router's logits and on
  every expert's two projections;
- routing: the k largest router logits, then a softmax over those k;
- the clamped SwiGLU: gate clamped to at most `limit`, up to [-limit, limit],
  out = (up + 1) * gate * sigmoid(alpha * gate) (mxfp4_experts.ClampedSwiglu:
  native where the library runs);
- YaRN RoPE (rope_norm.py), in the half-split layout like Llama.

The checkpoint stacks each layer's experts as transformers holds them:

    model.layers.N.mlp.router.weight / .bias            [E, H] / [E]
    model.layers.N.mlp.experts.gate_up_proj             [E, H, 2 I]  columns gate, up, gate, ...
    model.layers.N.mlp.experts.gate_up_proj_bias        [E, 2 I]     the same interleave
    model.layers.N.mlp.experts.down_proj                [E, I, H]
    model.layers.N.mlp.experts.down_proj_bias           [E, H]
    model.layers.N.self_attn.sinks                      [Hq]

`load_weights` turns these into moe.py's layout ([E, out, in], gate rows
then up rows) as they stream in. OpenAI's release stores the two expert
matrices in MXFP4 (`gate_up_proj_blocks` [E, 2 I, H / 32, 16] with
`gate_up_proj_scales` [E, 2 I, H / 32], the same for down_proj, [out, in]
order): they stay in 4 bits, run by the int8 x MXFP4 kernel
(mxfp4_experts.py, native/mxfp4_gemm.c), or are dequantized (mxfp4.py) into
the model dtype where the native library is not built.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from sluice.models.block_codes import BlockCodes
from sluice.models.decoder_config import DecoderConfig
from sluice.models.linear import uninitialised_weight
from sluice.models.llama import LlamaDecoderLayer
from sluice.models.moe import MoeBlock
from sluice.models.moe_decoder import MoeDecoderLayer, MoeForCausalLM
from sluice.models.mxfp4 import check_pair, dequantize_mxfp4
from sluice.models.mxfp4_experts import ClampedSwiglu, StackTarget, keep_mxfp4
from sluice.models.native.mxfp4 import mxfp4_available, mxfp4_groups
from sluice.models.sliding_window import sliding_window_attention
from sluice.models.weight_targets import WeightTarget


@dataclass(frozen=True, slots=True)
class GptOssConfig(DecoderConfig):
    """A gpt-oss decoder: `DecoderConfig` and its experts' clamped SwiGLU."""

    # out = (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit).
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0


class GptOssExperts(MoeBlock):
    """moe.py's block with gpt-oss's biases: the router's and each expert's."""

    def __init__(self, config: DecoderConfig, dtype: torch.dtype, device) -> None:
        super().__init__(config, dtype, device)
        experts, hidden = config.num_experts, config.hidden_size
        self.router_bias = uninitialised_weight(experts, dtype=torch.float32, device=device)
        width = config.moe_intermediate_size
        # [E, 2 I] (gate, then up, as gate_up's rows) and [E, H].
        self.gate_up_bias = uninitialised_weight(experts, 2 * width, dtype=dtype, device=device)
        self.down_bias = uninitialised_weight(experts, hidden, dtype=dtype, device=device)

    def _scores(self, x: Tensor) -> Tensor:  # [tile, H] -> [tile, E] float32 logits
        return F.linear(x.float(), self.router, self.router_bias)

    def _expert(self, expert: int, swiglu, x: Tensor) -> Tensor:  # [tile, H] -> [tile, H]
        gate_up = F.linear(x, self.gate_up[expert], self.gate_up_bias[expert])  # [tile, 2 I]
        return F.linear(swiglu(gate_up), self.down[expert], self.down_bias[expert])

    def expert_bytes(self) -> int:
        return super().expert_bytes() + self.gate_up_bias.nbytes + self.down_bias.nbytes


class GptOssDecoderLayer(MoeDecoderLayer):
    def __init__(
        self,
        config: DecoderConfig,
        dtype: torch.dtype,
        device,
        batch_invariant: bool = False,
        is_sliding: bool = False,
    ):
        super().__init__(config, dtype, device, batch_invariant, is_sliding)
        assert isinstance(config, GptOssConfig), "a gpt-oss layer needs a GptOssConfig"
        # One logit per query head beside the keys (float32: it joins float32 scores).
        self.sinks = uninitialised_weight(config.num_attention_heads, dtype=torch.float32,
                                          device=device)  # fmt: skip
        window = config.sliding_window if is_sliding else config.max_position_embeddings
        assert window is not None, "a sliding layer needs its window"
        self.attend = functools.partial(
            sliding_window_attention, window=window, is_batch_invariant=batch_invariant,
            sinks=self.sinks,
        )  # fmt: skip
        # Sinks run on the torch path: the execution plan's kernels never serve it (plan_apply.py).
        self.attends_paged = False
        self.clamped_swiglu = ClampedSwiglu(config.swiglu_alpha, config.swiglu_limit)
        # The expert stacks' load targets and their names' prefix (`expert_targets`).
        self.stacks = (StackTarget(self.moe.gate_up), StackTarget(self.moe.down), "mlp.experts.")

    def _build_mlp(self, config: DecoderConfig, p: dict) -> None:
        self.moe = GptOssExperts(config, p["dtype"], p["device"])

    def _mlp(self, x: Tensor) -> Tensor:  # [T, hidden]; row tiles inside (moe.py)
        return self.moe(x, self.clamped_swiglu)

    def expert_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """This layer's sinks, router and stacked experts, by HF name under
        `prefix` (the stacks as `load_weights` converts them)."""
        moe = self.moe
        assert isinstance(moe, GptOssExperts)
        mlp = prefix + "mlp."
        # The stacks' targets also take MXFP4 groups; `finish_experts` reads them.
        self.stacks = (StackTarget(moe.gate_up), StackTarget(moe.down), mlp + "experts.")
        return {
            prefix + "self_attn.sinks": WeightTarget(self.sinks),
            mlp + "router.weight": WeightTarget(moe.router),
            mlp + "router.bias": WeightTarget(moe.router_bias),
            mlp + "experts.gate_up_proj": self.stacks[0],
            mlp + "experts.gate_up_proj_bias": WeightTarget(moe.gate_up_bias),
            mlp + "experts.down_proj": self.stacks[1],
            mlp + "experts.down_proj_bias": WeightTarget(moe.down_bias),
        }


class GptOssForCausalLM(MoeForCausalLM):
    layer_class: ClassVar[type[LlamaDecoderLayer]] = GptOssDecoderLayer

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, Tensor | BlockCodes]]) -> None:
        super().load_weights(in_stacked_layout(weights, keep_mxfp4=mxfp4_available()))
        for layer in self.layers:
            assert isinstance(layer, GptOssDecoderLayer) and isinstance(layer.moe, GptOssExperts)
            gate_up, down, prefix = layer.stacks
            biases = (layer.moe.gate_up_bias, layer.moe.down_bias)
            keep_mxfp4(layer.moe, gate_up, down, biases, prefix)


def in_stacked_layout(
    weights: Iterable[tuple[str, Tensor | BlockCodes]], keep_mxfp4: bool = False
) -> Iterator[tuple[str, Tensor | BlockCodes]]:
    """transformers' expert stacks in moe.py's layout: [E, in, out] matrices
    transposed to [E, out, in], and the interleaved gate/up outputs (gate
    at even places, up at odd) split into gate rows, then up rows. MXFP4
    stacks (`*_blocks` with `*_scales`, already [E, out, in]) are joined
    into the kernel's groups ([E, out, in / 32, 17] uint8, `keep_mxfp4`) or
    dequantized, once both have arrived. A tensor of another rank passes as
    it is, for the load to name its shape."""
    halves: dict[str, Tensor] = {}  # an MXFP4 stack's blocks or scales, waiting for the other
    for name, tensor in weights:
        stem, _, part = name.rpartition("_")
        if isinstance(tensor, Tensor) and stem.endswith("_proj") and part in MXFP4_PARTS:
            other = halves.pop(f"{stem}_{MXFP4_PARTS[part]}", None)
            if other is None:
                halves[name] = tensor
                continue
            blocks, scales = (tensor, other) if part == "blocks" else (other, tensor)
            check_pair(stem, blocks, scales)
            kept = mxfp4_groups(blocks, scales) if keep_mxfp4 else None  # [E, out, G, 17]
            name, tensor = stem, dequantize_mxfp4(stem, blocks, scales) if kept is None else kept
            if stem.endswith("gate_up_proj"):
                tensor = _gate_rows_then_up(tensor)
        elif isinstance(tensor, Tensor):
            if name.endswith("mlp.experts.gate_up_proj") and tensor.dim() == 3:
                tensor = _gate_rows_then_up(tensor.transpose(1, 2))  # [E, 2 I, H]
            elif name.endswith("mlp.experts.gate_up_proj_bias") and tensor.dim() == 2:
                tensor = _gate_rows_then_up(tensor)  # [E, 2 I]
            elif name.endswith("mlp.experts.down_proj") and tensor.dim() == 3:
                tensor = tensor.transpose(1, 2)  # [E, H, I]
        yield name, tensor
    yield from halves.items()  # unpaired: the load names them unexpected


MXFP4_PARTS = {"blocks": "scales", "scales": "blocks"}  # each part and the one it pairs with


def _gate_rows_then_up(tensor: Tensor) -> Tensor:  # [E, 2 I, ...] interleaved -> split
    return torch.cat([tensor[:, 0::2], tensor[:, 1::2]], dim=1)
