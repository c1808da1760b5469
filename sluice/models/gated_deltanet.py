"""Qwen3.5's Gated DeltaNet layer (linear attention): `GatedDeltaNetLayer`.

In place of attention, the layer projects its normed input into q/k/v (one
stream of `conv_dim` channels), the output gate z and, per value head, the
write strength b and the decay a (one matrix, the layer's `qkv_proj`, rows
in that order). q/k/v go through a causal depthwise convolution of kernel
`L` and SiLU (the conv tail of `L - 1` inputs is LFM2's machinery:
short_conv.py's functions over the same `ConvPlan`), then the gated delta
rule runs token by token per value head over a `[key dim, value dim]` state
S, in float32, as transformers' `torch_recurrent_gated_delta_rule`:

    q, k <- l2norm(q), l2norm(k);  q <- q / sqrt(key dim)
    S <- S * exp(g),  g = -exp(A_log) * softplus(a + dt_bias)
    S <- S + k (x) (v - S^T k) * sigmoid(b)
    o  = S^T q

and o is RMS-normed per head, times its weight and SiLU(z), into o_proj.

Exactness: every token's update is the same ops in the same order, one
sequence and one token at a time, so a sequence's state and outputs are
bitwise the same whatever the chunking of its prompt, its neighbours in the
step, a prefix-cache hit (the snapshot was written by the same ops) or
verified drafts. The step's sequences and heads run in one call of
native/gated_delta.c (from the silu of the conv to the gated norm, the model
dtype's roundings included); where the native library is off, the same
recurrence runs as about 30 small torch ops per token per layer (`_in_torch`;
not the kernel's bits, which sum in another fixed order).

The per-sequence state is one float32 row per slot or KV block
(sequence_state.py): the conv tail, then S for every value head.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from sluice.models.attention import AttentionMetadata
from sluice.models.decoder_config import DecoderConfig
from sluice.models.linear import Linear, uninitialised_weight
from sluice.models.llama import LlamaDecoderLayer
from sluice.models.native.recurrent import (
    Kept,
    RecurrentRows,
    gated_delta_rule,
    recurrent_available,
    roll_back_rows,
)
from sluice.models.rope_norm import Float32Angles, RopeAngles
from sluice.models.sequence_state import SequenceStates, linear_state_sizes
from sluice.models.short_conv import conv_taps_sum, lay_out_conv_inputs, store_conv_states
from sluice.models.weight_targets import WeightTarget

# transformers' l2norm epsilon (FLA's), inside the square root.
_L2NORM_EPS = 1e-6


@dataclass(slots=True)
class _Span:
    """One sequence's tokens in the step and the state rows it reads and writes."""

    first_token: int  # flat index of its first new token
    num_tokens: int
    source_row: int | None  # the cache row its state starts from; None: zeros
    slot_row: int  # its live state
    # (tokens of the step before a block end, that block's snapshot row)
    snapshots: list[tuple[int, int]]
    keeps: bool  # verifies drafts: every state of the step kept for roll-back


