"""Gemma 3 (text) and Gemma 2: Llama's decoder with Gemma's norms and embedding
(sluice/models/gemma3.py runs both).

What the parser sets: (1 + weight) norms (`norm_offset`), the embedding times
sqrt(hidden) (`embedding_scale`), GeGLU, `query_pre_attn_scalar`, sliding
layers between global ones (`layer_types`, or one in `sliding_window_pattern`)
with their own RoPE base (Gemma 2: the global one), q/k norms (Gemma 3), and
the soft caps: of logits (both), of attention scores (Gemma 2 only).
"""

from __future__ import annotations

from typing import Any

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import FULL, SLIDING, DecoderConfig
from sluice.models.families.family import QK_NORM_NAMES, Family, GgufFamily, GgufMeta
from sluice.models.families.hf_fields import common_fields
from sluice.models.gemma3 import Gemma3ForCausalLM

GEMMA3, GEMMA2 = "Gemma3ForCausalLM", "Gemma2ForCausalLM"
# Gemma 3's defaults: the local layers' RoPE base, one global layer in six.
_GEMMA3_LOCAL_ROPE_THETA = 10000.0
_GEMMA3_SLIDING_PATTERN = 6
# The layer counts of the 27B models, whose query scalar is hidden / heads
# (llama.cpp fixes it in code rather than metadata).
_GEMMA3_27B_LAYERS = 62
_GEMMA2_27B_LAYERS = 46


def parse_gemma3(d: dict[str, Any]) -> DecoderConfig:
    fields = _gemma_fields(d, GEMMA3, _GEMMA3_SLIDING_PATTERN, caps_attention=False)
    return DecoderConfig(**fields, qk_norm=True)


def parse_gemma2(d: dict[str, Any]) -> DecoderConfig:
    fields = _gemma_fields(d, GEMMA2, 2, caps_attention=True)
    attn_cap = d.get("attn_logit_softcapping")
    return DecoderConfig(
        **fields | {"rope_local_theta": fields["rope_theta"]},
        attn_logit_softcapping=None if attn_cap is None else float(attn_cap),
    )


def _gemma_fields(
    d: dict[str, Any], architecture: str, pattern: int, caps_attention: bool
) -> dict[str, Any]:
    """What both Gemmas read: Gemma's defaults, the window, the layers' kinds,
    the local RoPE base and the logits' cap."""
    act = d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise ModelLoadError(f"unsupported Gemma activation {act!r}; only 'gelu_pytorch_tanh'")
    if d.get("attn_logit_softcapping") is not None and not caps_attention:
        raise ModelLoadError("unsupported attn_logit_softcapping: attention scores are not capped")
    if d.get("use_bidirectional_attention"):
        raise ModelLoadError("unsupported use_bidirectional_attention: generation is causal")
    d = {"tie_word_embeddings": True, "rms_norm_eps": 1e-6, **d}
    fields = common_fields(d, architecture)
    layer_types = _layer_types(d, fields["num_hidden_layers"], pattern)
    window = d.get("sliding_window")
    if SLIDING in layer_types and not window:
        raise ModelLoadError("Gemma 3 sliding-window layers need 'sliding_window'")
    local = (d.get("rope_parameters") or {}).get(SLIDING) or {}
    local_theta = local.get("rope_theta") or d.get("rope_local_base_freq")
    cap = d.get("final_logit_softcapping")
    return fields | {
        "sliding_window": int(window) if window else None,
        "hidden_act": act,
        "query_pre_attn_scalar": float(d.get("query_pre_attn_scalar") or fields["head_dim"]),
        "layer_types": layer_types,
        "rope_local_theta": float(local_theta or _GEMMA3_LOCAL_ROPE_THETA),
        "final_logit_softcapping": None if cap is None else float(cap),
        "norm_offset": 1.0,
        "embedding_scale": fields["hidden_size"] ** 0.5,
    }


def _layer_types(d: dict[str, Any], num_layers: int, pattern: int) -> tuple[str, ...]:
    types = d.get("layer_types")
    if types is None:
        pattern = int(d.get("sliding_window_pattern") or pattern)
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    if len(types) != num_layers or any(t not in (SLIDING, FULL) for t in types):
        raise ModelLoadError(
            f"layer_types must name {SLIDING!r} or {FULL!r} for each of {num_layers} layers"
        )
    return tuple(types)


def _gguf_gemma3_config(config: dict[str, Any], meta: GgufMeta) -> dict[str, Any]:
    """What llama.cpp's gemma3 fixes in code rather than metadata, as HF's config says it."""
    num_layers = config["num_hidden_layers"]
    window = meta("attention.sliding_window")
    scalar = config["head_dim"]
    if num_layers == _GEMMA3_27B_LAYERS:
        scalar = config["hidden_size"] // config["num_attention_heads"]
    layer_types = [
        SLIDING if (i + 1) % _GEMMA3_SLIDING_PATTERN else FULL for i in range(num_layers)
    ]
    local = {"rope_type": "default", "rope_theta": _GEMMA3_LOCAL_ROPE_THETA}
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_act": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": scalar,
        "sliding_window": window,
        "layer_types": layer_types if window else [FULL] * num_layers,
        "rope_local_base_freq": _GEMMA3_LOCAL_ROPE_THETA,
        "rope_parameters": {FULL: config["rope_parameters"], SLIDING: local},
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
    }


def _gguf_gemma2_config(config: dict[str, Any], meta: GgufMeta) -> dict[str, Any]:
    """Gemma 2 as llama.cpp runs it: Gemma 3's fixed choices with one sliding
    layer in two, one RoPE base, and the caps its metadata holds."""
    num_layers = config["num_hidden_layers"]
    gemma = _gguf_gemma3_config(config, meta)
    sliding = [i % 2 == 0 for i in range(num_layers)]  # layer 0 slides
    gemma["query_pre_attn_scalar"] = (
        config["hidden_size"] // config["num_attention_heads"]
        if num_layers == _GEMMA2_27B_LAYERS
        else config["head_dim"]
    )
    caps = {key: meta(key) for key in ("attn_logit_softcapping", "final_logit_softcapping")}
    layer_types = [
        SLIDING if is_sliding and gemma["sliding_window"] else FULL for is_sliding in sliding
    ]
    return gemma | caps | {
        "layer_types": layer_types,
        "rope_parameters": config["rope_parameters"],
        "rope_local_base_freq": config["rope_theta"],
    }  # fmt: skip


# llama.cpp's Gemma tensors: four norms a layer, each stored as 1 + weight.
_GEMMA_LAYER_NAMES = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
GEMMA3_FAMILY = Family(
    GEMMA3,
    "gemma3_text",
    parse_gemma3,
    Gemma3ForCausalLM,
    gguf=GgufFamily(
        "gemma3",
        permutes_qk=False,
        norm_shift=1.0,
        layer_names=QK_NORM_NAMES | _GEMMA_LAYER_NAMES,
        config_entries=_gguf_gemma3_config,
    ),
)
# Gemma 3's tensors without the q/k norms.
GEMMA2_FAMILY = Family(
    GEMMA2,
    "gemma2",
    parse_gemma2,
    Gemma3ForCausalLM,
    gguf=GgufFamily(
        "gemma2",
        permutes_qk=False,
        norm_shift=1.0,
        layer_names=_GEMMA_LAYER_NAMES,
        config_entries=_gguf_gemma2_config,
    ),
)
FAMILIES = (GEMMA3_FAMILY, GEMMA2_FAMILY)
