"""The single-slot mailbox between the output processor and one API request's reader.

One mailbox per API request, owned by the event loop (every method runs on it).
Invariants:
- `put` never blocks and never drops: into an empty slot it stores, into a
  full slot it merges by choice index, so choices never overwrite each other
  and a reader that lags k engine steps gets one delta per choice holding all
  k steps' tokens.
- Memory is bounded by what is pending: a `get` takes the whole slot.
- `put_error` travels through the same slot: `get` raises it only once every
  delta put before it was delivered.
"""

from __future__ import annotations

import asyncio

from sluice.frontend.deltas import ChoiceDelta


class Mailbox:
    __slots__ = ("_slot", "_error", "_waiter")

    def __init__(self) -> None:
        # choice index -> everything released for it since the last get.
        self._slot: dict[int, ChoiceDelta] = {}
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def is_empty(self) -> bool:
        return not self._slot and self._error is None

    def put(self, index: int, delta: ChoiceDelta) -> None:
        """Store `delta` for choice `index`, merging into what is pending for it.

        The mailbox owns `delta` from here on; the caller must not touch it.
        """
        pending = self._slot.get(index)
        if pending is None:
            self._slot[index] = delta
        else:
            pending.merge(delta)
        self._wake()

    def put_error(self, error: BaseException) -> None:
        """Fail the reader after it has taken what is pending; the first error wins."""
        if self._error is None:
            self._error = error
        self._wake()

    async def get(self) -> dict[int, ChoiceDelta]:
        """Wait for the slot, take all of it (choice index -> merged delta), empty it."""
        while not self._slot:
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        taken, self._slot = self._slot, {}
        return taken

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
