"""IBM Granite 4.0-H (sluice/models/granite_hybrid.py): Mamba-2 layers
interleaved with attention layers, dense (micro) or with experts (tiny, small).

What the parser reads beyond a Llama's, with transformers 5.24's defaults:
the kind of each layer (`layer_types`: "mamba" or transformers' own
"linear_attention" for a Mamba-2 layer, "attention" or "full_attention"),
the mixer's shape (`mamba_n_heads`, `mamba_d_head` ("auto": expand * hidden
/ heads), `mamba_d_state`, `mamba_n_groups`, `mamba_d_conv`, `mamba_expand`,
their biases, `time_step_limit`), Granite's four scalings, the shared MLP's
width (`shared_intermediate_size`), the experts (`num_local_experts`,
`num_experts_per_tok`, each of width `intermediate_size`), and RoPE only
where `position_embedding_type` is "rope". A shape it cannot run is one line.

From a GGUF (`granitehybrid`, as llama.cpp's convert_hf_to_gguf.py writes it:
GraniteHybridModel), `GRANITE_HYBRID_GGUF` reads what the converter wrote:
- the layer kinds from the per-layer `attention.head_count_kv` (0 on a
  Mamba-2 layer), RoPE only where `rope.scaling.finetuned` says so (the
  converter's flag: off on every hybrid), the mixer's shape from `ssm.*`
  (inner_size = expand * hidden, time_step_rank = heads, group_count,
  state_size, conv_kernel), Granite's scalings from `attention.scale`,
  `embedding_scale`, `residual_scale`, `logit_scale` (an absent one is
  llama.cpp's default), the shared MLP's width from
  `expert_shared_feed_forward_length`;
- the shared MLP's fused `input_linear` split into `ffn_gate` / `ffn_up`
  (`_shexp` in the MoE sizes), the experts' into `ffn_gate_exps` /
  `ffn_up_exps` stacks: they load under split names the model also takes
  (`shared_mlp.gate_proj`, `block_sparse_moe.up_proj`, ...);
- `ssm_a` = -exp(A_log) (A_log given back as the float32 whose exp is the
  file's A, as for Qwen3.5), `ssm_a`/`ssm_d` as [heads, 1], the gated norm as
  [groups, inner / groups] and the conv squeezed to [channels, kernel]: put
  back in HF's shapes;
- attention's q/k rows permuted as llama's (undone by the loader), though
  these layers do not rotate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import FULL, MAMBA
from sluice.models.families.family import Family, GgufFamily, GgufMeta, a_log_from_a
from sluice.models.families.hf_fields import common_fields
from sluice.models.granite_hybrid import GraniteHybridConfig, GraniteHybridForCausalLM
from sluice.models.mamba2_config import MambaShape
from sluice.models.moe import TOPK_SOFTMAX, check_experts

ARCHITECTURE = "GraniteMoeHybridForCausalLM"
_LAYER_KINDS = {"mamba": MAMBA, "linear_attention": MAMBA, "attention": FULL, FULL: FULL}
# The conv kernels a tail of kernel - 1 inputs serves (Granite ships 4).
_MAX_CONV_KERNEL = 64


def parse_granite_hybrid(d: dict[str, Any]) -> GraniteHybridConfig:
    if d.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"unsupported hidden_act {d['hidden_act']!r}; only 'silu'")
    fields = common_fields(
        d | {"intermediate_size": d.get("shared_intermediate_size", 1024)}, ARCHITECTURE
    )
    num_layers = fields["num_hidden_layers"]
    layer_types = _layer_types(d, num_layers)
    if d.get("position_embedding_type") != "rope":
        fields["nope_layers"] = tuple(i for i, kind in enumerate(layer_types) if kind == FULL)
    experts = int(d.get("num_local_experts") or 0)
    expert_fields: dict[str, Any] = {}
    if experts:
        expert_fields = {
            "num_experts": experts,
            "num_experts_per_tok": int(d.get("num_experts_per_tok") or 0),
            "moe_intermediate_size": int(d.get("intermediate_size") or 0),
            "router_scoring": TOPK_SOFTMAX,
        }
    config = GraniteHybridConfig(
        **fields,
        **expert_fields,
        layer_types=layer_types,
        embedding_scale=_multiplier(d, "embedding_multiplier"),
        query_pre_attn_scalar=_multiplier(d, "attention_multiplier") ** -2,
        residual_multiplier=_multiplier(d, "residual_multiplier"),
        logits_scaling=_multiplier(d, "logits_scaling"),
        mamba=_mamba_shape(d, fields["hidden_size"]) if MAMBA in layer_types else None,
    )
    if experts:
        check_experts(config)
    return config


def _multiplier(d: dict[str, Any], key: str) -> float:
    value = d.get(key)
    value = 1.0 if value is None else value
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ModelLoadError(f"config.json's {key!r} must be a positive number, got {value!r}")
    return float(value)


def _layer_types(d: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    names = d.get("layer_types") or d.get("layers_block_type") or ["mamba"] * num_layers
    if len(names) != num_layers:
        raise ModelLoadError(f"layer_types names {len(names)} layers, the model has {num_layers}")
    for name in names:
        if name not in _LAYER_KINDS:
            raise ModelLoadError(
                f"unsupported Granite 4.0-H layer type {name!r}; supported: "
                f"{', '.join(repr(kind) for kind in _LAYER_KINDS)}"
            )
    return tuple(_LAYER_KINDS[name] for name in names)


def _mamba_shape(d: dict[str, Any], hidden_size: int) -> MambaShape:
    inner = int(d.get("mamba_expand", 2)) * hidden_size
    heads = int(d.get("mamba_n_heads", 128))
    head_dim = d.get("mamba_d_head", "auto")
    head_dim = inner // heads if head_dim == "auto" else int(head_dim)
    groups = int(d.get("mamba_n_groups", 1))
    kernel = int(d.get("mamba_d_conv", 4))
    limit = d.get("time_step_limit") or (0.0, float("inf"))
    if heads <= 0 or head_dim * heads != inner:
        raise ModelLoadError(
            f"unsupported Mamba shape: {heads} heads of {head_dim} do not make "
            f"mamba_expand * hidden_size = {inner}"
        )
    if groups <= 0 or heads % groups or inner % groups:
        raise ModelLoadError(f"unsupported mamba_n_groups {groups} for {heads} heads")
    state_size = int(d.get("mamba_d_state", 256))
    if state_size <= 0:
        raise ModelLoadError(f"unsupported mamba_d_state {state_size}: it must be positive")
    if not 2 <= kernel <= _MAX_CONV_KERNEL:
        raise ModelLoadError(
            f"unsupported mamba_d_conv {kernel}: the convolution's kernel must be "
            f"2..{_MAX_CONV_KERNEL}"
        )
    return MambaShape(
        inner_size=inner,
        num_heads=heads,
        head_dim=head_dim,
        state_size=state_size,
        num_groups=groups,
        conv_kernel=kernel,
        conv_bias=bool(d.get("mamba_conv_bias", True)),
        proj_bias=bool(d.get("mamba_proj_bias", False)),
        dt_min=_number(limit[0]),
        dt_max=_number(limit[1]),
    )


def _number(value: Any) -> float:
    """A float as config.json holds it (transformers writes infinity as
    {"__float__": "Infinity"})."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ModelLoadError(
            f"config.json's time_step_limit holds {value!r}, not a number"
        ) from None


