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
is read by dequantizing the experts into the model dtype as they load.
"""

from __future__ import annotations

from typing import Any

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import FULL, SLIDING
from sluice.models.families.family import Family
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


FAMILIES = (Family(GPT_OSS, "gpt_oss", parse_gpt_oss, GptOssForCausalLM),)
