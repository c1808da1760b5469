"""Phi-3 (mini-4k, mini-128k, 3.5-mini) and Phi-4-mini: Llama's decoder with
q/k/v and gate/up stored whole, a window on every layer where it is shorter
than the context (Phi-3-mini-4k: 2047 of 4096, as transformers runs it),
LongRoPE, and RoPE on part of each head (Phi-4-mini)."""

from __future__ import annotations

from typing import Any

from sluice.models.decoder_config import SLIDING, DecoderConfig
from sluice.models.families.family import Family, GgufFamily, GgufMeta
from sluice.models.families.hf_fields import check_swiglu, common_fields
from sluice.models.llama import LlamaForCausalLM

ARCHITECTURE = "Phi3ForCausalLM"


def parse_phi3(d: dict[str, Any]) -> DecoderConfig:
    check_swiglu(d)
    fields = common_fields(d, ARCHITECTURE, allows_partial_rotary=True)
    window = d.get("sliding_window")
    if window is not None and int(window) < fields["max_position_embeddings"]:
        fields["sliding_window"] = int(window)
        fields["layer_types"] = (SLIDING,) * fields["num_hidden_layers"]
    return DecoderConfig(**fields, fused_checkpoint=True)


def _gguf_config(config: dict[str, Any], meta: GgufMeta) -> dict[str, Any]:
    return {"sliding_window": meta("attention.sliding_window")}


PHI3 = Family(
    ARCHITECTURE,
    "phi3",
    parse_phi3,
    LlamaForCausalLM,
    # llama.cpp keeps Phi-3's fused matrices: attn_qkv, and ffn_up as gate then up.
    gguf=GgufFamily(
        "phi3",
        permutes_qk=False,
        layer_names={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
        config_entries=_gguf_config,
    ),
    partial_rotary=True,
)
FAMILIES = (PHI3,)