class GatedDeltaNetLayer(LlamaDecoderLayer):
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
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.key_head_dim = config.linear_key_head_dim
        self.value_head_dim = config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.key_head_dim
        self.value_dim = self.num_v_heads * self.value_head_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.kernel_size = config.conv_kernel_size
        self.conv_state_numel = linear_state_sizes(config)[0]
        hidden = config.hidden_size
        p = {"dtype": dtype, "device": device, "row_tile": self.row_tile}
        # Rows: q, k, v (the conv's channels), z, b, a (transformers' in_proj_qkv/z/b/a).
        rows = self.conv_dim + self.value_dim + 2 * self.num_v_heads
        self.qkv_proj = Linear(hidden, rows, False, **p)
        self.o_proj = Linear(self.value_dim, hidden, False, **p)
        self.q_norm = self.k_norm = None
        # [conv_dim, L] (transformers' [conv_dim, 1, L] squeezed as it loads).
        self.conv_weight = uninitialised_weight(self.conv_dim, self.kernel_size, dtype=dtype,
                                                device=device)  # fmt: skip
        # Per value head, in float32 as transformers computes g.
        self.A_log = uninitialised_weight(self.num_v_heads, dtype=torch.float32, device=device)
        self.dt_bias = uninitialised_weight(self.num_v_heads, dtype=torch.float32, device=device)
        self.gated_norm = uninitialised_weight(self.value_head_dim, dtype=dtype, device=device)

    def finish_loading(self) -> None:
        super().finish_loading()
        self.taps = self.conv_weight.t().contiguous()  # [L, conv_dim]
        self.neg_a = -self.A_log.exp()  # [Hv], as transformers' -A_log.float().exp()

    def weight_targets(self, prefix: str) -> dict[str, WeightTarget]:
        """transformers' names of the layer's own tensors (`linear_attn.*`)."""
        qkv = self.qkv_proj.weight
        z_end = self.conv_dim + self.value_dim
        rows = {"in_proj_qkv": (0, self.conv_dim), "in_proj_z": (self.conv_dim, z_end),
                "in_proj_b": (z_end, z_end + self.num_v_heads),
                "in_proj_a": (z_end + self.num_v_heads, z_end + 2 * self.num_v_heads)}  # fmt: skip
        stem = prefix + "linear_attn."
        targets = {f"{stem}{name}.weight": WeightTarget(qkv, a, b) for name, (a, b) in rows.items()}
        targets[stem + "out_proj.weight"] = WeightTarget(self.o_proj.weight)
        targets[stem + "conv1d.weight"] = WeightTarget(self.conv_weight)
        targets[stem + "A_log"] = WeightTarget(self.A_log)
        targets[stem + "dt_bias"] = WeightTarget(self.dt_bias)
        targets[stem + "norm.weight"] = WeightTarget(self.gated_norm)
        return targets

    def forward(
        self,
        hidden: Tensor,  # [T, hidden], updated in place (the residual stream)
        rope: RopeAngles | Float32Angles,
        kv_cache: Tensor,  # [num_blocks + num_slots, conv tail + recurrent] float32
        attn: AttentionMetadata,
    ) -> Tensor:
        hidden += self._linear_attention(self.attention_norm(hidden), kv_cache, attn)
        hidden += self._mlp(self.mlp_norm(hidden))
        return hidden

    def _linear_attention(self, x: Tensor, cache: Tensor, attn: AttentionMetadata) -> Tensor:
        states = attn.sequence_states
        assert states is not None, "a Gated DeltaNet layer needs the step's sequence states"
        num_rows, n = cache.shape[0], self.kernel_size - 1
        conv_cache = cache[:, : self.conv_state_numel].view(num_rows, n, self.conv_dim)
        recurrent = cache[:, self.conv_state_numel :].view(
            num_rows, self.num_v_heads, self.key_head_dim, self.value_head_dim
        )
        context_lens = [s - q for s, q in zip(attn.seq_lens_list, attn.query_lens, strict=True)]
        plan = states.conv_plan(
            attn.query_lens, context_lens, attn.block_table_lists, attn.block_size, num_rows, n,
            x.device,
        )  # fmt: skip
        sizes = [self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads]
        mixed, z, b, a = self.qkv_proj(x).split(sizes, dim=-1)  # [T, each]
        ext = lay_out_conv_inputs(mixed, conv_cache, plan)  # [num_ext_rows, conv_dim]
        conv = conv_taps_sum(ext, plan.first_taps, self.taps, None)  # [T, conv_dim]
        store_conv_states(ext, conv_cache, plan, states)
        spans = _spans(states, attn, context_lens, num_rows)
        if recurrent_available() and x.dtype in (torch.bfloat16, torch.float32):
            out = self._native(spans, (conv, z, b, a), cache, states)
        else:
            out = self._in_torch(spans, (conv, z, b, a), recurrent, states)
        return self.o_proj(out)

    def _native(
        self,
        spans: list[_Span],
        inputs: tuple[Tensor, Tensor, Tensor, Tensor],
        cache: Tensor,
        states: SequenceStates,
    ) -> Tensor:  # [T, value_dim]
        """Every span on gated_delta.c in one call; the kept states in one buffer."""
        rows, num_kept, kept_at = RecurrentRows(), 0, {}
        for index, span in enumerate(spans):
            rows.spans.append((span.first_token, span.num_tokens, span.source_row))
            rows.saves += [(index, span.num_tokens, span.slot_row)]
            rows.saves += [(index, m, row) for m, row in span.snapshots]
            if span.keeps:
                kept_at[index] = (span.slot_row, num_kept)
                rows.saves += [(index, m, Kept(num_kept + m)) for m in range(span.num_tokens + 1)]
                num_kept += span.num_tokens + 1
        recurrent = cache[:, self.conv_state_numel :]
        kept = recurrent.new_empty(num_kept, recurrent.shape[1]) if kept_at else None
        heads = (self.num_k_heads, self.num_v_heads, self.key_head_dim, self.value_head_dim)
        weights = (self.neg_a, self.dt_bias, self.gated_norm)
        out = gated_delta_rule(inputs, weights, rows, recurrent, kept, heads, self.eps,
                               inputs[0].dtype == torch.bfloat16)  # fmt: skip
        if kept is not None:
            states.on_roll_back(functools.partial(roll_back_rows, recurrent, kept, kept_at))
        return out.to(inputs[0].dtype)

    def _in_torch(
        self, spans: list[_Span], inputs: tuple[Tensor, ...], recurrent: Tensor,
        states: SequenceStates,
    ) -> Tensor:  # fmt: skip
        """The same recurrence as torch ops, where the native library is off."""
        conv, z, b, a = inputs
        out = z.new_empty(z.shape[0], self.value_dim)  # [T, value_dim]
        kept: dict[int, tuple[int, list[Tensor]]] = {}
        for index, span in enumerate(spans):
            seen = self._run_span(span, conv, z, b, a, recurrent, out)
            if span.keeps:
                kept[index] = (span.slot_row, seen)
        if kept:
            states.on_roll_back(lambda num_kept: _roll_back(recurrent, kept, num_kept))
        return out

    def _run_span(
        self, span: _Span, conv: Tensor, z: Tensor, b: Tensor, a: Tensor, recurrent: Tensor,
        out: Tensor,
    ) -> list[Tensor]:  # fmt: skip
        """One sequence's tokens in order; its state at each block end and
        its last into the cache; every state it passed if it keeps them."""
        if span.source_row is None:
            state = recurrent.new_zeros(recurrent.shape[1:])  # [Hv, dk, dv] float32
        else:
            state = recurrent[span.source_row].clone()
        seen = [state] if span.keeps else []
        snapshots = dict(span.snapshots)
        for m in range(span.num_tokens):
            i = span.first_token + m
            state, out[i] = self._token(conv[i], z[i], b[i], a[i], state)
            if (row := snapshots.get(m + 1)) is not None:
                recurrent[row] = state
            if span.keeps:
                seen.append(state)
        recurrent[span.slot_row] = state
        return seen

    def _token(
        self, conv: Tensor, z: Tensor, b: Tensor, a: Tensor, state: Tensor
    ) -> tuple[Tensor, Tensor]:  # [conv_dim], [value_dim], [Hv], [Hv], [Hv, dk, dv]
        """One token: the new state (a new tensor) and its [value_dim] output."""
        q, k, v = F.silu(conv).split([self.key_dim, self.key_dim, self.value_dim])
        q = q.view(self.num_k_heads, self.key_head_dim)
        k = k.view(self.num_k_heads, self.key_head_dim)
        if self.num_v_heads != self.num_k_heads:  # each q/k head serves consecutive v heads
            q = q.repeat_interleave(self.num_v_heads // self.num_k_heads, dim=0)
            k = k.repeat_interleave(self.num_v_heads // self.num_k_heads, dim=0)
        q, k = _l2norm(q.float()), _l2norm(k.float())  # [Hv, dk]
        q = q / (self.key_head_dim**0.5)
        v = v.view(self.num_v_heads, self.value_head_dim).float()  # [Hv, dv]
        beta = b.sigmoid().float()  # [Hv]
        g = self.neg_a * F.softplus(a.float() + self.dt_bias)  # [Hv]
        state = state * g.exp()[:, None, None]
        kv_memory = (state * k[:, :, None]).sum(dim=-2)  # [Hv, dv]
        delta = (v - kv_memory) * beta[:, None]
        state = state + k[:, :, None] * delta[:, None, :]
        o = (state * q[:, :, None]).sum(dim=-2).to(z.dtype)  # [Hv, dv]
        return state, self._gated_norm(o, z.view(self.num_v_heads, self.value_head_dim))

    def _gated_norm(self, o: Tensor, z: Tensor) -> Tensor:  # [Hv, dv] each -> [value_dim]
        """transformers' Qwen3NextRMSNormGated: norm before the gate."""
        x = o.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = self.gated_norm * x.to(o.dtype)
        return (x * F.silu(z.float())).to(o.dtype).reshape(-1)


def _l2norm(x: Tensor) -> Tensor:  # [H, d] float32
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + _L2NORM_EPS)


def _spans(
    states: SequenceStates, attn: AttentionMetadata, context_lens: list[int], num_rows: int
) -> list[_Span]:
    """Where each sequence of the step starts, ends and snapshots its state
    (the rows ConvPlan picks for the conv tail, sequence_state.py)."""
    spans, first = [], 0
    block_size = attn.block_size
    keeps = states.keeps_inputs or [False] * len(context_lens)
    tables = attn.block_table_lists
    for index, (q, c) in enumerate(zip(attn.query_lens, context_lens, strict=True)):
        slot_row = num_rows - 1 - states.slots[index]
        source: int | None = slot_row
        if c == 0:
            source = None
        elif states.starts[index]:
            assert c % block_size == 0, f"a state starting at {c} is not at a block's end"
            source = tables[index][c // block_size - 1]
        ends = range((c // block_size + 1) * block_size, c + q + 1, block_size)
        snapshots = [(end - c, tables[index][end // block_size - 1])
                     for end in (ends if states.has_snapshots else ())]  # fmt: skip
        spans.append(_Span(first, q, source, slot_row, snapshots, keeps[index]))
        first += q
    return spans


def _roll_back(
    recurrent: Tensor, kept: dict[int, tuple[int, list[Tensor]]], num_kept: dict[int, int]
) -> None:
    """Sequence b's live state back to its state after its first num_kept[b] tokens."""
    for index, m in num_kept.items():
        slot_row, seen = kept[index]
        recurrent[slot_row] = seen[m]
