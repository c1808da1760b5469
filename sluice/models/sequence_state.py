"""Per-sequence state of recurrent layers, beside the paged KV cache: where it
lives, and how one step reads and writes it (`SequenceStates`).

A short-convolution layer (LFM2's, sluice/models/short_conv.py) carries,
per sequence, the last `L - 1` of its conv inputs (`L` the kernel size)
instead of a growing K/V history. Its cache tensor holds two kinds of rows
(`allocate_layer_state`), `[num_blocks + num_slots, L - 1, hidden]`:

- row `b < num_blocks`: the state at the end of KV block `b`, a snapshot
  written by the step whose tokens fill the block. A prefix-cache hit that
  ends at block `b` starts its sequence from it; the snapshot is as good as
  the block's K/V, since both were computed from the same tokens (the
  block's name chains every token before it);
- the last `num_slots` rows: the live states, slot `s` at row
  `R - 1 - s` (R the number of rows), so a layer needs no count to find them.

A step's `SequenceStates` names each sequence's slot (the scheduler's
`StateSlotPool` hands them out, one per running request) and whether the
state starts this step: from zeros at position 0, else from the snapshot at
its context's end (a prefix hit, a resume after preemption). A sequence
verifying drafts (speculation) keeps its step's inputs, so that after
sampling the state rolls back to the last accepted position (`roll_back`).

A Gated DeltaNet layer (Qwen3.5's, sluice/models/gated_deltanet.py) keeps
the same kinds of rows, each one float32 vector: its conv tail
`[L - 1, conv_dim]` then its recurrent state `[value heads, key dim, value
dim]` (`linear_state_sizes`); it rolls back through `on_roll_back`.

Invariant: a sequence's state after a step depends on its own tokens only
(elementwise ops, in a fixed order), so a row's update is row-invariant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from sluice.models.decoder_config import CONV, LINEAR, MAMBA, DecoderConfig
from sluice.models.mamba2_config import allocate_mamba_state, mamba_state_bytes
from sluice.models.zero_pages import zeros_on_touch


def conv_state_rows(config: DecoderConfig) -> int:
    """Inputs a short convolution's state keeps per channel: kernel size - 1."""
    return config.conv_kernel_size - 1


def state_layer_indices(config: DecoderConfig) -> list[int]:
    """The layers that keep a per-sequence state instead of K/V."""
    return [i for i, kind in enumerate(config.layer_types) if kind in (CONV, LINEAR, MAMBA)]


def linear_state_sizes(config: DecoderConfig) -> tuple[int, int]:
    """A Gated DeltaNet layer's state, in float32 values: (its conv tail
    `[L - 1, conv_dim]`, its recurrent state `[Hv, key dim, value dim]`)."""
    key_dim = config.linear_num_key_heads * config.linear_key_head_dim
    conv_dim = 2 * key_dim + config.linear_num_value_heads * config.linear_value_head_dim
    recurrent = config.linear_num_value_heads * config.linear_key_head_dim
    return conv_state_rows(config) * conv_dim, recurrent * config.linear_value_head_dim


def state_bytes_per_sequence(config: DecoderConfig, dtype: torch.dtype) -> int:
    """Bytes one sequence's state (or one block's snapshot) costs over every state layer."""
    conv = conv_state_rows(config) * config.hidden_size * dtype.itemsize
    linear = sum(linear_state_sizes(config)) * torch.float32.itemsize
    return mamba_state_bytes(config) + sum(
        conv if config.layer_types[i] == CONV else linear
        for i in state_layer_indices(config) if config.layer_types[i] != MAMBA
    )  # fmt: skip


