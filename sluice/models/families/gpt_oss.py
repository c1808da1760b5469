"""gpt-oss (gpt-oss-20b, gpt-oss-120b): `GptOssForCausalLM`, run by
sluice/models/gpt_oss.py.

What the parser reads beyond Llama's: the experts (`num_local_experts`,
`num_experts_per_tok`, each `intermediate_size` wide; top-k then softmax),
the clamped SwiGLU (`swiglu_alpha`, default 1.702, and `swiglu_limit`,
default 7.0, as transformers' GptOssConfig), which layers slide
(`layer_types`, default sliding then full in turn) over `sliding_window`,
q/k/v/o biases (`attention_bias`, default true) and YaRN RoPE (default
theta 150000). `hidden_act` is not read: transformers' experts ignore it.
Training-only fields (`router_aux_loss_coef`, `output_router_logits`) are
ignored; what would change the output and is not run is one line. A
`quantization_config` of "mxfp4" (OpenAI's release: the experts in MXFP4)
keeps the experts in 4 bits (models/mxfp4_experts.py) where the native
kernel runs, else dequantizes them into the model dtype as they load.

From GGUF: llama.cpp's `gpt-oss` architecture (its converter's output, MXFP4
experts included): the metadata becomes this config (`_gguf_gpt_oss_config`),
the tensors the release's names and layout (loader/gguf_mxfp4.py).
"""

from __future__ import annotations

from typing import Any

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import FULL, SLIDING
from sluice.models.families.family import Family, GgufFamily, GgufMeta
from sluice.models.families.hf_fields import common_fields, require_int
from sluice.models.gpt_oss import GptOssConfig, GptOssForCausalLM
from sluice.models.moe import TOPK_SOFTMAX, check_experts

GPT_OSS = "GptOssForCausalLM"
_DEFAULT_ROPE_THETA = 150000.0


def parse_gpt_oss(d: dict[str, Any]) -> GptOssConfig:
    _refuse_quantized_experts(d)
    if not (d.get("rope_parameters") or {}).get("rope_theta") and d.get("rope_theta") is None:
        d = d | {"rope_theta": _DEFAULT_ROPE_THETA}  # transformers' GptOssConfig.default_theta
    fields = common_fields(d, GPT_OSS)
    has_bias = bool(d.get("attention_bias", True))
    fields.update(attention_bias=has_bias, o_proj_bias=has_bias)
    num_layers = fields["num_hidden_layers"]
    fields["layer_types"] = _layer_types(d.get("layer_types"), num_layers)
    window = d.get("sliding_window")
    if SLIDING in fields["layer_types"] and (not isinstance(window, int) or window < 1):
        raise ModelLoadError(
            f"gpt-oss's sliding layers need a positive integer sliding_window, got {window!r}"
        )
    fields["sliding_window"] = window
    config = GptOssConfig(
        **fields,
        num_experts=require_int(d, "num_local_experts"),
        num_experts_per_tok=require_int(d, "num_experts_per_tok"),
        moe_intermediate_size=fields["intermediate_size"],
        router_scoring=TOPK_SOFTMAX,
        swiglu_alpha=_number(d, "swiglu_alpha", 1.702),
        swiglu_limit=_number(d, "swiglu_limit", 7.0),
    )
    check_experts(config)
    return config


def _refuse_quantized_experts(d: dict[str, Any]) -> None:
    """MXFP4 experts (OpenAI's release) are read, dequantized; any other scheme is refused."""
    quantization = d.get("quantization_config")
    if quantization is None:
        return
    method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization
    if method != "mxfp4":
        raise ModelLoadError(
            f"unsupported quantization_config (quant_method {method!r}) for {GPT_OSS}; "
            "supported: its experts in MXFP4 ('mxfp4') or unquantized"
        )


def _layer_types(value: Any, num_layers: int) -> tuple[str, ...]:
    if value is None:  # transformers' default: sliding, full, sliding, ...
        return tuple(SLIDING if i % 2 == 0 else FULL for i in range(num_layers))
    if not isinstance(value, list) or len(value) != num_layers:
        raise ModelLoadError(f"layer_types must list one kind for each of the {num_layers} layers")
    unknown = sorted({kind for kind in value if kind not in (SLIDING, FULL)}, key=str)
    if unknown:
        raise ModelLoadError(
            f"unsupported layer_types {unknown!r} for {GPT_OSS}; supported: {SLIDING}, {FULL}"
        )
    return tuple(value)


