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

From a GGUF (`qwen35`, as llama.cpp's convert_hf_to_gguf.py writes it:
Qwen3_5TextModel), `QWEN35_GGUF` undoes what the converter did on the way
from the HF checkpoint. The converter:
- renames the Gated DeltaNet's tensors (`in_proj_qkv` -> `attn_qkv`,
  `in_proj_z` -> `attn_gate`, `in_proj_a`/`_b` -> `ssm_alpha`/`_beta`,
  `conv1d` -> `ssm_conv1d` squeezed to [channels, kernel], `dt_bias` ->
  `ssm_dt.bias`, `norm` -> `ssm_norm`, `out_proj` -> `ssm_out`);
- stores `ssm_a` = -exp(A_log) (float32), which is the A the model computes
  from A_log: the A_log given back is the float32 whose exp is that A
  exactly where one exists (else the nearest), so the model's A is the
  file's;
- stores 1 + weight for every RMSNorm but the DeltaNet's gated one (Qwen3.5
  multiplies by 1 + weight): the 1 is taken off again, exactly (the model
  adds it back to the same float32);
- where the layer has fewer key heads than value heads, reorders the value
  heads from grouped by key head to tiled (ggml's broadcast): the V rows of
  `in_proj_qkv` and the conv, the rows of `in_proj_z`, `in_proj_a`/`_b`,
  `A_log`, `dt_bias`, and the columns of `out_proj`; put back here;
- counts multi-token-prediction layers among its blocks (`nextn_predict_layers`),
  which the loader skips, as it skips the HF checkpoint's `mtp.*`.

The config: layer kinds from `attention.recurrent_layers` (else every
`full_attention_interval`-th layer attends), the DeltaNet's sizes from
`ssm.*` (conv_kernel, state_size = key head dim, group_count = key heads,
time_step_rank = value heads, inner_size = value heads x value head dim),
the rotated share of a head from `rope.dimension_count`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import FULL, LINEAR, DecoderConfig
from sluice.models.families.family import (
    QK_NORM_NAMES,
    Family,
    GgufFamily,
    GgufMeta,
    a_log_from_a,
)
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


GGUF_ARCHITECTURE = "qwen35"
_LAYER_NAMES = QK_NORM_NAMES | {
    "post_attention_norm": "post_attention_layernorm",
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
    # Named whole: no `.weight` suffix on either side.
    "ssm_a": "linear_attn.A_log",
    "ssm_dt.bias": "linear_attn.dt_bias",
}
Restore = Callable[[np.ndarray], np.ndarray]


def _gguf_config(config: dict[str, Any], meta: GgufMeta) -> dict[str, Any]:
    num_layers = config["num_hidden_layers"]
    recurrent = meta("attention.recurrent_layers")
    if recurrent is None:
        interval = int(meta("full_attention_interval", 4))
        recurrent = [(i + 1) % interval != 0 for i in range(num_layers)]
    value_heads = int(meta("ssm.time_step_rank"))
    inner = int(meta("ssm.inner_size"))
    if value_heads < 1 or inner % value_heads:
        raise ModelLoadError(
            f"unsupported qwen35 GGUF: ssm.inner_size {inner} is not a multiple of "
            f"ssm.time_step_rank {value_heads}"
        )
    factor = int(meta("rope.dimension_count", config["head_dim"])) / config["head_dim"]
    return {
        "layer_types": [LINEAR if kind else FULL for kind in recurrent[:num_layers]],
        "linear_conv_kernel_dim": int(meta("ssm.conv_kernel")),
        "linear_key_head_dim": int(meta("ssm.state_size")),
        "linear_num_key_heads": int(meta("ssm.group_count")),
        "linear_num_value_heads": value_heads,
        "linear_value_head_dim": inner // value_heads,
        "partial_rotary_factor": factor,
        "rope_parameters": config["rope_parameters"] | {"partial_rotary_factor": factor},
    }


def _restore(name: str, config: dict[str, Any]) -> Restore | None:
    """How to undo what the converter did to tensor `name` (module docstring)."""
    if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        return _minus_one
    if ".linear_attn." not in name:
        return None
    tiled = _tiled_axis(name, config)
    if name.endswith(".A_log"):
        return lambda a: a_log_from_a(_grouped(a, config, tiled) if tiled else a)
    if name.endswith(".conv1d.weight"):
        return lambda w: (_grouped(w, config, tiled) if tiled else w)[:, None, :]
    if tiled is None:
        return None
    return lambda w: _grouped(w, config, tiled)


def _minus_one(weights: np.ndarray) -> np.ndarray:
    return weights - np.float32(1.0)


def _tiled_axis(name: str, config: dict[str, Any]) -> tuple[int, int, int] | None:
    """(axis, first index, per-head size) of the tensor's tiled value heads; None
    where the converter kept them grouped (as many key heads as value heads)."""
    key_heads, value_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
    if key_heads == value_heads:
        return None
    qk = 2 * key_heads * config["linear_key_head_dim"]
    value_dim = config["linear_value_head_dim"]
    for suffix, axis in ((".in_proj_qkv.weight", (0, qk, value_dim)),
                         (".conv1d.weight", (0, qk, value_dim)),
                         (".in_proj_z.weight", (0, 0, value_dim)),
                         (".in_proj_a.weight", (0, 0, 1)), (".in_proj_b.weight", (0, 0, 1)),
                         (".A_log", (0, 0, 1)), (".dt_bias", (0, 0, 1)),
                         (".out_proj.weight", (1, 0, value_dim))):  # fmt: skip
        if name.endswith(suffix):
            return axis
    return None


def _grouped(
    weights: np.ndarray, config: dict[str, Any], tiled: tuple[int, int, int]
) -> np.ndarray:
    """Value heads from the converter's tiled order [per key, key heads] back to
    HF's grouped one [key heads, per key] along `axis`, from index `first` on."""
    axis, first, size = tiled
    key_heads = config["linear_num_key_heads"]
    per_key = config["linear_num_value_heads"] // key_heads
    moved = np.moveaxis(weights, axis, 0)
    heads = moved[first:].reshape(per_key, key_heads, size, *moved.shape[1:])
    grouped = heads.swapaxes(0, 1).reshape(moved[first:].shape)
    return np.moveaxis(np.concatenate([moved[:first], grouped]), 0, axis)


QWEN35_GGUF = GgufFamily(
    GGUF_ARCHITECTURE,
    permutes_qk=False,
    layer_names=_LAYER_NAMES,
    config_entries=_gguf_config,
    restore=_restore,
)


QWEN3_5 = Family(ARCHITECTURE, "qwen3_5_text", parse_qwen3_5, Qwen3_5ForCausalLM,
                 gguf=QWEN35_GGUF, partial_rotary=True)  # fmt: skip
QWEN3_5_CONDITIONAL = Family(CONDITIONAL, "qwen3_5", parse_qwen3_5_conditional,
                             Qwen3_5ConditionalTextModel, partial_rotary=True)  # fmt: skip
FAMILIES = (QWEN3_5, QWEN3_5_CONDITIONAL)
