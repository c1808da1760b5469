"""One step of Mamba-2's sequence mixing over the per-sequence states: the
causal depthwise convolution with its tail (`convolve`) and the selective
scan (`scan`), and where the step reads and writes the states (`MambaPlan`).

The scan is Mamba-2's recurrence, token by token in position order, per head
h with its scalar decay A_h = -exp(A_log_h):

    state_t = exp(dt_t A_h) * state_{t-1} + (dt_t B_t) x_t      [head_dim, N]
    y_t     = state_t . C_t + D_h x_t

with dt_t = softplus(dt_raw + dt_bias) clamped to the time-step limit, and B,
C shared by the heads of a group. The state is float32 throughout; each
token's update is elementwise multiplies and adds, and `state . C` sums the
N products in a fixed halving order, so a token's output and its sequence's
state depend on that sequence's own tokens only: not on how a prompt is cut
into chunks (the state carried between steps is the very float32 value the
next token would have seen), nor on which rows share the step.
Transcendentals (exp, softplus, silu) run on fixed row tiles where the model
is row-invariant, as every activation of the decoder does.

The layer runs the scan on native/mamba_scan.c (`recurrent_rows` gives it
the plan; it sums `state . C` in 16 lane partials, its own fixed order),
one call per step with every token in C; `scan` here is the same recurrence
in torch, for where the native library is off. Neither takes the chunked
SSD form, which sums in an order that depends on where chunks fall.

States in the layer's cache (sluice/models/mamba2_config.py) are read at
the step's start (zeros at position 0, the slot while a sequence continues,
the snapshot at its context's last block after a prefix hit) and written
after it: the slot after the sequence's last token, the snapshot of every
KV block whose end the step crossed, and for a sequence verifying drafts
the state after each of its tokens, kept so that `SequenceStates.roll_back`
can set the slot to the state after the accepted ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from sluice.models.attention import AttentionMetadata
from sluice.models.mamba2_config import MambaShape
from sluice.models.native.recurrent import Kept, RecurrentRows


@dataclass(slots=True)
class MambaPlan:
    """Host-side index lists of one step for every Mamba layer (built per layer)."""

    # Per sequence: the cache row its state starts from, and whether at zeros.
    sources: list[int]
    zeros: list[bool]
    # Per sequence: its first flat token row and its number of new tokens.
    token_starts: list[int]
    query_lens: list[int]
    # Per sequence: (m, cache row) for each state after m of its tokens the
    # cache keeps: its slot (m = all) and the snapshots at block ends crossed.
    writes: list[list[tuple[int, int]]]
    # Per sequence that verifies drafts: (its slot row, where its kept states start).
    kept: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def num_kept_states(self) -> int:
        return sum(self.query_lens[b] + 1 for b in self.kept)


def build_plan(attn: AttentionMetadata, num_rows: int) -> MambaPlan:
    states = attn.sequence_states
    assert states is not None, "a Mamba layer needs the step's sequence states"
    keeps = states.keeps_inputs or [False] * len(attn.query_lens)
    block_size = attn.block_size
    plan = MambaPlan([], [], [], list(attn.query_lens), [])
    token_start = num_kept = 0
    for b, (q, seq_len, table) in enumerate(
        zip(attn.query_lens, attn.seq_lens_list, attn.block_table_lists, strict=True)
    ):
        c = seq_len - q
        slot_row = num_rows - 1 - states.slots[b]
        source = slot_row
        if states.starts[b] and c > 0:
            assert states.has_snapshots, "a state past position 0 starts from a snapshot"
            assert c % block_size == 0, f"a state starting at {c} is not at a block's end"
            source = table[c // block_size - 1]
        plan.sources.append(source)
        plan.zeros.append(c == 0)
        plan.token_starts.append(token_start)
        writes = [(q, slot_row)]
        if states.has_snapshots:
            ends = range((c // block_size + 1) * block_size, c + q + 1, block_size)
            writes += [(end - c, table[end // block_size - 1]) for end in ends]
        plan.writes.append(writes)
        if keeps[b]:
            plan.kept[b] = (slot_row, num_kept)
            num_kept += q + 1
        token_start += q
    return plan


def start_states(cache: Tensor, plan: MambaPlan) -> Tensor:  # -> [B, numel] float32
    index = torch.tensor(plan.sources, dtype=torch.int64, device=cache.device)
    start = cache.index_select(0, index)  # a copy: zeroing it leaves the cache alone
    for b, is_zero in enumerate(plan.zeros):
        if is_zero:
            start[b].zero_()
    return start


def convolve(
    xbc: Tensor,  # [T, conv_dim], the model dtype
    tails: Tensor,  # [B, L - 1, conv_dim] float32: each sequence's last inputs
    plan: MambaPlan,
    taps: Tensor,  # [L, conv_dim]
    bias: Tensor | None,  # [conv_dim]
) -> tuple[Tensor, Tensor]:  # ([T, conv_dim] float32 before the bias, ext)
    """Each token's L taps over its sequence's tail and tokens, summed in tap
    order in float32; `ext` [rows, conv_dim] lays each sequence's tail, then
    its tokens, end to end (the tail after m tokens: rows m .. m + L - 2)."""
    num_tail = tails.shape[1]
    rows: list[Tensor] = []
    firsts: list[int] = []
    for b, (start, q) in enumerate(zip(plan.token_starts, plan.query_lens, strict=True)):
        rows += [tails[b], xbc[start : start + q].float()]
        offset = b * num_tail + start
        firsts += range(offset, offset + q)
    ext = torch.cat(rows)  # [B (L - 1) + T, conv_dim]
    first = torch.tensor(firsts, dtype=torch.int64, device=xbc.device)  # [T]
    out = ext.index_select(0, first) * taps[0].float()
    for j in range(1, taps.shape[0]):
        out.add_(ext.index_select(0, first + j) * taps[j].float())
    if bias is not None:
        out.add_(bias.float())
    return out, ext


def scan(
    x: Tensor,  # [T, heads, head_dim] float32
    dt: Tensor,  # [T, heads] float32, after softplus and clamp
    decay: Tensor,  # [T, heads] float32: exp(dt A)
    b_in: Tensor,  # [T, heads, N] float32
    c_out: Tensor,  # [T, heads, N] float32
    states: Tensor,  # [B, heads, head_dim, N] float32: each sequence's start; updated
    plan: MambaPlan,
) -> tuple[Tensor, dict[tuple[int, int], Tensor]]:
    """y [T, heads, head_dim] float32 (before the D skip), and the states the
    plan keeps: (sequence, m) -> its [heads, head_dim, N] state after m tokens."""
    y = torch.empty_like(x)
    wanted = _wanted_states(plan)
    kept = {(b, m): states[b].clone() for b, m in wanted.get(0, ())}
    for i in range(max(plan.query_lens, default=0)):
        active = [b for b, q in enumerate(plan.query_lens) if q > i]
        rows = torch.tensor([plan.token_starts[b] + i for b in active], device=x.device)
        every = len(active) == len(plan.query_lens)
        seqs = None if every else torch.tensor(active, device=x.device)
        state = states if seqs is None else states.index_select(0, seqs)  # [n, H, P, N]
        dt_b = (dt[rows][:, :, None] * b_in[rows])[:, :, None, :]  # [n, H, 1, N]
        state = state * decay[rows][:, :, None, None] + dt_b * x[rows][..., None]
        y[rows] = _sum_last(state * c_out[rows][:, :, None, :])  # [n, H, P]
        if seqs is None:
            states = state
        else:
            states[seqs] = state
        for b, m in wanted.get(i + 1, ()):
            kept[(b, m)] = states[b].clone()
    return y, kept


def _wanted_states(plan: MambaPlan) -> dict[int, list[tuple[int, int]]]:
    """Step index i -> the (sequence, m) whose state after m = i tokens is kept."""
    wanted: dict[int, list[tuple[int, int]]] = {}
    for b, writes in enumerate(plan.writes):
        ms = {m for m, _ in writes}
        if b in plan.kept:
            ms |= set(range(plan.query_lens[b] + 1))
        for m in sorted(ms):
            wanted.setdefault(m, []).append((b, m))
    return wanted


def _sum_last(x: Tensor) -> Tensor:  # [..., N] -> [...]
    """The sum over the last dim by halving (elementwise adds in a fixed
    order): the same bits whatever the leading dims hold."""
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        odd = x[..., 2 * half :]
        x = x[..., :half] + x[..., half : 2 * half]
        if odd.shape[-1]:
            x = torch.cat((x[..., :1] + odd, x[..., 1:]), dim=-1)
    return x[..., 0]


def store_states(
    cache: Tensor,  # [rows, numel]
    plan: MambaPlan,
    ext: Tensor,  # [B (L - 1) + T, conv_dim] float32 (`convolve`)
    ssm_states: dict[tuple[int, int], Tensor],  # (sequence, m) -> [H, P, N] (`scan`)
    kernel: int,
) -> Tensor | None:
    """Write the slots and snapshots the plan names into `cache` [rows, numel];
    return the kept states [K, numel] of the verifying sequences (None: none
    verifies)."""
    kept = new_kept(cache, plan)
    store_tails(cache, plan, ext, kernel, kept)
    num_tail = (kernel - 1) * ext.shape[1]
    for b, writes in enumerate(plan.writes):
        for m, target in writes:
            cache[target, num_tail:] = ssm_states[(b, m)].reshape(-1)
    for b, (_, offset) in plan.kept.items():
        for m in range(plan.query_lens[b] + 1):
            assert kept is not None, "a verifying sequence has kept rows"
            kept[offset + m, num_tail:] = ssm_states[(b, m)].reshape(-1)
    return kept


def new_kept(cache: Tensor, plan: MambaPlan) -> Tensor | None:
    """The verifying sequences' kept rows [K, numel] (None: none verifies)."""
    return cache.new_empty(plan.num_kept_states, cache.shape[1]) if plan.kept else None


