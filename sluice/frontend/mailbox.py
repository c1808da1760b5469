"""The single-slot mailbox between the output processor and one API request's reader.

One mailbox per API request, owned by the event loop (every method runs on it).
Invariants:
- `put` never blocks and never drops: into an empty slot it stores, into a
  full slot it merges by choice index, so choices never overwrite each other
  and a reader that lags k engine steps gets one delta per choice holding all
  k steps' tokens.
- Memory is bounded by what is pending: a `get` (or `take`) takes the whole slot.
- `put_error` travels through the same slot: `get` and `take` raise it only
  once every delta put before it was delivered.

`get` waits; a reader on the hot path uses `wait()` (a bare future) and
`take()` instead, which is the same thing with one coroutine less per token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sluice.frontend.deltas import ChoiceDelta


class Mailbox:
    __slots__ = ("_slot", "_error", "_waiter", "_loop", "listener")

    def __init__(self) -> None:
        # Called by `put` instead of waking the reader, while its reader is
        # parked with a direct writer (sluice/frontend/direct_write.py): the
        # listener takes the slot itself, or calls `wake`.
        self.listener: Callable[[], None] | None = None
        # The loop of the first wait (a mailbox lives on one loop).
        self._loop: asyncio.AbstractEventLoop | None = None
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
        if self.listener is not None:
            self.listener()
        elif self._waiter is not None:
            self.wake()

    def put_error(self, error: BaseException) -> None:
        """Fail the reader after it has taken what is pending; the first error wins."""
        if self._error is None:
            self._error = error
        self.listener = None
        self.wake()

    async def get(self) -> dict[int, ChoiceDelta]:
        """Wait for the slot, take all of it (choice index -> merged delta), empty it."""
        while (taken := self.take()) is None:
            await self.wait()
        return taken

    def take(self) -> dict[int, ChoiceDelta] | None:
        """`get` without waiting: the whole slot, or None when nothing is pending.

        Raises the error once every delta put before it was taken.
        """
        if self._slot:
            taken, self._slot = self._slot, {}
            return taken
        if self._error is not None:
            raise self._error
        return None

    def wait(self) -> asyncio.Future[None]:
        """A future done once something is pending; then `take` returns it.

        A reader that keeps up awaits this bare future rather than the `get`
        coroutine: one frame less to resume for every token.
        """
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        waiter = self._loop.create_future()
        if self._slot or self._error is not None:
            waiter.set_result(None)
        else:
            self._waiter = waiter
        return waiter

    def wake(self) -> None:
        """Finish the reader's wait, whether or not anything is pending."""
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
