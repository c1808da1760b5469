"""LongRoPE ("longrope", once "su"): Phi-3-128k, Phi-3.5-mini, Phi-4-mini.

Each frequency of plain RoPE is divided by a per-dimension factor, one list
for contexts up to `original_max_position_embeddings` ("short_factor") and
another beyond ("long_factor"), and cos and sin are multiplied by an
attention factor (sqrt(1 + ln(factor) / ln(original)), factor = the
model's context over the original one), as transformers'
`_compute_longrope_parameters` computes them.

Which list: transformers picks per forward call, by the longest position in
it, and recomputes the whole cache with the long list once a generation
crosses the original length. A server keeps K/V (and shares it through the
prefix cache) across that line, so it cannot switch a sequence's factors
half-way. As vLLM does (`Phi3LongRoPEScaledRotaryEmbedding.use_long_rope`),
sluice chooses once per server: the long list when the served context
(`max_model_len`) exceeds the original length, else the short one. A
sequence longer than the original length gets exactly transformers' RoPE;
with a long context served, shorter ones get the long list where
transformers would use the short one (serve `--max-model-len` at most the
original length to get the short list).

A parsed "longrope" scaling dict holds:
    short_factor, long_factor: [rotary_dim // 2] floats (rotary_dim: the
        rotated dims of a head, fewer than head_dim on Phi-4-mini);
    original_max_position_embeddings: int;
    attention_factor: float (cos and sin are multiplied by it);
    uses_long_factor: bool (the choice above; the model's own context
        decides until `fit_to_context` is told the served one).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from sluice.errors import ModelLoadError

LONGROPE = "longrope"
# Older Phi-3 files name the same scaling "su".
LONGROPE_ALIASES = (LONGROPE, "su")


def parse_longrope(
    scaling: dict[str, Any], top_level_original: int | None, max_positions: int
) -> dict[str, Any]:
    """The normalised dict (module docstring) of a config's longrope scaling.
    `top_level_original`: Phi-3's `original_max_position_embeddings` beside
    rope_scaling, which wins over one inside it, as in transformers."""
    factors = {}
    for key in ("short_factor", "long_factor"):
        values = scaling.get(key)
        if not isinstance(values, list) or not all(isinstance(v, int | float) for v in values):
            raise ModelLoadError(f"rope_scaling type 'longrope' needs {key!r}, a list of numbers")
        factors[key] = [float(v) for v in values]
    original = top_level_original or scaling.get("original_max_position_embeddings")
    original = int(original or max_positions)
    factor = scaling.get("factor") or max_positions / original
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    return {
        "rope_type": LONGROPE,
        **factors,
        "original_max_position_embeddings": original,
        "attention_factor": float(attention_factor),
        "uses_long_factor": max_positions > original,
    }


def longrope_inv_freq(rope_theta: float, rotary_dim: int, scaling: dict[str, Any]) -> Tensor:
    """[rotary_dim // 2] float32: 1 / (factor * theta ** (2i / rotary_dim)),
    transformers' formula (rotary_dim: head_dim unless the rotary is partial)."""
    key = "long_factor" if scaling["uses_long_factor"] else "short_factor"
    factors = torch.tensor(scaling[key], dtype=torch.float32)  # [rotary_dim // 2]
    if factors.shape[0] != rotary_dim // 2:
        raise ModelLoadError(
            f"rope_scaling {key} has {factors.shape[0]} values for {rotary_dim // 2} frequencies"
        )
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (factors * rope_theta**exponents)


def rope_attention_factor(rope_scaling: dict[str, Any] | None) -> float:
    """What cos and sin are multiplied by: LongRoPE's attention factor, else 1."""
    if rope_scaling is None or rope_scaling["rope_type"] != LONGROPE:
        return 1.0
    return rope_scaling["attention_factor"]


def fit_to_context(
    rope_scaling: dict[str, Any] | None, max_model_len: int
) -> dict[str, Any] | None:
    """`rope_scaling` with LongRoPE's factor list chosen for the served
    context (module docstring); any other scaling unchanged."""
    if rope_scaling is None or rope_scaling["rope_type"] != LONGROPE:
        return rope_scaling
    uses_long = max_model_len > rope_scaling["original_max_position_embeddings"]
    return rope_scaling | {"uses_long_factor": uses_long}


def describe_longrope(rope_scaling: dict[str, Any] | None) -> str:
    """The startup line's note on the factor list; "" without LongRoPE."""
    if rope_scaling is None or rope_scaling["rope_type"] != LONGROPE:
        return ""
    original = rope_scaling["original_max_position_embeddings"]
    if rope_scaling["uses_long_factor"]:
        return f"LongRoPE: long factors for every sequence (context over {original} tokens)"
    return f"LongRoPE: short factors (context at most {original} tokens)"
