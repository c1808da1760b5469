"""A `DeltaSink` that keeps everything it hears, for tests of engine clients."""

from __future__ import annotations

import asyncio

from sluice.engine.outputs import RequestDelta


class RecordingSink:
    def __init__(self) -> None:
        self.deltas: list[RequestDelta] = []
        self.errors: list[BaseException] = []
        # Set at the first delta; and once the request finished or failed.
        self.has_delta = asyncio.Event()
        self.done = asyncio.Event()

    def on_delta(self, delta: RequestDelta) -> None:
        self.deltas.append(delta)
        self.has_delta.set()
        if delta.is_finished:
            self.done.set()

    def on_error(self, error: BaseException) -> None:
        self.errors.append(error)
        self.done.set()

    @property
    def token_ids(self) -> list[int]:
        return [t for d in self.deltas for t in d.new_token_ids]
