"""Direct writes: a stream's chunks written from the engine's delivery, no task wake-up.

A stream whose reader keeps up spends most of its per-token cost waking its
task: a future per token, the task step, the response loop and the event
generator resumed, each for one chunk. While the event generator is parked
waiting for its mailbox, a `DirectWrite` lets the mailbox's `put` hand the
new deltas straight to a synchronous writer instead (the connection's
`write_now`): same chunks, same order, same bytes, on the same loop, in the
engine's delivery callback.

Invariants:
- Direct writes happen only while the generator is parked in its wait (the
  mailbox's listener is set for exactly that span), so they never interleave
  with the response's own writes: everything written directly precedes
  everything the generator yields after it wakes.
- Only mid-stream delta chunks are written directly. The generator is woken
  (and yields the rest itself, through the watched write path) when a write
  cannot go out at once (a paused transport, a gone client: then the chunk and
  the ones after it wait in `backlog`), when the stream's last delta arrived
  (closing events, usage and [DONE], are the generator's), and on any error.
- A reader that lags still coalesces: with writes paused, the listener is
  gone after the first refused write, and puts merge in the mailbox as before.
- Nothing raised here reaches the engine's delivery loop: an error is kept
  in `error` and raised in the generator, which turns it into an error event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from sluice.frontend.deltas import ChoiceDelta
from sluice.frontend.mailbox import Mailbox

if TYPE_CHECKING:
    from sluice.frontend.serving import _RequestRun


class _DeltaEvents(Protocol):
    def delta_event(self, index: int, delta: ChoiceDelta) -> bytes: ...


class DirectWrite:
    """Set by the HTTP edge once headers and the first event are out; read by
    the stream's generator. `write(event)` returns False when the event was
    not written and must go through the waiting path."""

    __slots__ = ("write",)

    def __init__(self) -> None:
        self.write: Callable[[bytes], bool] | None = None


class DirectWriter:
    """The mailbox listener of one parked stream generator."""

    __slots__ = ("_direct", "_run", "_chunks", "_mailbox", "backlog", "error")

    def __init__(
        self, direct: DirectWrite, run: _RequestRun, chunks: _DeltaEvents, mailbox: Mailbox
    ):
        self._direct = direct
        self._run = run
        self._chunks = chunks
        self._mailbox = mailbox
        # Events made here but not written: the generator yields them first.
        self.backlog: list[bytes] = []
        # What went wrong in the listener; the generator raises it.
        self.error: BaseException | None = None

    @property
    def is_enabled(self) -> bool:
        return self._direct.write is not None

    def on_put(self) -> None:
        """The mailbox's listener: write what was put, or wake the generator."""
        write = self._direct.write
        try:
            taken = self._run.take_nowait()
            if taken is None:
                return
            events = [self._chunks.delta_event(index, delta) for index, delta in taken]
            if write is not None and not self._run.is_done:
                for written, event in enumerate(events):
                    if not write(event):
                        self.backlog.extend(events[written:])
                        break
                else:
                    return  # all written: the generator stays parked
            else:
                self.backlog.extend(events)
        except Exception as error:  # the engine's delivery loop must never see it
            self.error = error
        self._mailbox.listener = None
        self._mailbox.wake()