GGUF_ARCHITECTURE = "granitehybrid"
_SHARED_MLP = {"gate": "shared_mlp.gate_proj", "up": "shared_mlp.up_proj",
               "down": "shared_mlp.output_linear"}  # fmt: skip
_LAYER_NAMES = {
    **{f"ffn_{part}": name for part, name in _SHARED_MLP.items()},
    **{f"ffn_{part}_shexp": name for part, name in _SHARED_MLP.items()},
    "ffn_gate_inp": "block_sparse_moe.router.layer",
    "ffn_gate_exps": "block_sparse_moe.gate_proj",
    "ffn_up_exps": "block_sparse_moe.up_proj",
    "ffn_down_exps": "block_sparse_moe.output_linear",
    "ssm_in": "mamba.in_proj",
    "ssm_conv1d": "mamba.conv1d",
    "ssm_norm": "mamba.norm",
    "ssm_out": "mamba.out_proj",
    # Named whole: no `.weight` suffix on either side.
    "ssm_a": "mamba.A_log",
    "ssm_d": "mamba.D",
    "ssm_dt.bias": "mamba.dt_bias",
}
# Granite's scalings: (GGUF key, config.json key); 1 where absent, as llama.cpp.
_SCALINGS = (("embedding_scale", "embedding_multiplier"), ("residual_scale", "residual_multiplier"),
             ("logit_scale", "logits_scaling"))  # fmt: skip