def store_tails(
    cache: Tensor, plan: MambaPlan, ext: Tensor, kernel: int, kept: Tensor | None
) -> None:
    """The conv tails of the states the plan writes and keeps (each row's
    first (L - 1) conv_dim values)."""
    num_tail = kernel - 1

    def put(dest: Tensor, b: int, m: int) -> None:  # dest [numel] <- the tail after m tokens
        first = b * num_tail + plan.token_starts[b] + m
        tail = ext[first : first + num_tail].reshape(-1)
        dest[: tail.numel()] = tail

    for b, writes in enumerate(plan.writes):
        for m, target in writes:
            put(cache[target], b, m)
    for b, (_, offset) in plan.kept.items():
        assert kept is not None, "a verifying sequence has kept rows"
        for m in range(plan.query_lens[b] + 1):
            put(kept[offset + m], b, m)


def recurrent_rows(plan: MambaPlan) -> RecurrentRows:
    """The plan as the native scan's spans and saves (mamba_scan.c)."""
    rows = RecurrentRows()
    for b, (start, q) in enumerate(zip(plan.token_starts, plan.query_lens, strict=True)):
        rows.spans.append((start, q, None if plan.zeros[b] else plan.sources[b]))
        rows.saves += [(b, m, row) for m, row in plan.writes[b]]
    for b, (_, offset) in plan.kept.items():
        rows.saves += [(b, m, Kept(offset + m)) for m in range(plan.query_lens[b] + 1)]
    return rows


def tails_of(start: Tensor, shape: MambaShape) -> Tensor:  # [B, numel] -> [B, L - 1, conv_dim]
    return start[:, : shape.conv_numel].view(-1, shape.conv_kernel - 1, shape.conv_dim)


def ssm_of(start: Tensor, shape: MambaShape) -> Tensor:  # [B, numel] -> [B, H, P, N]
    return start[:, shape.conv_numel :].reshape(
        -1, shape.num_heads, shape.head_dim, shape.state_size
    )
