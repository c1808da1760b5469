"""LFM2's short gated convolution layer: `ShortConvLayer`.

In place of attention, the layer projects its normed input into three
streams B, C and x (one `[hidden, 3 hidden]` matrix, kept as the layer's
`qkv_proj` so that quantization and calibration treat it as any layer's
input matrix; `o_proj` is its output projection), convolves B * x causally
over the last `L` positions of its own sequence, channel by channel, and
gates the result by C. The MLP half is the decoder's (SwiGLU).

What the convolution needs of earlier positions is the state
(sluice/models/sequence_state.py): the last `L - 1` values of B * x. A step
lays each sequence's state and its new rows end to end (`ext`), sums the
`L` taps of every token in a fixed order (elementwise: a row's result never
depends on its neighbours), and writes back the state after the step, the
snapshots at block ends it crossed, and (verifying drafts) its inputs.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from sluice.models.attention import AttentionMetadata
from sluice.models.decoder_config import DecoderConfig
from sluice.models.linear import Linear, uninitialised_weight
from sluice.models.llama import LlamaDecoderLayer
from sluice.models.rope_norm import Float32Angles, RopeAngles
from sluice.models.sequence_state import ConvPlan, SequenceStates
from sluice.models.weight_targets import WeightTarget


class ShortConvLayer(LlamaDecoderLayer):
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
        hidden = config.hidden_size
        p = {"dtype": dtype, "device": device, "row_tile": self.row_tile}
        # Rows: B, then C, then x (transformers' in_proj).
        self.qkv_proj = Linear(hidden, 3 * hidden, config.conv_bias, **p)
        self.o_proj = Linear(hidden, hidden, config.conv_bias, **p)
        self.q_norm = self.k_norm = None
        self.kernel_size = config.conv_kernel_size
        # [hidden, L], as llama.cpp stores it (transformers' [hidden, 1, L]
        # squeezed as it loads: lfm2.py); `taps` is its [L, hidden] copy.
        self.conv_weight = uninitialised_weight(hidden, self.kernel_size, dtype=dtype,
                                                device=device)  # fmt: skip
        self.conv_bias = None
        if config.conv_bias:
            self.conv_bias = uninitialised_weight(hidden, dtype=dtype, device=device)

    def finish_loading(self) -> None:
        super().finish_loading()
        self.taps = self.conv_weight.t().contiguous()  # [L, hidden]

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """transformers' names of the convolution's tensors (LFM2's `conv.*`)."""
        targets = {
            prefix + "conv.in_proj.weight": WeightTarget(self.qkv_proj.weight),
            prefix + "conv.out_proj.weight": WeightTarget(self.o_proj.weight),
            prefix + "conv.conv.weight": WeightTarget(self.conv_weight),
        }
        biases = (self.qkv_proj.bias, self.o_proj.bias, self.conv_bias)
        for name, bias in zip(("in_proj", "out_proj", "conv"), biases, strict=True):
            if bias is not None:
                targets[f"{prefix}conv.{name}.bias"] = WeightTarget(bias)
        return targets

    def forward(
        self,
        hidden: Tensor,  # [T, hidden], updated in place (the residual stream)
        rope: RopeAngles | Float32Angles,
        kv_cache: Tensor,  # [num_blocks + num_slots, L - 1, hidden]: this layer's states
        attn: AttentionMetadata,
    ) -> Tensor:
        hidden += self._convolve(self.attention_norm(hidden), kv_cache, attn)
        hidden += self._mlp(self.mlp_norm(hidden))
        return hidden

    def _convolve(self, x: Tensor, cache: Tensor, attn: AttentionMetadata) -> Tensor:
        states = attn.sequence_states
        assert states is not None, "a conv layer needs the step's sequence states"
        context_lens = [s - q for s, q in zip(attn.seq_lens_list, attn.query_lens, strict=True)]
        plan = states.conv_plan(
            attn.query_lens, context_lens, attn.block_table_lists, attn.block_size,
            cache.shape[0], cache.shape[1], x.device,
        )  # fmt: skip
        b_gate, c_gate, inputs = self.qkv_proj(x).chunk(3, dim=-1)  # [T, hidden] each
        ext = lay_out_conv_inputs(b_gate * inputs, cache, plan)  # [num_ext_rows, hidden]
        conv = conv_taps_sum(ext, plan.first_taps, self.taps, self.conv_bias)  # [T, hidden]
        store_conv_states(ext, cache, plan, states)
        return self.o_proj(c_gate * conv)


def lay_out_conv_inputs(gated: Tensor, cache: Tensor, plan: ConvPlan) -> Tensor:
    """Each sequence's starting state, then its new rows: `ext` [rows, hidden]."""
    hidden = cache.shape[2]
    start = cache.index_select(0, plan.start_sources)  # [B, L - 1, hidden]
    start = start.masked_fill(plan.starts_at_zero, 0.0)
    ext = gated.new_empty(plan.num_ext_rows, hidden)
    ext[plan.start_rows] = start.view(-1, hidden).to(gated.dtype)
    ext[plan.token_rows] = gated
    return ext


def conv_taps_sum(ext: Tensor, first_taps: Tensor, taps: Tensor, bias: Tensor | None) -> Tensor:
    """Token t's output: sum over j of taps[j] * ext[first_taps[t] + j], in j's
    order, accumulated in float32 (as transformers' conv1d does)."""
    out = None
    for j in range(taps.shape[0]):
        term = ext.index_select(0, first_taps + j).float() * taps[j].float()  # [T, hidden]
        out = term if out is None else out.add_(term)
    assert out is not None, "a convolution has at least one tap"
    if bias is not None:
        out.add_(bias.float())
    return out.to(ext.dtype)


def store_conv_states(ext: Tensor, cache: Tensor, plan: ConvPlan, states: SequenceStates) -> None:
    """Write each sequence's state after its tokens into its slot, the
    snapshots at the block ends the step crossed, and the kept inputs."""
    num_state_rows, hidden = cache.shape[1], cache.shape[2]
    ends = ext.index_select(0, plan.end_rows).view(-1, num_state_rows, hidden)
    cache.index_copy_(0, plan.end_targets, ends.to(cache.dtype))
    if plan.snapshot_targets.numel():
        snapshots = ext.index_select(0, plan.snapshot_rows).view(-1, num_state_rows, hidden)
        cache.index_copy_(0, plan.snapshot_targets, snapshots.to(cache.dtype))
    states.keep(cache, ext)
