"""What every family reads the same way from an HF `config.json` dict.

The family parsers (`families/<family>.py`) start from `common_fields` and
set what is their own; anything the model code cannot run raises
`ModelLoadError` with one line. RoPE is read from either layout
(transformers < 5: top-level `rope_theta` + `rope_scaling`; transformers 5:
`rope_parameters`, maybe per layer type) into one normalised form.
"""

from __future__ import annotations

from typing import Any

from sluice.errors import ModelLoadError
from sluice.models.decoder_config import DecoderConfig, UnsupportedRopeScalingError
from sluice.models.longrope import LONGROPE, LONGROPE_ALIASES, parse_longrope
from sluice.models.yarn import YARN, parse_yarn

# "freq_factors": llama.cpp's per-dimension divisors of the frequencies (a
# GGUF's rope_freqs tensor, how its converter stores Llama 3.1+'s llama3 scaling).
# "longrope": Phi-3.5/Phi-4-mini's (sluice/models/longrope.py); "yarn":
# sluice/models/yarn.py.
SUPPORTED_ROPE_TYPES = ("linear", "llama3", "freq_factors", LONGROPE, YARN)
_DEFAULT_ROPE_THETA = 10000.0


def common_fields(
    d: dict[str, Any], architecture: str, allows_partial_rotary: bool = False
) -> dict[str, Any]:
    """`DecoderConfig`'s fields as a Llama reads them; a family overrides its own."""
    hidden_size = require_int(d, "hidden_size")
    num_heads = require_int(d, "num_attention_heads")
    max_positions = require_int(d, "max_position_embeddings")
    rope_theta, rope_scaling = rope(d, max_positions)
    head_dim = int(d.get("head_dim") or hidden_size // num_heads)
    has_bias = bool(d.get("attention_bias", False))
    return {
        "architecture": architecture,
        "vocab_size": require_int(d, "vocab_size"),
        "hidden_size": hidden_size,
        "intermediate_size": require_int(d, "intermediate_size"),
        "num_hidden_layers": require_int(d, "num_hidden_layers"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(d.get("num_key_value_heads") or num_heads),
        "head_dim": head_dim,
        "rotary_dim": rotary_dim(d, head_dim, architecture, allows_partial_rotary),
        "rms_norm_eps": float(d.get("rms_norm_eps", 1e-6)),
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": bool(d.get("tie_word_embeddings", False)),
        "attention_bias": has_bias,
        "o_proj_bias": has_bias,
        "sliding_window": None,
        "bos_token_id": d.get("bos_token_id"),
    }


def require_int(d: dict[str, Any], key: str) -> int:
    if d.get(key) is None:
        raise ModelLoadError(f"config.json lacks {key!r}")
    return int(d[key])


def check_swiglu(d: dict[str, Any]) -> None:
    """The MLP is SwiGLU without bias, as the decoder runs it."""
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ModelLoadError(f"unsupported hidden_act {act!r}; only 'silu' (SwiGLU) is supported")
    if d.get("mlp_bias", False):
        raise ModelLoadError("unsupported mlp_bias=true; the MLP projections must have no bias")


def check_heads(config: DecoderConfig) -> DecoderConfig:
    if config.num_attention_heads % config.num_key_value_heads:
        raise ModelLoadError(
            f"num_attention_heads {config.num_attention_heads} is not a multiple of "
            f"num_key_value_heads {config.num_key_value_heads}"
        )
    return config


def full_context_window(d: dict[str, Any], max_positions: int) -> int | None:
    """The declared window where it covers the whole context; a shorter one is refused."""
    # Qwen2 files declare a window but switch it off with use_sliding_window.
    if not d.get("use_sliding_window", True):
        return None
    window = d.get("sliding_window")
    if window is not None and int(window) < max_positions:
        raise ModelLoadError(
            f"sliding window attention is unsupported (sliding_window {window} < "
            f"max_position_embeddings {max_positions})"
        )
    return None if window is None else int(window)


def rope(d: dict[str, Any], max_positions: int) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, normalised rope_scaling) from either config layout."""
    params = dict(d.get("rope_parameters") or {})
    if isinstance(params.get("full_attention"), dict):  # per-layer-type layout
        params = dict(params["full_attention"])
    theta = params.pop("rope_theta", None) or d.get("rope_theta") or _DEFAULT_ROPE_THETA
    scaling = params if params.get("rope_type", params.get("type")) else d.get("rope_scaling")
    original = d.get("original_max_position_embeddings")
    return float(theta), _normalise_rope_scaling(scaling, max_positions, original)


def rotary_dim(
    d: dict[str, Any], head_dim: int, architecture: str, allows_partial_rotary: bool
) -> int:
    """How many dims of each head RoPE rotates: int(head_dim * partial_rotary_factor),
    as transformers derives it, the factor read at the top level or inside
    rope_parameters / rope_scaling (transformers 5 writes both)."""
    params = d.get("rope_parameters") or {}
    if isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]
    sources = (params, d.get("rope_scaling") or {}, d)
    value = next((s["partial_rotary_factor"] for s in sources if s.get("partial_rotary_factor")), 1)
    if not isinstance(value, int | float):
        raise ModelLoadError(f"partial_rotary_factor must be a number, got {value!r}")
    factor = float(value)
    if factor == 1.0:
        return head_dim
    rotary_dim = int(head_dim * factor)
    if not allows_partial_rotary:
        raise ModelLoadError(
            f"unsupported partial_rotary_factor {factor} for {architecture}: "
            "only Phi-3 (Phi-4-mini) rotates part of each head"
        )
    if not 0.0 < factor < 1.0 or rotary_dim < 2 or rotary_dim % 2:
        raise ModelLoadError(
            f"unsupported partial_rotary_factor {factor}: RoPE needs an even number of "
            f"dims of the {head_dim} in a head, got {rotary_dim}"
        )
    return rotary_dim


def _normalise_rope_scaling(
    scaling: dict[str, Any] | None, max_positions: int, original: int | None
) -> dict[str, Any] | None:
    if not scaling:
        return None
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type in LONGROPE_ALIASES:
        return parse_longrope(scaling, original, max_positions)
    if rope_type == YARN:
        return parse_yarn(scaling, original, max_positions)
    scaling = {k: v for k, v in scaling.items() if k not in ("rope_type", "type", "rope_theta")}
    if rope_type == "default":
        return None
    if rope_type == "dynamic":
        raise UnsupportedRopeScalingError(
            "rope_scaling type 'dynamic' (dynamic NTK) is not supported: it changes the "
            "frequencies with the sequence length; supported: " + ", ".join(SUPPORTED_ROPE_TYPES)
        )
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedRopeScalingError(
            f"unsupported rope_scaling type {rope_type!r}; supported: "
            + ", ".join(SUPPORTED_ROPE_TYPES)
        )
    if rope_type == "freq_factors":
        if not isinstance(scaling.get("factors"), list):
            raise ModelLoadError("rope_scaling type 'freq_factors' lacks its 'factors' list")
        return {"rope_type": rope_type, "factors": [float(f) for f in scaling["factors"]]}
    if "factor" not in scaling:
        raise ModelLoadError(f"rope_scaling type {rope_type!r} lacks 'factor'")
    if rope_type == "llama3":
        scaling.setdefault("original_max_position_embeddings", max_positions)
        for key in ("low_freq_factor", "high_freq_factor"):
            if key not in scaling:
                raise ModelLoadError(f"rope_scaling type 'llama3' lacks {key!r}")
    return {"rope_type": rope_type, **scaling}
