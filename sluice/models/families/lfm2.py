"""Liquid's LFM2 (sluice/models/lfm2.py): short gated convolutions between
attention layers.

What the parser reads beyond a Llama's: the kind of each layer ("conv" or
"full_attention", from `layer_types` or `full_attn_idxs`), the convolution's
kernel (`conv_L_cache`) and bias, `norm_eps`, q/k norms always, RoPE base
1e6 by default, and the MLP width as transformers derives it (2/3 of
`intermediate_size`, times `block_ffn_dim_multiplier`, rounded up to
`block_multiple_of`). A layer kind or a kernel it cannot run is one line.
"""

from __future__ import annotations

from typing import Any

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import CONV, FULL, DecoderConfig
from sluice.models.families.family import Family, GgufFamily, GgufMeta
from sluice.models.families.hf_fields import common_fields
from sluice.models.lfm2 import Lfm2ForCausalLM

ARCHITECTURE = "Lfm2ForCausalLM"
_DEFAULT_ROPE_THETA = 1e6
# The kernel sizes a state of kernel - 1 inputs serves (LFM2 ships 3).
_MAX_CONV_KERNEL = 64


def parse_lfm2(d: dict[str, Any]) -> DecoderConfig:
    d = dict(d)
    d["rms_norm_eps"] = d.get("norm_eps", d.get("rms_norm_eps", 1e-5))
    d.setdefault("tie_word_embeddings", d.get("tie_embedding", True))
    if "intermediate_size" not in d and "block_ff_dim" in d:
        d["intermediate_size"] = d["block_ff_dim"]
    params = d.get("rope_parameters") or {}
    if not params.get("rope_theta") and not d.get("rope_theta"):
        d["rope_parameters"] = {**params, "rope_theta": _DEFAULT_ROPE_THETA}
    fields = common_fields(d, ARCHITECTURE)
    fields["intermediate_size"] = _mlp_width(d, fields["intermediate_size"])
    kernel = int(d.get("conv_L_cache", 3))
    if not 2 <= kernel <= _MAX_CONV_KERNEL:
        raise ModelLoadError(
            f"unsupported conv_L_cache {kernel}: the short convolution's kernel must be "
            f"2..{_MAX_CONV_KERNEL}"
        )
    return DecoderConfig(
        **fields,
        qk_norm=True,
        layer_types=_layer_types(d, fields["num_hidden_layers"]),
        conv_kernel_size=kernel,
        conv_bias=bool(d.get("conv_bias", False)),
    )


def _mlp_width(d: dict[str, Any], width: int) -> int:
    """transformers' Lfm2MLP width."""
    if not d.get("block_auto_adjust_ff_dim", True):
        return width
    width = int(2 * width / 3)
    multiplier = d.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is not None:
        multiple = int(d.get("block_multiple_of", 256))
        width = int(multiplier * width)
        width = multiple * ((width + multiple - 1) // multiple)
    return width


def _layer_types(d: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    types = d.get("layer_types")
    if types is None:
        attention = d.get("full_attn_idxs")
        attention = range(num_layers) if attention is None else attention
        types = [FULL if i in attention else CONV for i in range(num_layers)]
    if len(types) != num_layers:
        raise ModelLoadError(f"layer_types names {len(types)} layers, the model has {num_layers}")
    for kind in types:
        if kind not in (CONV, FULL):
            raise ModelLoadError(
                f"unsupported LFM2 layer type {kind!r}; supported: {CONV!r}, {FULL!r}"
            )
    return tuple(types)


def _gguf_config(config: dict[str, Any], meta: GgufMeta) -> dict[str, Any]:
    """LFM2 as llama.cpp's converter writes it: KV heads per layer (0 for a
    conv layer), the conv kernel in `shortconv.l_cache`, the MLP width already
    derived."""
    kv_heads = meta("attention.head_count_kv")
    if not isinstance(kv_heads, list):
        kv_heads = [kv_heads] * config["num_hidden_layers"]
    return {
        "layer_types": [FULL if heads else CONV for heads in kv_heads],
        "num_key_value_heads": max(kv_heads),
        "conv_L_cache": meta("shortconv.l_cache", 3),
        "norm_eps": config["rms_norm_eps"],
        "block_auto_adjust_ff_dim": False,
    }


# llama.cpp's LFM2 tensors: the conv layers' `shortconv.*`, LFM2's names for the rest.
_GGUF_LAYER_NAMES = {
    "attn_norm": "operator_norm",
    "ffn_norm": "ffn_norm",
    "attn_output": "self_attn.out_proj",
    "attn_q_norm": "self_attn.q_layernorm",
    "attn_k_norm": "self_attn.k_layernorm",
    "ffn_gate": "feed_forward.w1",
    "ffn_up": "feed_forward.w3",
    "ffn_down": "feed_forward.w2",
    "shortconv.conv": "conv.conv",
    "shortconv.in_proj": "conv.in_proj",
    "shortconv.out_proj": "conv.out_proj",
}
LFM2 = Family(
    ARCHITECTURE,
    "lfm2",
    parse_lfm2,
    Lfm2ForCausalLM,
    gguf=GgufFamily(
        "lfm2",
        permutes_qk=False,
        layer_names=_GGUF_LAYER_NAMES,
        config_entries=_gguf_config,
        global_names={"token_embd_norm": "model.embedding_norm"},
    ),
)
FAMILIES = (LFM2,)
