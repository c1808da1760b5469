"""YaRN rope scaling ("yarn"): Qwen2.5/Qwen3 long context, SmolLM3, DeepSeek-style configs.

Each RoPE frequency is blended between its plain value (extrapolation, for
the fast-turning dims) and the value divided by `factor` (interpolation,
for the slow ones), with a linear ramp over the dims between the two
correction bounds that `beta_fast` and `beta_slow` (rotations over the
original context) select; cos and sin are then multiplied by an attention
factor: `attention_factor` if the config gives it, else
0.1 * ln(factor) + 1 (or DeepSeek's ratio of two such terms, when `mscale`
and `mscale_all_dim` are given). All as transformers'
`_compute_yarn_parameters` computes them, in float32.

Unlike LongRoPE, the frequencies do not depend on the sequence's length:
one table serves every sequence, so the KV and prefix caches hold exactly
what transformers would compute at any position.

A parsed "yarn" scaling dict holds:
    factor: float;
    original_max_position_embeddings: int (the context the ramp is fitted to);
    beta_fast, beta_slow: float (defaults 32 and 1);
    truncate: bool (round the correction bounds outward; default true);
    attention_factor: float (cos and sin are multiplied by it).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from sluice.errors import ModelLoadError

YARN = "yarn"
_DEFAULT_BETA_FAST = 32.0
_DEFAULT_BETA_SLOW = 1.0


def parse_yarn(
    scaling: dict[str, Any], top_level_original: int | None, max_positions: int
) -> dict[str, Any]:
    """The normalised dict (module docstring) of a config's yarn scaling.
    `top_level_original`: an `original_max_position_embeddings` beside the
    scaling, which wins over one inside it, as in transformers."""
    original = top_level_original or scaling.get("original_max_position_embeddings")
    original = int(original or max_positions)
    factor = scaling.get("factor")
    if factor is None:  # DeepSeek-V3: the ratio of the two contexts
        factor = max_positions / original
    if not isinstance(factor, int | float):
        raise ModelLoadError(f"rope_scaling type 'yarn' needs a numeric 'factor', got {factor!r}")
    for key in ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim"):
        value = scaling.get(key)
        if value is not None and not isinstance(value, int | float):
            raise ModelLoadError(f"rope_scaling type 'yarn' needs a numeric {key!r}, got {value!r}")
    return {
        "rope_type": YARN,
        "factor": float(factor),
        "original_max_position_embeddings": original,
        "beta_fast": float(scaling.get("beta_fast") or _DEFAULT_BETA_FAST),
        "beta_slow": float(scaling.get("beta_slow") or _DEFAULT_BETA_SLOW),
        "truncate": bool(scaling.get("truncate", True)),
        "attention_factor": _attention_factor(scaling, float(factor)),
    }


def _attention_factor(scaling: dict[str, Any], factor: float) -> float:
    given = scaling.get("attention_factor")
    if given is not None:
        return float(given)
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return _mscale(factor, mscale) / _mscale(factor, mscale_all_dim)
    return _mscale(factor)


def _mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_inv_freq(rope_theta: float, rotary_dim: int, scaling: dict[str, Any]) -> Tensor:
    """[rotary_dim // 2] float32: the blended inverse frequencies."""
    pos_freqs = rope_theta ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    extrapolation = 1.0 / pos_freqs  # [R // 2]
    interpolation = 1.0 / (scaling["factor"] * pos_freqs)  # [R // 2]
    low, high = _correction_range(rope_theta, rotary_dim, scaling)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_share = 1 - ramp  # [R // 2]: 1 on the fast dims, 0 on the slow ones
    return interpolation * (1 - extrapolation_share) + extrapolation * extrapolation_share


def _correction_range(
    rope_theta: float, rotary_dim: int, scaling: dict[str, Any]
) -> tuple[float, float]:
    """The dims where `beta_fast` and `beta_slow` rotations fit in the original context."""
    original = scaling["original_max_position_embeddings"]

    def dim_of(num_rotations: float) -> float:
        turns = original / (num_rotations * 2 * math.pi)
        return (rotary_dim * math.log(turns)) / (2 * math.log(rope_theta))

    low, high = dim_of(scaling["beta_fast"]), dim_of(scaling["beta_slow"])
    if scaling["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, rotary_dim - 1)
