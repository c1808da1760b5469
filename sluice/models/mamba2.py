"""A Mamba-2 layer: `Mamba2Layer` (the mixer in attention's place, the
decoder's MLP after it).

The mixer, as transformers' Mamba2 / GraniteMoeHybrid torch path computes it:
in_proj gives z (the gate), x B C (through a causal depthwise conv1d of
kernel L and silu) and dt per head; the selective scan
(sluice/models/mamba2_scan.py) mixes x over the sequence; y + D x is
multiplied by silu(z) and RMS-normed per group (`num_groups` groups of
`inner_size / num_groups`), then out_proj. in_proj and out_proj are kept as
the layer's `qkv_proj` and `o_proj`, so quantization and calibration treat
them as any layer's input and output matrices.

Its per-sequence state (conv tail, SSM state) lives in its cache rows
(sluice/models/mamba2_config.py); the step's `AttentionMetadata.sequence_states`
names each sequence's slot.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from sluice.models import mamba2_scan
from sluice.models.attention import AttentionMetadata
from sluice.models.decoder_config import DecoderConfig
from sluice.models.linear import Linear, in_row_tiles, uninitialised_weight
from sluice.models.llama import LlamaDecoderLayer
from sluice.models.mamba2_config import mamba_shape
from sluice.models.native.recurrent import mamba_scan, recurrent_available
from sluice.models.rope_norm import Float32Angles, RMSNorm, RopeAngles
from sluice.models.weight_targets import WeightTarget


class Mamba2Layer(LlamaDecoderLayer):
    supports_fused_decode: ClassVar[bool] = False

    def __init__(
        self,
        config: DecoderConfig,
        dtype: torch.dtype,
        device,
        batch_invariant: bool = False,
        is_sliding: bool = False,
    ):
        super().__init__(config, dtype, device, batch_invariant, is_sliding)
        shape = self.shape = mamba_shape(config)
        p = {"dtype": dtype, "device": device, "row_tile": self.row_tile}
        self.qkv_proj = Linear(config.hidden_size, shape.projection_size, shape.proj_bias, **p)
        self.o_proj = Linear(shape.inner_size, config.hidden_size, shape.proj_bias, **p)
        self.q_norm = self.k_norm = None
        w = {"dtype": dtype, "device": device}
        # [conv_dim, L] (transformers' [conv_dim, 1, L] squeezed as it loads).
        self.conv_weight = uninitialised_weight(shape.conv_dim, shape.conv_kernel, **w)
        self.conv_bias = uninitialised_weight(shape.conv_dim, **w) if shape.conv_bias else None
        self.dt_bias = uninitialised_weight(shape.num_heads, **w)
        self.a_log = uninitialised_weight(shape.num_heads, **w)
        self.d_skip = uninitialised_weight(shape.num_heads, **w)
        self.gated_norm_weight = uninitialised_weight(shape.inner_size, **w)

    def finish_loading(self) -> None:
        super().finish_loading()
        shape = self.shape
        self.taps = self.conv_weight.t().contiguous()  # [L, conv_dim]
        self.decay_rate = -torch.exp(self.a_log.float())  # [heads] A
        group = torch.ones(shape.inner_size // shape.num_groups, device=self.a_log.device)
        self.group_norm = RMSNorm(group, self.eps, self.batch_invariant)

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """transformers' names of the mixer's tensors under `prefix` ("...mamba.")."""
        targets = {
            prefix + "in_proj.weight": WeightTarget(self.qkv_proj.weight),
            prefix + "out_proj.weight": WeightTarget(self.o_proj.weight),
            prefix + "conv1d.weight": WeightTarget(self.conv_weight),
            prefix + "dt_bias": WeightTarget(self.dt_bias),
            prefix + "A_log": WeightTarget(self.a_log),
            prefix + "D": WeightTarget(self.d_skip),
            prefix + "norm.weight": WeightTarget(self.gated_norm_weight),
        }
        if self.conv_bias is not None:
            targets[prefix + "conv1d.bias"] = WeightTarget(self.conv_bias)
        if self.qkv_proj.bias is not None and self.o_proj.bias is not None:
            targets[prefix + "in_proj.bias"] = WeightTarget(self.qkv_proj.bias)
            targets[prefix + "out_proj.bias"] = WeightTarget(self.o_proj.bias)
        return targets

    def forward(
        self,
        hidden: Tensor,  # [T, hidden], updated in place (the residual stream)
        rope: RopeAngles | Float32Angles,
        kv_cache: Tensor,  # [num_blocks + num_slots, numel] float32: this layer's states
        attn: AttentionMetadata,
    ) -> Tensor:
        hidden += self.mix(self.attention_norm(hidden), kv_cache, attn)
        hidden += self._mlp(self.mlp_norm(hidden))
        return hidden

    def mix(self, x: Tensor, cache: Tensor, attn: AttentionMetadata) -> Tensor:  # [T, hidden]
        shape = self.shape
        num_tokens = x.shape[0]
        plan = mamba2_scan.build_plan(attn, cache.shape[0])
        start = mamba2_scan.start_states(cache, plan)  # [B, numel] float32
        proj = self.qkv_proj(x)  # [T, inner + conv_dim + heads]
        z, xbc, dt = proj.split([shape.inner_size, shape.conv_dim, shape.num_heads], dim=-1)
        # 1. The causal conv over each sequence's tail and tokens, then silu.
        conv, ext = mamba2_scan.convolve(
            xbc, mamba2_scan.tails_of(start, shape), plan, self.taps, self.conv_bias
        )
        conv = self._tiled(F.silu, conv.to(x.dtype)).float()  # [T, conv_dim]
        xs, b_in, c_out = conv.split([shape.inner_size, *(2 * [shape.num_groups * shape.state_size])],
                                     dim=-1)  # fmt: skip
        # 2. The scan, token by token, from each sequence's state.
        dt = self._tiled(self._time_steps, dt.contiguous()).float()  # [T, heads]
        decay = self._tiled(torch.exp, dt * self.decay_rate)  # [T, heads]
        heads = xs.reshape(num_tokens, shape.num_heads, shape.head_dim)
        if recurrent_available():
            grouped = (num_tokens, shape.num_groups, shape.state_size)
            y = self._scan_native(heads, dt, decay, b_in.reshape(grouped),
                                  c_out.reshape(grouped), cache, plan, ext, attn)  # fmt: skip
        else:
            y, states = mamba2_scan.scan(
                heads, dt, decay, self._per_head(b_in), self._per_head(c_out),
                mamba2_scan.ssm_of(start, shape).clone(), plan,
            )  # fmt: skip
            self._store(cache, plan, ext, states, attn)
        y = y + heads * self.d_skip.float()[:, None]  # [T, heads, head_dim]
        # 3. Gated RMSNorm per group, then out_proj.
        gated = y.reshape(num_tokens, -1) * self._tiled(F.silu, z.float().contiguous())
        normed = self.group_norm(gated.view(-1, shape.inner_size // shape.num_groups))
        out = normed.view(num_tokens, -1) * self.gated_norm_weight.float()
        return self.o_proj(out.to(x.dtype))

    def _scan_native(
        self, heads: Tensor, dt: Tensor, decay: Tensor, b_in: Tensor, c_out: Tensor,
        cache: Tensor, plan: mamba2_scan.MambaPlan, ext: Tensor, attn: AttentionMetadata,
    ) -> Tensor:  # fmt: skip
        """The scan on mamba_scan.c, which writes the states' SSM parts (the
        slots, snapshots and kept rows); then their conv tails."""
        kept = mamba2_scan.new_kept(cache, plan)
        ssm = self.shape.conv_numel
        y = mamba_scan(heads, dt, decay, b_in, c_out, mamba2_scan.recurrent_rows(plan),
                       cache[:, ssm:], None if kept is None else kept[:, ssm:])  # fmt: skip
        mamba2_scan.store_tails(cache, plan, ext, self.shape.conv_kernel, kept)
        if kept is not None:
            assert attn.sequence_states is not None, "verification runs with sequence states"
            attn.sequence_states.on_roll_back(functools.partial(_roll_back, cache, plan, kept))
        return y

    def _time_steps(self, dt: Tensor) -> Tensor:  # [tile, heads] -> dt after softplus, clamped
        dt = F.softplus(dt + self.dt_bias)
        if self.shape.dt_min > 0.0 or self.shape.dt_max != float("inf"):
            dt = dt.clamp(self.shape.dt_min, self.shape.dt_max)
        return dt

    def _per_head(self, grouped: Tensor) -> Tensor:  # [T, G N] -> [T, heads, N]
        shape = self.shape
        per_group = grouped.reshape(grouped.shape[0], shape.num_groups, shape.state_size)
        return per_group.repeat_interleave(shape.num_heads // shape.num_groups, dim=1)

    def _tiled(self, function: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        """`function` on fixed row tiles where the model is row-invariant (its
        vectorised and scalar loops may round differently)."""
        if self.row_tile is None:
            return function(x)
        return in_row_tiles(function, x, self.row_tile)

    def _store(
        self,
        cache: Tensor,
        plan: mamba2_scan.MambaPlan,
        ext: Tensor,
        states: dict[tuple[int, int], Tensor],
        attn: AttentionMetadata,
    ) -> None:
        """Write the slots and snapshots; keep the verifying sequences' states."""
        kept = mamba2_scan.store_states(cache, plan, ext, states, self.shape.conv_kernel)
        if kept is not None:
            assert attn.sequence_states is not None, "verification runs with sequence states"
            attn.sequence_states.on_roll_back(functools.partial(_roll_back, cache, plan, kept))


def _roll_back(
    cache: Tensor, plan: mamba2_scan.MambaPlan, kept: Tensor, num_kept: dict[int, int]
) -> None:
    """Sequence b's slot holds its state after its first `num_kept[b]` tokens."""
    for b, m in num_kept.items():
        slot_row, offset = plan.kept[b]
        cache[slot_row] = kept[offset + m]
