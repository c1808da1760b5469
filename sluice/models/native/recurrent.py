"""The hybrids' recurrences on the native kernels: Qwen3.5's gated delta rule
(gated_delta.c) and Mamba-2's selective scan (mamba_scan.c).

Both run token by token, per sequence and head, inside one call for the
whole step, reading and writing the per-sequence states in the layer's cache
rows. `RecurrentRows` says where: per sequence its first token, its number
of tokens and the row its state starts from (None: zeros), and the saves:
(sequence, m, target) copies the state after its first m tokens to cache row
`target`, or, for `Kept(k)`, to row k of the kept buffer (a verifying
sequence's states, for roll-back). The kernels check every row against the
buffers' sizes and refuse (an AssertionError here) rather than write past one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from sluice.models.native import _library


@dataclass(frozen=True, slots=True)
class Kept:
    """Row `row` of the kept buffer (not of the cache)."""

    row: int


@dataclass(slots=True)
class RecurrentRows:
    """Where each sequence's state starts and which states are copied where."""

    # Per sequence: (first token, number of tokens, start row or None for zeros).
    spans: list[tuple[int, int, int | None]] = field(default_factory=list)
    # (sequence, m, cache row or Kept), any order (sorted when passed).
    saves: list[tuple[int, int, int | Kept]] = field(default_factory=list)

    def arrays(self) -> tuple[Tensor, Tensor]:
        """The kernels' int64 [num_seqs, 3] spans and [num_saves, 3] saves."""
        spans = [(first, count, -1 if row is None else row) for first, count, row in self.spans]
        saves = sorted(
            (seq, m, -1 - target.row if isinstance(target, Kept) else target)
            for seq, m, target in self.saves
        )
        as_tensor = lambda rows: torch.tensor(rows, dtype=torch.int64).view(-1, 3)  # noqa: E731
        return as_tensor(spans), as_tensor(saves)


def recurrent_available() -> bool:
    """Whether the kernels run here (the native library built)."""
    return _library() is not None


def _rows_args(
    rows: RecurrentRows, states: Tensor, kept: Tensor | None, num_tokens: int
) -> tuple[tuple[Tensor, Tensor], list]:
    """The kernels' common arguments (spans, saves and the two row buffers, in
    the C order) and the index tensors they point into (kept alive)."""
    assert all(first + count <= num_tokens for first, count, _ in rows.spans), "a span past T"
    assert states.dtype == torch.float32 and states.stride(1) == 1, "float32 state rows"
    spans, saves = rows.arrays()
    kept_rows = 0 if kept is None else kept.shape[0]
    if kept is not None:
        assert kept.dtype == torch.float32 and kept.stride(1) == 1, "float32 kept rows"
    kept_ptr, kept_stride = (None, 0) if kept is None else (kept.data_ptr(), kept.stride(0))
    args = [spans.data_ptr(), spans.shape[0], saves.data_ptr(), saves.shape[0], states.data_ptr(),
            states.shape[0], states.stride(0), kept_ptr, kept_rows, kept_stride]  # fmt: skip
    return (spans, saves), args


def gated_delta_rule(
    # conv [T, 2 Hk dk + Hv dv] (its output before silu), z [T, Hv dv], b and a [T, Hv]
    inputs: tuple[Tensor, Tensor, Tensor, Tensor],
    weights: tuple[Tensor, Tensor, Tensor],  # -exp(A_log) [Hv], dt_bias [Hv], norm weight [dv]
    rows: RecurrentRows,
    states: Tensor,  # [rows, >= Hv dk dv] float32 (a view of the cache's state columns)
    kept: Tensor | None,  # [K, Hv dk dv] float32, or None
    heads: tuple[int, int, int, int],  # Hk, Hv, dk, dv
    eps: float,
    round_bf16: bool,
) -> Tensor:  # [T, Hv dv] float32 (rounded to bfloat16 values where round_bf16)
    library = _library()
    assert library is not None, "gated_delta_rule needs the native library"
    num_k_heads, num_v_heads, dk, dv = heads
    conv, z, b, a = (t.float().contiguous() for t in inputs)
    neg_a, dt_bias, norm = (w.float().contiguous() for w in weights)
    assert conv.shape[1] == 2 * num_k_heads * dk + num_v_heads * dv and norm.shape == (dv,)
    out = torch.empty(conv.shape[0], num_v_heads * dv, dtype=torch.float32)
    _alive, rows_args = _rows_args(rows, states, kept, conv.shape[0])
    status = library.gated_delta_rule_f32(
        conv.data_ptr(), z.data_ptr(), b.data_ptr(), a.data_ptr(), neg_a.data_ptr(),
        dt_bias.data_ptr(), norm.data_ptr(), *rows_args,
        num_k_heads, num_v_heads, dk, dv, eps, int(round_bf16), out.data_ptr(),
    )  # fmt: skip
    assert status == 0, "gated_delta_rule refused its rows or shapes"
    return out


def mamba_scan(
    x: Tensor,  # [T, heads, head_dim] float32
    dt: Tensor,  # [T, heads] float32
    decay: Tensor,  # [T, heads] float32
    b_in: Tensor,  # [T, groups, N] float32
    c_out: Tensor,  # [T, groups, N] float32
    rows: RecurrentRows,
    states: Tensor,  # [rows, >= heads head_dim N] float32
    kept: Tensor | None,  # [K, >= heads head_dim N] float32, or None
) -> Tensor:  # y [T, heads, head_dim] float32
    library = _library()
    assert library is not None, "mamba_scan needs the native library"
    x, dt, decay, b_in, c_out = (t.float().contiguous() for t in (x, dt, decay, b_in, c_out))
    num_tokens, num_heads, head_dim = x.shape
    num_groups, state_size = b_in.shape[1:]
    y = torch.empty_like(x)
    _alive, rows_args = _rows_args(rows, states, kept, num_tokens)
    status = library.mamba_scan_f32(
        x.data_ptr(), dt.data_ptr(), decay.data_ptr(), b_in.data_ptr(), c_out.data_ptr(),
        *rows_args, num_heads, head_dim, num_groups, state_size,
        y.data_ptr(),
    )  # fmt: skip
    assert status == 0, "mamba_scan refused its rows or shapes"
    return y


def roll_back_rows(
    rows: Tensor, kept: Tensor, kept_at: dict[int, tuple[int, int]], num_kept: dict[int, int]
) -> None:
    """Sequence b's live state back to its state after its first num_kept[b]
    tokens: kept_at[b] = (its slot row in `rows`, where its kept rows start)."""
    for b, m in num_kept.items():
        slot_row, offset = kept_at[b]
        rows[slot_row] = kept[offset + m]
