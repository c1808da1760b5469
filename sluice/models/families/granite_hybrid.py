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
"""

from __future__ import annotations

from typing import Any

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import FULL, MAMBA
from sluice.models.families.family import Family
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


GRANITE_HYBRID = Family(
    ARCHITECTURE, "granitemoehybrid", parse_granite_hybrid, GraniteHybridForCausalLM
)
FAMILIES = (GRANITE_HYBRID,)
