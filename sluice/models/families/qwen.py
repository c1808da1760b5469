"""Qwen2/2.5 and Qwen3 (dense): Llama's decoder with Qwen's biases and norms.

Qwen2 biases q/k/v always and o_proj never, and declares a window it turns
off (`use_sliding_window: false`); Qwen3 has no bias and a per-head RMSNorm
of q and k before RoPE (`DecoderConfig.qk_norm`)."""

from __future__ import annotations

from typing import Any

from sluice.models.decoder_config import DecoderConfig
from sluice.models.families.family import QK_NORM_NAMES, Family, GgufFamily
from sluice.models.families.hf_fields import check_swiglu, common_fields, full_context_window
from sluice.models.llama import LlamaForCausalLM


def parse_qwen2(d: dict[str, Any]) -> DecoderConfig:
    fields = _fields(d, "Qwen2ForCausalLM")
    return DecoderConfig(**fields | {"attention_bias": True, "o_proj_bias": False})


def parse_qwen3(d: dict[str, Any]) -> DecoderConfig:
    return DecoderConfig(**_fields(d, "Qwen3ForCausalLM") | {"qk_norm": True})


def _fields(d: dict[str, Any], architecture: str) -> dict[str, Any]:
    check_swiglu(d)
    fields = common_fields(d, architecture)
    fields["sliding_window"] = full_context_window(d, fields["max_position_embeddings"])
    return fields


QWEN2 = Family(
    "Qwen2ForCausalLM",
    "qwen2",
    parse_qwen2,
    LlamaForCausalLM,
    gguf=GgufFamily("qwen2", permutes_qk=False),
)
QWEN3 = Family(
    "Qwen3ForCausalLM",
    "qwen3",
    parse_qwen3,
    LlamaForCausalLM,
    gguf=GgufFamily("qwen3", permutes_qk=False, layer_names=QK_NORM_NAMES),
)
FAMILIES = (QWEN2, QWEN3)
