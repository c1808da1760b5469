"""The event loop's responsiveness, measured from inside it and exposed on /metrics.

A task sleeps `interval_s` over and over; how late each wake-up comes is the
loop's lag at that moment: the longest any callback (a tokenization holding
the GIL, a big JSON dump, a blocking call) kept every stream, every health
probe and the engine's outputs waiting. Exposed as

    sluice:event_loop_lag_seconds        histogram of every wake-up's lag
    sluice:event_loop_lag_max_seconds    worst lag over the last `window_s`

Resolution: a wake-up is late only by the part of a stall after its timer
was due, so a stall of S shows as a lag of at least S - `interval_s`.
Sampling every 5 ms (not the 50 ms it once was) keeps that gap small next to
the bounds worth checking (tens of milliseconds), at ~200 timers a second.

Invariant: the watchdog itself costs one timer per `interval_s` and never
blocks; the worst-lag window is kept as per-second maxima, so memory is fixed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# How often the loop is sampled: the metric's resolution (see above).
SAMPLE_INTERVAL_S = 0.005
LAG_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LoopWatchdog(Collector):
    """Measures the running loop's lag; a Prometheus collector of its worst lag."""

    def __init__(
        self,
        registry: CollectorRegistry,
        interval_s: float = SAMPLE_INTERVAL_S,
        window_s: float = 60.0,
    ):
        self.interval_s = interval_s
        self.window_s = window_s
        self._lag_s = Histogram(
            "sluice:event_loop_lag_seconds",
            "How late the event loop ran a timer: the longest anything blocked it.",
            buckets=LAG_BUCKETS_S,
            registry=registry,
        )
        # (whole second of the loop clock, worst lag seen in it), oldest first.
        self._worst_by_second: collections.deque[tuple[int, float]] = collections.deque()
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        registry.register(self)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="sluice-loop-watchdog")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def worst_lag_s(self) -> float:
        """The worst lag within the last `window_s` seconds."""
        if self._loop is None:
            return 0.0
        self._forget_before(self._loop.time() - self.window_s)
        return max((lag for _, lag in self._worst_by_second), default=0.0)

    def record(self, now_s: float, lag_s: float) -> None:
        self._lag_s.observe(lag_s)
        second = math.floor(now_s)
        if self._worst_by_second and self._worst_by_second[-1][0] == second:
            if lag_s > self._worst_by_second[-1][1]:
                self._worst_by_second[-1] = (second, lag_s)
        else:
            self._worst_by_second.append((second, lag_s))
        self._forget_before(now_s - self.window_s)

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "sluice:event_loop_lag_max_seconds",
            f"Worst event loop lag over the last {self.window_s:g} seconds.",
        )
        gauge.add_metric([], self.worst_lag_s())
        yield gauge

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            expected_s = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            now_s = loop.time()
            self.record(now_s, max(0.0, now_s - expected_s))

    def _forget_before(self, oldest_s: float) -> None:
        while self._worst_by_second and self._worst_by_second[0][0] < math.floor(oldest_s):
            self._worst_by_second.popleft()