def _gguf_config(config: dict[str, Any], meta: GgufMeta) -> dict[str, Any]:
    hidden = config["hidden_size"]
    kv_heads = _kv_heads(config)
    attending = sorted({heads for heads in kv_heads if heads})
    if len(attending) > 1:
        raise ModelLoadError(
            f"unsupported granitehybrid GGUF: attention layers with {attending} K/V heads"
        )
    inner, heads = int(meta("ssm.inner_size")), int(meta("ssm.time_step_rank"))
    if inner % hidden or heads < 1 or inner % heads:
        raise ModelLoadError(
            f"unsupported granitehybrid GGUF: ssm.inner_size {inner} is not a multiple of "
            f"embedding_length {hidden} and of ssm.time_step_rank {heads}"
        )
    experts = int(meta("expert_count", 0))
    entries = {
        "layer_types": ["attention" if n else "mamba" for n in kv_heads],
        "num_key_value_heads": attending[0] if attending else config["num_attention_heads"],
        "position_embedding_type": "rope" if meta("rope.scaling.finetuned", False) else "nope",
        "mamba_expand": inner // hidden,
        "mamba_n_heads": heads,
        "mamba_d_head": inner // heads,
        "mamba_d_state": int(meta("ssm.state_size")),
        "mamba_n_groups": int(meta("ssm.group_count")),
        "mamba_d_conv": int(meta("ssm.conv_kernel")),
        "shared_intermediate_size": int(
            meta("expert_shared_feed_forward_length", config["intermediate_size"])
        ),
        "num_local_experts": experts,
        "num_experts_per_tok": int(meta("expert_used_count", 0)) if experts else 0,
        # llama.cpp scales scores by 1/sqrt(head_dim) where attention.scale is absent.
        "attention_multiplier": float(meta("attention.scale", config["head_dim"] ** -0.5)),
    }
    for key, hf_key in _SCALINGS:
        entries[hf_key] = float(meta(key, 1.0))
    return entries


def _kv_heads(config: dict[str, Any]) -> list[int]:
    """Each layer's K/V heads (0: a Mamba-2 layer) from `attention.head_count_kv`:
    a list, or one number for every layer."""
    num_layers, heads = config["num_hidden_layers"], config["num_key_value_heads"]
    kv_heads = [int(n) for n in heads] if isinstance(heads, list) else [int(heads)] * num_layers
    if len(kv_heads) != num_layers:
        raise ModelLoadError(
            f"unsupported granitehybrid GGUF: attention.head_count_kv names {len(kv_heads)} "
            f"layers, block_count {num_layers}"
        )
    return kv_heads


def _restore(name: str, config: dict[str, Any]) -> Callable[[np.ndarray], np.ndarray] | None:
    """How to undo what the converter did to the Mamba-2 tensor `name` (module docstring)."""
    if name.endswith(".mamba.A_log"):
        return lambda a: a_log_from_a(a.reshape(-1))
    if name.endswith((".mamba.D", ".mamba.norm.weight")):
        return lambda w: w.reshape(-1)
    if name.endswith(".mamba.conv1d.weight"):
        return lambda w: w[:, None, :]
    return None


GRANITE_HYBRID_GGUF = GgufFamily(
    GGUF_ARCHITECTURE,
    permutes_qk=True,
    layer_names=_LAYER_NAMES,
    config_entries=_gguf_config,
    restore=_restore,
    # transformers converts a Granite vocabulary (GPT-2 BPE) under llama's name.
    tokenizer_architecture="llama",
)
GRANITE_HYBRID = Family(
    ARCHITECTURE,
    "granitemoehybrid",
    parse_granite_hybrid,
    GraniteHybridForCausalLM,
    gguf=GRANITE_HYBRID_GGUF,
)
FAMILIES = (GRANITE_HYBRID,)
