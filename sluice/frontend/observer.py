"""What the frontend reports about each API request, for metrics.

The HTTP edge implements `RequestObserver` (Prometheus histograms and counters);
the frontend calls it on the event loop, from the consumer side, i.e. when
tokens are handed to the client, not when the engine produced them. A
Frontend without an observer skips every call.

Everything is timed per choice, as vLLM times each engine request (with
`n > 1` or a list of prompts, one API request fans out into several), so a
latency is what that choice's client sees. Call order for one API request:
on_first_token once per choice (its first take that carries tokens);
on_chunks for each choice's later takes that carry tokens, in batches
(`ChunkTimer`); on_finish once per choice when its finish is handed over;
on_abort once if the client went away first; on_end once, last, in every
case (finished, failed, cancelled). Every take's chunks are reported by the
time the request ends.

Takes happen once per token when the reader keeps up, so a choice's chunk
costs the observer side two list appends: `ChunkTimer` hands the chunks over at most
`CHUNKS_PER_REPORT` at a time, and never later than `REPORT_EVERY_S` after
the oldest of them (so a scrape never misses more than that).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

CHUNKS_PER_REPORT = 64
REPORT_EVERY_S = 1.0


class RequestObserver(Protocol):
    def on_first_token(self, ttft_s: float, num_tokens: int) -> None:
        """One choice's first tokens (`num_tokens`), handed over `ttft_s`
        seconds after the API request reached the frontend."""

    def on_chunks(self, num_tokens: Sequence[int], gaps_s: Sequence[float]) -> None:
        """Later chunks of any choices: the tokens of each, handed over
        `gaps_s[i]` seconds after the same choice's chunk before it."""

    def on_finish(
        self,
        num_prompt_tokens: int,
        num_generation_tokens: int,
        e2e_s: float,
        finish_reason: str,
    ) -> None:
        """One choice finished: its prompt and delivered tokens, seconds since arrival."""

    def on_abort(self) -> None:
        """The client went away (cancellation) before every choice finished."""

    def on_end(self, num_delivered_tokens: int) -> None:
        """The request ended: the tokens delivered over all its choices, its
        projection's usage count (the one count of delivered tokens)."""


class ChunkTimer:
    """Times one API request's chunks, per choice, and reports them to `observer` in batches."""

    __slots__ = (
        "started_s",
        "_observer",
        "_last_tokens_s",
        "_num_tokens",
        "_gaps_s",
        "_report_due_s",
    )

    def __init__(self, observer: RequestObserver):
        self.started_s = time.perf_counter()
        self._observer = observer
        # Per choice index: when its last chunk with tokens was handed over.
        self._last_tokens_s: dict[int, float] = {}
        # The chunks not reported yet: tokens of each, gap before each.
        self._num_tokens: list[int] = []
        self._gaps_s: list[float] = []
        self._report_due_s = 0.0

    def on_tokens(self, index: int, num_tokens: int, now_s: float) -> None:
        """A take carried `num_tokens` (> 0) of choice `index` at `now_s`
        (perf_counter seconds)."""
        last_s = self._last_tokens_s.get(index)
        self._last_tokens_s[index] = now_s
        if last_s is None:
            self._observer.on_first_token(now_s - self.started_s, num_tokens)
            return
        if not self._num_tokens:
            self._report_due_s = now_s + REPORT_EVERY_S
        self._num_tokens.append(num_tokens)
        self._gaps_s.append(now_s - last_s)
        if len(self._num_tokens) >= CHUNKS_PER_REPORT or now_s >= self._report_due_s:
            self.report()

    def report(self) -> None:
        """Hand over the chunks not reported yet."""
        if self._num_tokens:
            self._observer.on_chunks(self._num_tokens, self._gaps_s)
            self._num_tokens, self._gaps_s = [], []
