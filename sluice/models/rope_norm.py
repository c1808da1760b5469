"""Rotary position embedding and RMSNorm: the elementwise pieces of a layer.

Both have a second path for steps of at most `FEW_TOKENS` rows (decode
batches). There, the cost of a step is the number of torch ops, not their
arithmetic: a 135M model's decode step runs about 40 ops per layer, 30
layers, and each op costs 1-3 us of dispatch however small its tensors.
- `RopeAngles.rotate` applies the rotation in 4 ops instead of 8, with
  full-width tables built once per step and shared by every layer;
- `RMSNorm` on a few rows runs torch's fused layer_norm kernel on [x, -x],
  a row whose mean is 0 and whose variance is mean(x^2): its first half is
  rms_norm(x), one kernel instead of rms_norm's eight ops (2x faster on one
  row). The two formulas round differently, by float32 rounding
  (about 1e-8 relative): float32 results agree to that, bfloat16 ones are
  the same up to a rare last-bit flip.
Large steps keep torch's plain formulas, which are faster there.

On CPU in bfloat16 the model rotates q and k with a native kernel instead
(sluice/models/native/rope.py: float32 angles, `Float32Angles`, one
rounding, the K/V cache write in the same pass); `rotate` is the path
elsewhere, in batch-invariant mode, and for partial rotary (Phi-4-mini: the
kernel rotates whole heads).

Batch-invariant mode takes one path for every step size (the plain rotation;
the C RMSNorm kernel, one row at a time, else torch's plain formula), so a
row's bits never depend on how many rows share its step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from sluice.models.decoder_config import DecoderConfig, UnsupportedRopeScalingError
from sluice.models.longrope import LONGROPE, longrope_inv_freq, rope_attention_factor
from sluice.models.native import rms_norm_kernel
from sluice.models.yarn import YARN, yarn_inv_freq

# Gemma 4's full layers' RoPE (families/gemma4.py parses it): rope_scaling
# {"rope_type": PROPORTIONAL, "partial_rotary_factor": float, "factor": float}.
PROPORTIONAL = "proportional"
# Steps of at most this many tokens take the few-op paths.
FEW_TOKENS = 8


def rope_inv_freq(config: DecoderConfig) -> Tensor:  # [rotary_dim // 2] float32
    """Inverse frequencies of the rotary embedding, scaled as the config says;
    over the rotated dims only (`rotary_dim`, as transformers' partial rotary)."""
    dim = config.rotary_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim  # [dim // 2]
    inv_freq = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":
        return inv_freq / scaling["factor"]
    if scaling["rope_type"] == LONGROPE:
        return longrope_inv_freq(config.rope_theta, dim, scaling)
    if scaling["rope_type"] == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if scaling["rope_type"] == YARN:
        return yarn_inv_freq(config.rope_theta, dim, scaling)
    if scaling["rope_type"] == PROPORTIONAL:
        return _proportional_inv_freq(config.rope_theta, dim, scaling)
    if scaling["rope_type"] == "freq_factors":
        # llama.cpp divides each frequency by its factor (GGUF rope_freqs).
        factors = torch.tensor(scaling["factors"], dtype=torch.float32)
        if factors.shape != inv_freq.shape:
            raise UnsupportedRopeScalingError(
                f"{factors.shape[0]} rope frequency factors for {inv_freq.shape[0]} frequencies"
            )
        return inv_freq / factors
    raise UnsupportedRopeScalingError(f"unsupported rope_scaling type {scaling['rope_type']!r}")


def _proportional_inv_freq(rope_theta: float, head_dim: int, scaling: dict) -> Tensor:
    # Gemma 4's full layers: the first partial_rotary_factor of the head's
    # frequency pairs turn (exponents over the whole head), the rest have
    # frequency 0 and so pass through; all divided by `factor`, as
    # transformers' _compute_proportional_rope_parameters.
    rope_angles = int(scaling["partial_rotary_factor"] * head_dim // 2)
    exponents = torch.arange(0, 2 * rope_angles, 2, dtype=torch.int64).float() / head_dim
    turning = 1.0 / (rope_theta**exponents)  # [rope_angles]
    still = torch.zeros(head_dim // 2 - rope_angles, dtype=torch.float32)
    return torch.cat((turning, still)) / scaling["factor"]


def _llama3_inv_freq(inv_freq: Tensor, scaling: dict) -> Tensor:
    # Llama 3.1: long wavelengths are stretched by `factor`, short ones kept, and
    # the band between is interpolated smoothly.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq  # [R // 2]
    stretched = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * stretched / factor + smooth * stretched
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, blended, stretched)


def rope_cos_sin(config: DecoderConfig, dtype: torch.dtype, device) -> tuple[Tensor, Tensor]:
    """cos and sin tables, each [max_position_embeddings, rotary_dim // 2]
    (times LongRoPE's or YaRN's attention factor, as transformers scales them)."""
    positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
    angles = torch.outer(positions, rope_inv_freq(config))  # [max_pos, R // 2]
    scaling = config.rope_scaling
    scale = rope_attention_factor(scaling)
    if scaling is not None and scaling["rope_type"] == YARN:
        scale = scaling["attention_factor"]
    cos, sin = angles.cos() * scale, angles.sin() * scale
    return cos.to(dtype=dtype, device=device), sin.to(dtype=dtype, device=device)


@dataclass(slots=True)
class RopeAngles:
    """The rotation of one step's tokens, shared by every layer (half-split
    layout over the first R = rotary_dim dims of a head; R < D, partial
    rotary, leaves the last D - R dims as they are)."""

    cos: Tensor  # [T, 1, R // 2]
    sin: Tensor  # [T, 1, R // 2]
    # For few-token steps: cat(cos, cos) and cat(-sin, sin), so that
    # rotate(x) = x * cos_full + cat(x2, x1) * sin_signed.
    cos_full: Tensor | None  # [T, 1, R]
    sin_signed: Tensor | None  # [T, 1, R]

    @classmethod
    def at(
        cls,
        cos_table: Tensor,
        sin_table: Tensor,
        positions: Tensor,
        is_batch_invariant: bool = False,
    ) -> RopeAngles:
        """Tables [max_pos, R // 2] indexed at positions [T]."""
        cos = cos_table[positions].unsqueeze(1)  # [T, 1, R // 2]
        sin = sin_table[positions].unsqueeze(1)  # [T, 1, R // 2]
        if is_batch_invariant or positions.shape[0] > FEW_TOKENS:
            return cls(cos, sin, None, None)
        return cls(cos, sin, torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1))

    def rotate(self, x: Tensor) -> Tensor:  # [T, H, D] -> [T, H, D], each token by its position
        rotary_dim = 2 * self.cos.shape[-1]
        if rotary_dim != x.shape[-1]:  # partial rotary: the rest pass through
            return torch.cat((self._rotate(x[..., :rotary_dim]), x[..., rotary_dim:]), dim=-1)
        return self._rotate(x)

    def _rotate(self, x: Tensor) -> Tensor:  # [T, H, R] -> [T, H, R]
        x1, x2 = x.chunk(2, dim=-1)  # [T, H, R // 2] each
        if self.cos_full is None:
            cos, sin = self.cos, self.sin
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return torch.addcmul(x * self.cos_full, torch.cat((x2, x1), dim=-1), self.sin_signed)


@dataclass(slots=True)
class Float32Angles:
    """One step's angles in float32, for the native RoPE kernel
    (sluice/models/native/rope.py), which rotates and rounds once."""

    cos: Tensor  # [T, D // 2] float32
    sin: Tensor  # [T, D // 2] float32

    @classmethod
    def at(cls, cos_table: Tensor, sin_table: Tensor, positions: Tensor) -> Float32Angles:
        return cls(cos_table[positions], sin_table[positions])


class RMSNorm:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dimension."""

    def __init__(self, weight: Tensor, eps: float, is_batch_invariant: bool = False):
        self.weight = weight  # [hidden]
        self.eps = eps
        # One formula for every step size (module docstring).
        self.few_tokens = 0 if is_batch_invariant else FEW_TOKENS
        self._doubled = torch.cat((weight, weight))  # [2 * hidden], for the few-row path
        # On CPU, the C kernel (sluice/models/native): one pass per row, 2-8x
        # faster than either torch path; None elsewhere or without a compiler.
        self._kernel = None
        if weight.device.type == "cpu" and weight.is_contiguous():
            self._kernel = rms_norm_kernel(weight.dtype)

    def __call__(self, x: Tensor) -> Tensor:  # [T, hidden] -> [T, hidden]
        if self._kernel is not None and x.stride(1) == 1:
            return self._kernel(x, self.weight, self.eps)
        num_rows, hidden = x.shape
        if num_rows > self.few_tokens:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        mirrored = torch.cat((x, x.neg()), dim=-1)  # [T, 2 * hidden], every row's mean is 0
        normed = F.layer_norm(mirrored, self._doubled.shape, self._doubled, None, self.eps)
        return normed[:, :hidden] if num_rows == 1 else normed[:, :hidden].contiguous()
