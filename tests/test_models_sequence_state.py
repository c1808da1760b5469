"""The per-sequence state rows of a conv layer (models/sequence_state.py), with
the short convolution's own lay-out and store (models/short_conv.py) and
inputs that name their token: each step leaves every sequence's last L - 1
inputs in its slot, the inputs at each block end it crossed in that block's
snapshot row, starts a prefix hit from its snapshot, and rolls a verifying
sequence back to any of its positions."""

from __future__ import annotations

import torch

from sluice.models.sequence_state import SequenceStates
from sluice.models.short_conv import lay_out_conv_inputs, store_conv_states

BLOCK_SIZE, NUM_BLOCKS, NUM_SLOTS, HIDDEN = 4, 10, 3, 2
STATE_ROWS = 2  # kernel 3


def cache() -> torch.Tensor:  # [NUM_BLOCKS + NUM_SLOTS, L - 1, hidden]
    return torch.zeros(NUM_BLOCKS + NUM_SLOTS, STATE_ROWS, HIDDEN)


def slot_row(slot: int) -> int:
    return NUM_BLOCKS + NUM_SLOTS - 1 - slot


def step(states, rows, query_lens, context_lens, tables, inputs) -> torch.Tensor:
    plan = states.conv_plan(query_lens, context_lens, tables, BLOCK_SIZE, rows.shape[0],
                            STATE_ROWS, "cpu")  # fmt: skip
    ext = lay_out_conv_inputs(inputs, rows, plan)
    store_conv_states(ext, rows, plan, states)
    return ext


def named(values: list[float]) -> torch.Tensor:  # [n, hidden]: token value in every channel
    return torch.tensor(values)[:, None].repeat(1, HIDDEN)


def test_a_step_leaves_the_last_inputs_in_the_slot_and_snapshots_at_block_ends():
    rows = cache()
    states = SequenceStates(slots=[2], starts=[True])
    step(states, rows, [6], [0], [[5, 9]], named([1, 2, 3, 4, 5, 6]))
    assert torch.equal(rows[slot_row(2)], named([5, 6]))
    assert torch.equal(rows[5], named([3, 4]))  # the state at the end of block 5 (position 4)
    assert not rows[9].any()  # block 9 is not full yet


def test_a_later_chunk_continues_from_the_slot_and_a_hit_from_the_snapshot():
    rows = cache()
    first = SequenceStates(slots=[0], starts=[True])
    step(first, rows, [3], [0], [[5]], named([1, 2, 3]))
    rows[7] = named([40, 41])  # block 7's snapshot: the state after its tokens
    later = SequenceStates(slots=[0, 1], starts=[False, True])
    ext = step(later, rows, [2, 1], [3, 4], [[5, 6], [7, 8]], named([4, 5, 6]))
    assert torch.equal(ext[:4], named([2, 3, 4, 5]))  # the conv tail carried, then the chunk
    assert torch.equal(ext[4:], named([40, 41, 6]))  # the hit starts from block 7's snapshot
    assert torch.equal(rows[5], named([3, 4]))  # block 5 filled at position 4
    assert torch.equal(rows[slot_row(1)], named([41, 6]))


def test_a_verifying_sequence_rolls_back_to_its_last_kept_position():
    rows = cache()
    states = SequenceStates(slots=[1], starts=[True], keeps_inputs=[True])
    step(states, rows, [5], [0], [[2, 3]], named([1, 2, 3, 4, 5]))
    assert torch.equal(rows[slot_row(1)], named([4, 5]))
    states.roll_back({0: 2})
    assert torch.equal(rows[slot_row(1)], named([1, 2]))
    states.roll_back({0: 1})
    assert torch.equal(rows[slot_row(1)], named([0, 1]))  # zeros before position 0
