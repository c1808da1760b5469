"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B) and Qwen2-MoE (Qwen1.5-MoE-A2.7B,
Qwen2-57B-A14B): Qwen3's or Qwen2's attention with mixture-of-experts MLPs
(sluice/models/moe_decoder.py runs both).

What the parser reads beyond Qwen3's: the experts (`num_experts`, written
`num_local_experts` by transformers 5), how many a token takes
(`num_experts_per_tok`), their width (`moe_intermediate_size`), whether the
k weights are scaled to sum to one (`norm_topk_prob`), and which layers keep
a dense MLP of `intermediate_size` (`mlp_only_layers`, and every layer but
each `decoder_sparse_step`-th). Routing is softmax over all experts, then
top-k. Qwen2-MoE adds a shared expert (`shared_expert_intermediate_size`)
that every token runs, gated by a sigmoid, and biases q/k/v (`qkv_bias`).
"""

from __future__ import annotations

from typing import Any

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import DecoderConfig
from sluice.models.families.family import QK_NORM_NAMES, Family, GgufFamily, GgufMeta
from sluice.models.families.hf_fields import check_swiglu, common_fields, full_context_window
from sluice.models.moe import SOFTMAX_TOPK, check_experts
from sluice.models.moe_decoder import MoeForCausalLM

QWEN3_MOE, QWEN2_MOE = "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"


def parse_qwen3_moe(d: dict[str, Any]) -> DecoderConfig:
    check_swiglu(d)
    if d.get("shared_expert_intermediate_size"):
        raise ModelLoadError("unsupported shared experts in a Qwen3-MoE config")
    fields = common_fields(d, QWEN3_MOE)
    fields["sliding_window"] = full_context_window(d, fields["max_position_embeddings"])
    config = DecoderConfig(**fields, qk_norm=True, **expert_fields(d, fields["num_hidden_layers"]))
    check_experts(config)
    return config


def parse_qwen2_moe(d: dict[str, Any]) -> DecoderConfig:
    check_swiglu(d)
    fields = common_fields(d, QWEN2_MOE)
    fields["sliding_window"] = full_context_window(d, fields["max_position_embeddings"])
    fields["attention_bias"] = bool(d.get("qkv_bias", True))
    fields["o_proj_bias"] = False
    shared = d.get("shared_expert_intermediate_size")
    config = DecoderConfig(
        **fields,
        **expert_fields(d, fields["num_hidden_layers"]),
        shared_expert_intermediate_size=_int(shared, "shared_expert_intermediate_size", 0),
    )
    check_experts(config)
    return config


def expert_fields(d: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """The `DecoderConfig` expert fields of a softmax-then-top-k MoE config."""
    experts = d.get("num_experts", d.get("num_local_experts"))
    sparse_step = _int(d.get("decoder_sparse_step"), "decoder_sparse_step", 1)
    if sparse_step < 1:
        raise ModelLoadError(f"decoder_sparse_step must be positive, got {sparse_step}")
    dense = set(d.get("mlp_only_layers") or ())
    dense |= {i for i in range(num_layers) if (i + 1) % sparse_step}
    return {
        "num_experts": _int(experts, "num_experts", 0),
        "num_experts_per_tok": _int(d.get("num_experts_per_tok"), "num_experts_per_tok", 0),
        "moe_intermediate_size": _int(d.get("moe_intermediate_size"), "moe_intermediate_size", 0),
        "router_scoring": SOFTMAX_TOPK,
        "norm_topk_prob": bool(d.get("norm_topk_prob", False)),
        "dense_mlp_layers": tuple(sorted(dense)),
    }


def _int(value: Any, key: str, default: int) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise ModelLoadError(f"config.json's {key!r} must be an integer, got {value!r}")
    return value


def _gguf_qwen3_moe_config(config: dict[str, Any], meta: GgufMeta) -> dict[str, Any]:
    """The experts as llama.cpp's qwen3moe metadata gives them (it normalises
    the k weights unless `expert_weights_norm` says otherwise)."""
    width = meta("expert_feed_forward_length")
    return {
        "num_experts": meta("expert_count"),
        "num_experts_per_tok": meta("expert_used_count"),
        "moe_intermediate_size": width,
        "intermediate_size": config["intermediate_size"] or width,
        "norm_topk_prob": bool(meta("expert_weights_norm", True)),
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


# llama.cpp's MoE tensors: the router, then each projection of every expert
# stacked into one [E, out, in] tensor (the loader splits them per expert).
MOE_LAYER_NAMES = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
QWEN3_MOE_FAMILY = Family(
    QWEN3_MOE,
    "qwen3_moe",
    parse_qwen3_moe,
    MoeForCausalLM,
    gguf=GgufFamily(
        "qwen3moe",
        permutes_qk=False,
        layer_names=QK_NORM_NAMES | MOE_LAYER_NAMES,
        config_entries=_gguf_qwen3_moe_config,
    ),
)
# From HF folders only: no qwen2moe GGUF is read yet.
QWEN2_MOE_FAMILY = Family(QWEN2_MOE, "qwen2_moe", parse_qwen2_moe, MoeForCausalLM)
FAMILIES = (QWEN3_MOE_FAMILY, QWEN2_MOE_FAMILY)