def allocate_layer_state(
    config: DecoderConfig, index: int, num_blocks: int, num_slots: int, dtype: torch.dtype,
    device,
) -> Tensor:  # fmt: skip
    """Layer `index`'s zeroed rows: a conv layer's `[num_blocks + num_slots,
    L - 1, hidden]` in `dtype`, a Gated DeltaNet layer's `[num_blocks +
    num_slots, conv tail + recurrent state]` in float32."""
    if config.layer_types[index] == MAMBA:  # mamba2_config.py
        return allocate_mamba_state(config, num_blocks + num_slots, device)
    if config.layer_types[index] == LINEAR:
        shape: tuple[int, ...] = (num_blocks + num_slots, sum(linear_state_sizes(config)))
        return zeros_on_touch(shape, torch.float32, device)
    shape = (num_blocks + num_slots, conv_state_rows(config), config.hidden_size)
    return zeros_on_touch(shape, dtype, device)


@dataclass(slots=True)
class ConvPlan:
    """How one step's conv inputs line up with the states (the same for every
    conv layer; built once per step). `ext` is the step's working tensor
    `[num_ext_rows, hidden]`: per sequence, its L - 1 starting rows, then its
    new tokens' rows; the state after its first m tokens is rows
    [start + m, start + m + L - 1) of its stretch."""

    # Flat ext row of every new token.
    token_rows: Tensor  # [num_tokens] int64
    # Ext rows of every sequence's starting state, sequence by sequence.
    start_rows: Tensor  # [B * (L - 1)] int64
    # The cache row each sequence's state starts from (slot or snapshot).
    start_sources: Tensor  # [B] int64
    # True where the state starts at zeros (position 0).
    starts_at_zero: Tensor  # [B, 1, 1] bool
    # Ext row of the first tap of each token's window (its L taps follow).
    first_taps: Tensor  # [num_tokens] int64
    # Ext rows of each sequence's state after its tokens, and its slot row.
    end_rows: Tensor  # [B * (L - 1)] int64
    end_targets: Tensor  # [B] int64
    # Ext rows of the states at block ends crossed this step, and their block rows.
    snapshot_rows: Tensor  # [S * (L - 1)] int64
    snapshot_targets: Tensor  # [S] int64
    # Ext rows kept for the sequences that verify drafts (their whole stretch).
    kept_rows: Tensor | None  # [K] int64
    # Where each such sequence's stretch starts in the kept rows.
    kept_offsets: dict[int, int]
    num_ext_rows: int


@dataclass(slots=True)
class SequenceStates:
    """Which state each sequence of one step reads and writes (module docstring)."""

    # Per sequence: its slot in the live rows.
    slots: list[int]
    # Per sequence: its state starts this step from the snapshot at the end of
    # its context's last block (admitted with a prefix hit). At position 0 a
    # state starts at zeros; elsewhere it continues from its slot.
    starts: list[bool]
    # Per sequence: it verifies drafts; its inputs are kept for `roll_back`.
    keeps_inputs: list[bool] = field(default_factory=list)
    # The cache has a snapshot row per KV block (prefix caching on); without
    # them no state starts past position 0 and none is written.
    has_snapshots: bool = True
    # Built by the first conv layer of the step (`conv_plan`), then shared.
    _plan: ConvPlan | None = None
    # Per conv layer: (its cache, the kept ext rows [K, hidden]) for `roll_back`.
    _kept: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    # Other layers' roll-backs (`on_roll_back`), called with `roll_back`'s argument.
    _roll_backs: list[Callable[[dict[int, int]], None]] = field(default_factory=list)

    @classmethod
    def standalone(cls, num_sequences: int) -> SequenceStates:
        """Sequence b in slot b, continuing its state from step to step, no
        prefix cache (a standalone run: calibration, scoring, tests)."""
        return cls(list(range(num_sequences)), [False] * num_sequences)

    def conv_plan(
        self, query_lens: list[int], context_lens: list[int], block_tables: list[list[int]],
        block_size: int, num_rows: int, num_state_rows: int, device,
    ) -> ConvPlan:  # fmt: skip
        if self._plan is None:
            self._plan = _build_plan(
                self, query_lens, context_lens, block_tables, block_size, num_rows,
                num_state_rows, device,
            )  # fmt: skip
        return self._plan

    def keep(self, cache: Tensor, ext: Tensor) -> None:
        """A conv layer's step inputs of the sequences that verify drafts."""
        plan = self._plan
        assert plan is not None, "keep() follows conv_plan()"
        if plan.kept_rows is not None:
            self._kept.append((cache, ext.index_select(0, plan.kept_rows)))

    def on_roll_back(self, roll_back: Callable[[dict[int, int]], None]) -> None:
        """A layer's own roll-back of this step (a recurrent state it kept)."""
        self._roll_backs.append(roll_back)

    def roll_back(self, num_kept: dict[int, int]) -> None:
        """Set sequence b's state (b verified drafts) to its state after the
        first `num_kept[b]` tokens of its step, in every state layer."""
        for layer_roll_back in self._roll_backs:
            layer_roll_back(num_kept)
        plan = self._plan
        if plan is None:
            return  # no conv layer ran
        for cache, kept in self._kept:
            num_state_rows = cache.shape[1]
            for b, m in num_kept.items():
                first = plan.kept_offsets[b] + m
                cache[cache.shape[0] - 1 - self.slots[b]] = kept[first : first + num_state_rows]


