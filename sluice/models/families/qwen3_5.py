"""Qwen3.5 dense text models (sluice/models/qwen3_5.py): Gated DeltaNet
linear-attention layers between gated full-attention layers.

What the parser reads beyond Qwen3's: the kind of each layer
("linear_attention" or "full_attention", from `layer_types` or every
`full_attention_interval`-th layer), the Gated DeltaNet's heads and sizes
(`linear_*`, transformers' defaults) and conv kernel, partial RoPE
(`partial_rotary_factor`, 0.25 by default, inside `rope_parameters`; its
multimodal RoPE sections rotate a text token as plain RoPE does). A
multimodal `Qwen3_5ForConditionalGeneration` checkpoint runs as its text
decoder (`text_config`). A layer kind or a state shape it cannot run is one
line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import FULL, LINEAR, DecoderConfig
from sluice.models.families.family import Family
from sluice.models.families.hf_fields import check_swiglu, common_fields
from sluice.models.qwen3_5 import Qwen3_5ConditionalTextModel, Qwen3_5ForCausalLM

ARCHITECTURE = "Qwen3_5ForCausalLM"
CONDITIONAL = "Qwen3_5ForConditionalGeneration"
# transformers 5.24's Qwen3_5TextConfig defaults.
_DEFAULTS = {
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "head_dim": 256,
    "partial_rotary_factor": 0.25,
}  # fmt: skip
_MAX_CONV_KERNEL = 64


def parse_qwen3_5(d: dict[str, Any]) -> DecoderConfig:
    d = {**_DEFAULTS, **d}
    check_swiglu(d)
    if d.get("attention_bias"):
        raise ModelLoadError("unsupported attention_bias=true for Qwen3.5's gated attention")
    params = dict(d.get("rope_parameters") or {})
    if "partial_rotary_factor" not in params:
        d["rope_parameters"] = params | {"partial_rotary_factor": d["partial_rotary_factor"]}
    fields = common_fields(d, ARCHITECTURE, allows_partial_rotary=True)
    kernel = int(d["linear_conv_kernel_dim"])
    if not 2 <= kernel <= _MAX_CONV_KERNEL:
        raise ModelLoadError(
            f"unsupported linear_conv_kernel_dim {kernel}: the conv kernel must be "
            f"2..{_MAX_CONV_KERNEL}"
        )
    linear = {key: int(d[f"linear_{key}"]) for key in
              ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim")}  # fmt: skip
    if min(linear.values()) < 1 or linear["num_value_heads"] % linear["num_key_heads"]:
        raise ModelLoadError(
            f"unsupported Gated DeltaNet heads {linear}: sizes must be positive and "
            "linear_num_value_heads a multiple of linear_num_key_heads"
        )
    return DecoderConfig(
        **fields,
        qk_norm=True,
        layer_types=_layer_types(d, fields["num_hidden_layers"]),
        conv_kernel_size=kernel,
        attention_output_gate=True,
        linear_num_key_heads=linear["num_key_heads"],
        linear_num_value_heads=linear["num_value_heads"],
        linear_key_head_dim=linear["key_head_dim"],
        linear_value_head_dim=linear["value_head_dim"],
    )


def _layer_types(d: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    types = d.get("layer_types")
    if types is None:
        interval = int(d.get("full_attention_interval", 4))
        types = [LINEAR if (i + 1) % interval else FULL for i in range(num_layers)]
    if len(types) != num_layers:
        raise ModelLoadError(f"layer_types names {len(types)} layers, the model has {num_layers}")
    for kind in types:
        if kind not in (LINEAR, FULL):
            raise ModelLoadError(
                f"unsupported Qwen3.5 layer type {kind!r}; supported: {LINEAR!r}, {FULL!r}"
            )
    return tuple(types)


def parse_qwen3_5_conditional(d: dict[str, Any]) -> DecoderConfig:
    """A multimodal checkpoint's text decoder: its `text_config`, run as text only."""
    text = d.get("text_config", d)
    if not isinstance(text, dict):
        raise ModelLoadError(f"{CONDITIONAL}'s text_config must be an object, got {text!r}")
    tied = d.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    config = parse_qwen3_5(text | {"tie_word_embeddings": tied})
    return dataclasses.replace(config, architecture=CONDITIONAL)


QWEN3_5 = Family(ARCHITECTURE, "qwen3_5_text", parse_qwen3_5, Qwen3_5ForCausalLM,
                 partial_rotary=True)  # fmt: skip
QWEN3_5_CONDITIONAL = Family(CONDITIONAL, "qwen3_5", parse_qwen3_5_conditional,
                             Qwen3_5ConditionalTextModel, partial_rotary=True)  # fmt: skip
FAMILIES = (QWEN3_5, QWEN3_5_CONDITIONAL)
