"""The shape of a model's Mamba-2 layers and of the state each keeps per
sequence: `MambaShape`, `MambaDecoderConfig`.

A Mamba-2 layer (sluice/models/mamba2.py) carries, per sequence, two things
instead of a growing K/V history: the conv tail (the last `kernel - 1`
inputs of its causal depthwise convolution, `conv_dim` channels each) and
the SSM state (`[num_heads, head_dim, state_size]`). Both are kept in one
float32 row per sequence (the tail, then the state, flattened): the tail's
values are the model dtype's, so float32 holds them exactly, and the SSM
state is carried in float32 from token to token. A layer's cache is
`[num_snapshots + num_slots, numel]` rows, laid out as a conv layer's
(sluice/models/sequence_state.py): a snapshot per KV block, then the live
slots from the last row down.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sluice.models.decoder_config import MAMBA, DecoderConfig
from sluice.models.zero_pages import zeros_on_touch

# The state's dtype whatever the model's (module docstring).
STATE_DTYPE = torch.float32


@dataclass(frozen=True, slots=True)
class MambaShape:
    """One Mamba-2 mixer's sizes, as transformers' Mamba2 / GraniteMoeHybrid name them."""

    # expand * hidden: the width of x, z and the gated norm (mamba_expand).
    inner_size: int
    num_heads: int  # mamba_n_heads
    head_dim: int  # mamba_d_head: inner_size = num_heads * head_dim
    state_size: int  # mamba_d_state (N)
    num_groups: int  # mamba_n_groups: B and C are per group, heads share them
    conv_kernel: int  # mamba_d_conv
    conv_bias: bool  # mamba_conv_bias
    proj_bias: bool  # mamba_proj_bias: in_proj and out_proj carry a bias
    # softplus(dt + dt_bias) is clamped into [dt_min, dt_max] (time_step_limit).
    dt_min: float = 0.0
    dt_max: float = float("inf")

    @property
    def conv_dim(self) -> int:
        """Channels the convolution sees: x, then B, then C."""
        return self.inner_size + 2 * self.num_groups * self.state_size

    @property
    def projection_size(self) -> int:
        """in_proj's rows: z (the gate), x B C, dt."""
        return self.inner_size + self.conv_dim + self.num_heads

    @property
    def conv_numel(self) -> int:
        return (self.conv_kernel - 1) * self.conv_dim

    @property
    def ssm_numel(self) -> int:
        return self.num_heads * self.head_dim * self.state_size

    @property
    def state_numel(self) -> int:
        """Values in one sequence's state row (the tail, then the SSM state)."""
        return self.conv_numel + self.ssm_numel


@dataclass(frozen=True, slots=True)
class MambaDecoderConfig(DecoderConfig):
    """A decoder some of whose layers (`layer_types` MAMBA) are Mamba-2 mixers."""

    mamba: MambaShape | None = None


def mamba_layer_indices(config: DecoderConfig) -> list[int]:
    return [i for i, kind in enumerate(config.layer_types) if kind == MAMBA]


def mamba_shape(config: DecoderConfig) -> MambaShape:
    assert isinstance(config, MambaDecoderConfig) and config.mamba is not None, (
        "a Mamba layer needs a MambaDecoderConfig with its shape"
    )
    return config.mamba


def mamba_state_bytes(config: DecoderConfig) -> int:
    """Bytes one sequence's state (or one block's snapshot) costs over every Mamba layer."""
    indices = mamba_layer_indices(config)
    if not indices:
        return 0
    return len(indices) * mamba_shape(config).state_numel * STATE_DTYPE.itemsize


def allocate_mamba_state(config: DecoderConfig, num_rows: int, device) -> Tensor:
    """One Mamba layer's zeroed `[num_rows, numel]` float32 state rows."""
    return zeros_on_touch((num_rows, mamba_shape(config).state_numel), STATE_DTYPE, device)