def _build_plan(
    states: SequenceStates, query_lens: list[int], context_lens: list[int],
    block_tables: list[list[int]], block_size: int, num_rows: int, n: int, device,
) -> ConvPlan:  # fmt: skip
    """Host-side index lists over sequences, one tensor each (`n`: L - 1)."""
    rows: dict[str, list[int]] = {
        key: [] for key in ("token", "start", "source", "tap", "end", "target", "snap", "block",
                            "kept")
    }  # fmt: skip
    zero: list[bool] = []
    kept_offsets: dict[int, int] = {}
    offset = 0
    keeps = states.keeps_inputs or [False] * len(query_lens)
    for b, (q, c, table) in enumerate(zip(query_lens, context_lens, block_tables, strict=True)):
        slot_row = num_rows - 1 - states.slots[b]
        source = slot_row
        if states.starts[b] and c > 0:
            assert states.has_snapshots, "a state past position 0 starts from a snapshot"
            assert c % block_size == 0, f"a state starting at {c} is not at a block's end"
            source = table[c // block_size - 1]
        rows["start"] += range(offset, offset + n)
        rows["source"].append(source)
        zero.append(c == 0)
        rows["token"] += range(offset + n, offset + n + q)
        rows["tap"] += range(offset, offset + q)
        rows["end"] += range(offset + q, offset + q + n)
        rows["target"].append(slot_row)
        ends = range((c // block_size + 1) * block_size, c + q + 1, block_size)
        for end in ends if states.has_snapshots else ():
            rows["snap"] += range(offset + end - c, offset + end - c + n)
            rows["block"].append(table[end // block_size - 1])
        if keeps[b]:
            kept_offsets[b] = len(rows["kept"])
            rows["kept"] += range(offset, offset + n + q)
        offset += n + q
    return _to_plan(rows, zero, kept_offsets, offset, device)


def _to_plan(
    rows: dict[str, list[int]], zero: list[bool], kept_offsets: dict[int, int],
    num_ext_rows: int, device,
) -> ConvPlan:  # fmt: skip
    def tensor(key: str) -> Tensor:
        return torch.tensor(rows[key], dtype=torch.int64, device=device)

    return ConvPlan(
        token_rows=tensor("token"),
        start_rows=tensor("start"),
        start_sources=tensor("source"),
        starts_at_zero=torch.tensor(zero, dtype=torch.bool, device=device)[:, None, None],
        first_taps=tensor("tap"),
        end_rows=tensor("end"),
        end_targets=tensor("target"),
        snapshot_rows=tensor("snap"),
        snapshot_targets=tensor("block"),
        kept_rows=tensor("kept") if rows["kept"] else None,
        kept_offsets=kept_offsets,
        num_ext_rows=num_ext_rows,
    )
