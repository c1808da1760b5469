"""The one owner of what a request has produced and its client has not received.

`StreamOutput` holds, for one API request, everything between the output
processor and the connection:

    put(index, delta) ─▶ slot ──render──▶ events ──▶ attached connection (write_now)
    put_error(error)  ─▶ error            │       └─▶ next_events() ─▶ the generator
                                          └ refused writes wait here, first in line

- The **slot** holds accepted deltas not yet rendered, merged per choice
  index: a reader that lags k engine steps gets one delta per choice with all
  k steps' tokens, and choices never overwrite each other. `put` never blocks.
- **Rendering** turns the whole slot into SSE events (the frontend's chunk
  builder) in one go; the slot is rendered only when no earlier event waits,
  so events leave in the order their deltas were accepted.
- While the stream's generator is parked in `next_events` and a connection
  is attached, `put` renders at once and writes with the connection's
  `write_now` (no task wake-up per token). A write the connection refuses
  (a paused transport) and everything rendered with it become the
  **backlog**; the generator is woken and `next_events` hands the backlog
  out before anything else, to be written through the waiting path. Later
  puts merge in the slot meanwhile (coalescing) and are rendered only after
  the backlog is out.
- An **error** is raised by `next_events` only once every delta accepted
  before it was handed out; deltas put after an error are dropped.
- Only the generator closes the stream: when every choice's finishing delta
  has been rendered (and written or handed out), `next_events` returns [],
  and the generator sends the closing events (usage, [DONE]).

Everything here runs on the event loop that owns the request. Nothing raised
while rendering or writing from `put` reaches the caller (the engine's
delivery loop): it becomes the stream's error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sluice.frontend.deltas import ChoiceDelta

# (choice index, delta) pairs in index order -> the events for them, in order.
Render = Callable[[list[tuple[int, ChoiceDelta]]], list[bytes]]
# Writes one event now, or returns False (nothing written: the caller must wait).
WriteNow = Callable[[bytes], bool]


class StreamOutput:
    __slots__ = ("_render", "_num_unfinished", "_slot", "_backlog", "_error",
                 "_write_now", "_waiter", "_loop")  # fmt: skip

    def __init__(self, num_choices: int, render: Render):
        self._render = render
        # Choices whose finishing delta has not been rendered yet.
        self._num_unfinished = num_choices
        # choice index -> everything accepted for it and not rendered yet.
        self._slot: dict[int, ChoiceDelta] = {}
        # Events rendered but not written, oldest first; always older than the slot.
        self._backlog: list[bytes] = []
        self._error: BaseException | None = None
        # The attached connection's writer (None: every event goes through next_events).
        self._write_now: WriteNow | None = None
        # The parked generator's wake-up; None while it is not parked.
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def has_pending(self) -> bool:
        """Something accepted (deltas, events or the error) waits to be handed out."""
        return bool(self._slot or self._backlog) or self._error is not None

    @property
    def is_done(self) -> bool:
        """Every choice's finishing delta has been rendered."""
        return self._num_unfinished == 0

    # -- the producer: the output processor -----------------------------------

    def put(self, index: int, delta: ChoiceDelta) -> None:
        """Accept `delta` for choice `index`; the output owns it from here on."""
        if self._error is not None:
            return  # the stream ends with its error; nothing after it is sent
        pending = self._slot.get(index)
        if pending is None:
            self._slot[index] = delta
        else:
            pending.merge(delta)
        if self._waiter is None:
            return  # the generator is busy; it renders the slot when it comes back
        if self._write_now is None:
            self._wake()
        else:
            self._write_directly(self._write_now)

    def put_error(self, error: BaseException) -> None:
        """End the stream with `error` after what was accepted before it; the first wins."""
        if self._error is None:
            self._error = error
        self._wake()

    # -- the HTTP edge ----------------------------------------------------------

    def attach(self, write_now: WriteNow) -> None:
        """Write events with `write_now` while the generator is parked."""
        self._write_now = write_now

    def detach(self) -> None:
        self._write_now = None

    # -- the generator ------------------------------------------------------------

    async def next_events(self) -> list[bytes]:
        """The events to send next, in order, waiting for them if need be.

        [] once every choice has finished and all its events were handed out
        or written. Raises the stream's error once everything accepted before
        it was handed out or written.
        """
        while True:
            if self._backlog:
                events, self._backlog = self._backlog, []
                return events
            if self._slot:
                if events := self._render_slot():
                    return events
                continue
            if self._error is not None:
                raise self._error
            if self.is_done:
                return []
            await self._park()

    # -- inside ---------------------------------------------------------------------

    def _render_slot(self) -> list[bytes]:
        slot, self._slot = self._slot, {}
        taken = sorted(slot.items()) if len(slot) > 1 else list(slot.items())
        for _, delta in taken:
            if delta.finish_reason is not None:
                self._num_unfinished -= 1
        return self._render(taken)

    def _write_directly(self, write_now: WriteNow) -> None:
        """Render the slot and write it now; wake the generator for what cannot go."""
        try:
            events = self._render_slot()
            for position, event in enumerate(events):
                if not write_now(event):
                    self._backlog = events[position:]
                    break
        except Exception as error:  # never the engine's delivery loop's problem
            self.put_error(error)
            return
        if self._backlog or self.is_done:
            self._wake()

    async def _park(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        # Cleared at once: a put before the generator runs again must not
        # write directly (its events would pass the ones it was woken for).
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
