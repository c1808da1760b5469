"""Where a checkpoint tensor goes in a model: `WeightTarget`.

A model maps every HF tensor name it expects to one target (a parameter,
or rows of a fused one) and copies each tensor in through it, so a missing,
unexpected or misshapen tensor is one `ModelLoadError`. Every family's model
class builds its map from these (llama.py, gemma3.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from sluice.errors import ModelLoadError


@dataclass(slots=True)
class WeightTarget:
    param: Tensor
    # Rows [row_start, row_end) of `param` hold this tensor; None means all of it.
    row_start: int | None = None
    row_end: int | None = None
    # Added to the values as they are copied in, in float32: Gemma's norms
    # multiply by (1 + weight), which the plain RMSNorm then runs.
    offset: float = 0.0

    def copy_from(self, name: str, tensor: Tensor) -> None:
        dest = self.param if self.row_start is None else self.param[self.row_start : self.row_end]
        if dest.shape != tensor.shape:
            raise ModelLoadError(
                f"tensor {name} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}"
            )
        dest.copy_(tensor.float() + self.offset if self.offset else tensor)


def decoder_layer_targets(prefix: str, layer: nn.Module, is_fused: bool) -> dict[str, WeightTarget]:
    """One decoder layer's HF tensor names -> rows of its fused matrices (q/k/v,
    gate/up), its norms and biases; `is_fused`: the checkpoint holds the fused
    matrices whole (Phi-3)."""
    q_rows = layer.num_heads * layer.head_dim
    kv_rows = layer.num_kv_heads * layer.head_dim
    qkv_slices = {"q": (0, q_rows), "k": (q_rows, q_rows + kv_rows)}
    qkv_slices["v"] = (q_rows + kv_rows, q_rows + 2 * kv_rows)
    targets = {
        prefix + "input_layernorm.weight": WeightTarget(layer.input_layernorm),
        prefix + "post_attention_layernorm.weight": WeightTarget(layer.post_attention_layernorm),
        prefix + "self_attn.o_proj.weight": WeightTarget(layer.o_proj.weight),
    }
    if hasattr(layer, "gate_up_proj"):  # an MoE layer's MLP is its experts (moe_decoder.py)
        intermediate = layer.down_proj.weight.shape[1]
        gate_up = layer.gate_up_proj.weight
        targets[prefix + "mlp.gate_proj.weight"] = WeightTarget(gate_up, 0, intermediate)
        targets[prefix + "mlp.up_proj.weight"] = WeightTarget(
            gate_up, intermediate, 2 * intermediate
        )
        targets[prefix + "mlp.down_proj.weight"] = WeightTarget(layer.down_proj.weight)
    for proj, (start, end) in qkv_slices.items():
        qkv = layer.qkv_proj
        targets[f"{prefix}self_attn.{proj}_proj.weight"] = WeightTarget(qkv.weight, start, end)
        if qkv.bias is not None:
            targets[f"{prefix}self_attn.{proj}_proj.bias"] = WeightTarget(qkv.bias, start, end)
    if layer.o_proj.bias is not None:
        targets[prefix + "self_attn.o_proj.bias"] = WeightTarget(layer.o_proj.bias)
    if is_fused:  # Phi-3 stores the fused matrices whole, in our row order
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                     "mlp.gate_proj", "mlp.up_proj"):  # fmt: skip
            targets.pop(f"{prefix}{name}.weight")
        targets[prefix + "self_attn.qkv_proj.weight"] = WeightTarget(layer.qkv_proj.weight)
        targets[prefix + "mlp.gate_up_proj.weight"] = WeightTarget(layer.gate_up_proj.weight)
    if layer.q_norm is not None:
        targets[prefix + "self_attn.q_norm.weight"] = WeightTarget(layer.q_norm)
        targets[prefix + "self_attn.k_norm.weight"] = WeightTarget(layer.k_norm)
    return targets


def with_norm_offset(targets: dict[str, WeightTarget], offset: float) -> dict[str, WeightTarget]:
    """Every norm weight loads plus `offset` (Gemma's 1 + weight; 0 elsewhere)."""
    if offset:
        for name, target in targets.items():
            if name.endswith("norm.weight"):
                target.offset = offset
    return targets


def few_names(names: list[str], limit: int = 5) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"