def _number(d: dict[str, Any], key: str, default: float) -> float:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ModelLoadError(f"config.json's {key!r} must be a positive number, got {value!r}")
    return float(value)


def _gguf_gpt_oss_config(config: dict[str, Any], meta: GgufMeta) -> dict[str, Any]:
    """What llama.cpp's gpt-oss metadata says, and what its code fixes: the
    SwiGLU's alpha and limit (1.702, 7.0: llama-graph.cpp), sliding layers
    first then full in turn unless `attention.sliding_window_pattern` says
    otherwise (openai-moe.cpp), and YaRN without truncated bounds (the
    release's rope_parameters, which GGUF has no key for)."""
    width = meta("expert_feed_forward_length", config["intermediate_size"])
    if not isinstance(width, int):
        raise ModelLoadError(f"unsupported GGUF: per-layer expert widths {width!r} for {GPT_OSS}")
    base_swa = meta("rope.freq_base_swa")
    if base_swa is not None and float(base_swa) != config["rope_theta"]:
        raise ModelLoadError(
            f"unsupported GGUF: a sliding-layer rope base {base_swa} for {GPT_OSS}"
        )
    if meta("expert_weights_scale", 0.0) not in (0.0, 1.0):
        raise ModelLoadError(f"unsupported GGUF: expert_weights_scale for {GPT_OSS}")
    entries: dict[str, Any] = {
        "num_local_experts": meta("expert_count"),
        "num_experts_per_tok": meta("expert_used_count"),
        "intermediate_size": width,
        "sliding_window": meta("attention.sliding_window"),
        "swiglu_alpha": 1.702,
        "swiglu_limit": 7.0,
    }
    pattern = _gguf_layer_types(
        meta("attention.sliding_window_pattern"), config["num_hidden_layers"]
    )
    if pattern is not None:
        entries["layer_types"] = pattern
    if config["rope_parameters"].get("rope_type") == "yarn":
        entries["rope_parameters"] = config["rope_parameters"] | {"truncate": False}
    return entries


def _gguf_layer_types(pattern: Any, num_layers: int) -> list[str] | None:
    """llama.cpp's sliding-window pattern: one flag a layer, or every n-th layer
    full (the others sliding); None where absent (transformers' default)."""
    if pattern is None:
        return None
    if isinstance(pattern, list):
        return [SLIDING if flag else FULL for flag in pattern]
    if not isinstance(pattern, int) or pattern < 1:
        raise ModelLoadError(f"unsupported GGUF sliding_window_pattern {pattern!r}")
    return [SLIDING if i % pattern < pattern - 1 else FULL for i in range(num_layers)]


# llama.cpp's gpt-oss tensors beyond llama's (each expert stack with its bias;
# loader/gguf_mxfp4.py puts the stacks back into the release's layout).
GPT_OSS_LAYER_NAMES = {
    "post_attention_norm": "post_attention_layernorm",
    "attn_sinks": "self_attn.sinks",
    "ffn_gate_inp": "mlp.router",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
FAMILIES = (
    Family(
        GPT_OSS,
        "gpt_oss",
        parse_gpt_oss,
        GptOssForCausalLM,
        gguf=GgufFamily(
            "gpt-oss",
            permutes_qk=False,
            layer_names=GPT_OSS_LAYER_NAMES,
            config_entries=_gguf_gpt_oss_config,
            release_experts=True,
            # llama.cpp's end-of-generation tokens for o200k_harmony: a tool call
            # ends at <|call|>, an answer at <|return|> (not <|end|>).
            stop_tokens=("<|return|>", "<|call|>"),
            # transformers 5.24 fails reading a gpt-oss GGUF's rope metadata
            # (modeling_gguf_pytorch_utils: float() of a key's bytes); its
            # byte-level BPE converts under Llama 3's name.
            tokenizer_architecture="llama",
        ),
    ),
)
