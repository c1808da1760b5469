"""Gemma 4 text decoders (`Gemma4ForCausalLM`, model_type `gemma4_text`),
run by sluice/models/gemma4.py, as transformers 5.24's `Gemma4TextConfig`
reads config.json.

What the parser sets: sliding layers between full ones (`layer_types`, else
five sliding to one full, the last always full), the local RoPE base of the
sliding layers and the full layers' "proportional" RoPE with its
`partial_rotary_factor`; the full layers' own head size and KV heads (from
`per_layer_config`, as transformers saves it, else `global_head_dim`,
default 512, and `num_global_key_value_heads` where `attention_k_eq_v`);
KV sharing, per-layer embeddings, the double-wide MLP of shared layers,
plain-weight norms with a weightless v norm, unscaled scores, the
embedding times sqrt(hidden) and the logits' cap.

Refused with one line: the MoE variant (`enable_moe_block`), bidirectional
attention over text (`use_bidirectional_attention: "all"`), biases, another
activation, RoPE types other than these, per-layer overrides other than the
full layers' head size and KV heads, and shared layers of a kind no earlier
layer computes. No GGUF: llama.cpp's gemma4 layout is not read.

`Gemma4ForConditionalGeneration` (the multimodal checkpoints) runs as its
text decoder: `text_config` parsed as above, the vision and audio towers'
weights skipped; images and audio are not read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import FULL, SLIDING, DecoderConfig
from sluice.models.families.family import Family
from sluice.models.families.hf_fields import common_fields
from sluice.models.gemma4 import Gemma4ConditionalTextModel, Gemma4ForCausalLM
from sluice.models.rope_norm import PROPORTIONAL

ARCHITECTURE = "Gemma4ForCausalLM"
# The multimodal checkpoints Google publishes: text decoder only (gemma4.py).
CONDITIONAL = "Gemma4ForConditionalGeneration"
# Gemma4TextConfig's defaults where config.json says nothing.
_DEFAULTS: dict[str, Any] = {
    "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "head_dim": 256, "sliding_window": 512,
    "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262_144,
    "num_kv_shared_layers": 0, "max_position_embeddings": 131_072,
}  # fmt: skip
_DEFAULT_ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": PROPORTIONAL, "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
_SLIDING_PATTERN = 6
_GLOBAL_HEAD_DIM = 512


def parse_gemma4(d: dict[str, Any]) -> DecoderConfig:
    _refuse_what_it_cannot_run(d)
    d = _DEFAULTS | {key: value for key, value in d.items() if value is not None}
    plain = {k: v for k, v in d.items() if k not in ("rope_parameters", "rope_scaling")}
    fields = common_fields(plain | {"rope_theta": 1.0}, ARCHITECTURE)
    num_layers = fields["num_hidden_layers"]
    layer_types = _layer_types(d, num_layers)
    rope = _rope(d)
    full_head_dim, full_kv_heads = _full_layer_heads(d, layer_types)
    cap = d.get("final_logit_softcapping")
    config = DecoderConfig(
        **fields | {
            "sliding_window": int(d["sliding_window"]),
            "rope_theta": float(rope[FULL].get("rope_theta", _DEFAULT_ROPE[FULL]["rope_theta"])),
            "rope_scaling": _full_rope_scaling(rope[FULL]),
        },
        qk_norm=True, hidden_act="gelu_pytorch_tanh", query_pre_attn_scalar=1.0,
        layer_types=layer_types,
        rope_local_theta=float(rope[SLIDING].get("rope_theta", _DEFAULT_ROPE[SLIDING]["rope_theta"])),
        final_logit_softcapping=None if cap is None else float(cap),
        embedding_scale=fields["hidden_size"] ** 0.5,
        full_head_dim=full_head_dim, full_num_key_value_heads=full_kv_heads,
        num_kv_shared_layers=int(d["num_kv_shared_layers"]),
        full_attention_k_eq_v=bool(d.get("attention_k_eq_v", False)), v_norm=True,
        per_layer_input_size=int(d["hidden_size_per_layer_input"] or 0),
        per_layer_vocab_size=int(d["vocab_size_per_layer_input"]),
        double_wide_shared_mlp=bool(d.get("use_double_wide_mlp", False)),
    )  # fmt: skip
    _check_kv_sharing(config)
    return config


def _refuse_what_it_cannot_run(d: dict[str, Any]) -> None:
    if d.get("enable_moe_block"):
        raise ModelLoadError("unsupported Gemma 4 MoE (enable_moe_block): only dense Gemma 4 runs")
    if d.get("use_bidirectional_attention") == "all":
        raise ModelLoadError("unsupported use_bidirectional_attention 'all': generation is causal")
    if d.get("attention_bias"):
        raise ModelLoadError("unsupported attention_bias for Gemma 4: its projections have none")
    act = d.get("hidden_activation") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise ModelLoadError(f"unsupported Gemma 4 activation {act!r}; only 'gelu_pytorch_tanh'")


def _layer_types(d: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    types = d.get("layer_types")
    if types is None:
        types = [SLIDING if (i + 1) % _SLIDING_PATTERN else FULL for i in range(num_layers)]
    if len(types) != num_layers or any(t not in (SLIDING, FULL) for t in types):
        raise ModelLoadError(
            f"layer_types must name {SLIDING!r} or {FULL!r} for each of {num_layers} layers"
        )
    return (*types[:-1], FULL)  # transformers forces the last layer to full attention


def _rope(d: dict[str, Any]) -> dict[str, dict[str, Any]]:
    params = d.get("rope_parameters") or _DEFAULT_ROPE
    if not isinstance(params.get(SLIDING), dict) or not isinstance(params.get(FULL), dict):
        raise ModelLoadError(f"Gemma 4 rope_parameters need {SLIDING!r} and {FULL!r} entries")
    if params[SLIDING].get("rope_type", "default") != "default":
        raise ModelLoadError(
            f"unsupported rope type {params[SLIDING]['rope_type']!r} on Gemma 4's sliding layers"
        )
    return params


def _full_rope_scaling(params: dict[str, Any]) -> dict[str, Any]:
    """The full layers' RoPE as rope_norm.py's "proportional" (default: all pairs turn)."""
    rope_type = params.get("rope_type", "default")
    if rope_type not in ("default", PROPORTIONAL):
        raise ModelLoadError(f"unsupported rope type {rope_type!r} on Gemma 4's full layers")
    share = 1.0 if rope_type == "default" else float(params.get("partial_rotary_factor", 1.0))
    factor = 1.0 if rope_type == "default" else float(params.get("factor", 1.0))
    return {"rope_type": PROPORTIONAL, "partial_rotary_factor": share, "factor": factor}


def _full_layer_heads(d: dict[str, Any], types: tuple[str, ...]) -> tuple[int, int | None]:
    """(head size, KV heads or None: as the others) of the full layers."""
    overrides = d.get("per_layer_config")
    if overrides is None:
        heads = d.get("num_global_key_value_heads") if d.get("attention_k_eq_v", True) else None
        return int(d.get("global_head_dim") or _GLOBAL_HEAD_DIM), heads
    full = {i for i, kind in enumerate(types) if kind == FULL}
    entries = {int(i): entry for i, entry in overrides.items()}
    shapes = {(e.get("head_dim"), e.get("num_key_value_heads")) for e in entries.values()}
    if set(entries) != full or len(shapes) != 1 or any(set(e) - {"head_dim", "num_key_value_heads"}
                                                      for e in entries.values()):  # fmt: skip
        raise ModelLoadError(
            "unsupported per_layer_config: only one head_dim / num_key_value_heads for "
            "every full-attention layer"
        )
    head_dim, heads = shapes.pop()
    return int(head_dim or d["head_dim"]), None if heads is None else int(heads)


def _check_kv_sharing(config: DecoderConfig) -> None:
    first_shared = config.num_hidden_layers - config.num_kv_shared_layers
    if not 0 <= config.num_kv_shared_layers < config.num_hidden_layers or not set(
        config.layer_types[first_shared:]
    ) <= set(config.layer_types[:first_shared]):
        raise ModelLoadError(
            f"unsupported num_kv_shared_layers {config.num_kv_shared_layers}: every shared "
            "layer's kind needs an earlier layer of that kind computing K/V"
        )


def parse_gemma4_conditional(d: dict[str, Any]) -> DecoderConfig:
    """A multimodal checkpoint's text decoder: its `text_config` (else the text
    fields at the top level), run as text only."""
    text = d.get("text_config", d)
    if not isinstance(text, dict):
        raise ModelLoadError(f"{CONDITIONAL}'s text_config must be an object, got {text!r}")
    tied = d.get("tie_word_embeddings", text.get("tie_word_embeddings", True))
    config = parse_gemma4(text | {"tie_word_embeddings": tied})
    return dataclasses.replace(config, architecture=CONDITIONAL)


GEMMA4 = Family(ARCHITECTURE, "gemma4_text", parse_gemma4, Gemma4ForCausalLM)
GEMMA4_CONDITIONAL = Family(
    CONDITIONAL, "gemma4", parse_gemma4_conditional, Gemma4ConditionalTextModel
)
FAMILIES = (GEMMA4, GEMMA4_CONDITIONAL)
