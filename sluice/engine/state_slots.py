"""Slots of the recurrent-state cache (hybrid models' conv layers): which
running request holds which. Pure bookkeeping, like the KV block accounting
(kv_cache.py); the runner owns the tensors (sluice/models/sequence_state.py).

A request takes a slot when the scheduler admits it and gives it back when
it is preempted, finishes or is aborted; the pool has one slot per seat
(`max_num_seqs`), so an admitted request always finds one. A slot's contents
belong to whoever holds it: a request admitted at position 0 starts from
zeros, one admitted after a prefix-cache hit from the snapshot at its last
cached block (the runner reads `ScheduledRequest.starts_state`).

Invariant (checked by `check_consistency`): every slot is free or held by
exactly one live request, and a request holds at most one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from sluice.engine.request import Request

NO_SLOT = -1


class StateSlotPool:
    def __init__(self, num_slots: int) -> None:
        if num_slots <= 0:
            raise ValueError(f"need num_slots > 0, got {num_slots}")
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def allocate(self, request: Request) -> None:
        """Give the request a slot (it holds none)."""
        assert request.state_slot == NO_SLOT, f"{request.request_id} already holds a slot"
        assert self._free, "more running requests than state slots"
        request.state_slot = self._free.popleft()

    def free(self, request: Request) -> None:
        """Take the request's slot back. Idempotent."""
        if request.state_slot != NO_SLOT:
            self._free.append(request.state_slot)
            request.state_slot = NO_SLOT

    def check_consistency(self, requests: Iterable[Request]) -> None:
        held = [r.state_slot for r in requests if r.state_slot != NO_SLOT]
        free = list(self._free)
        if len(set(held)) != len(held) or set(held) & set(free):
            raise AssertionError("a state slot is held twice, or held and free")
        if sorted(held + free) != list(range(self.num_slots)):
            raise AssertionError("state slots lost from the pool")
