"""The engine's part of a request's trace: `queue`, `prefill` and `decode`
spans, children of the traceparent the request came with (sluice/tracing.py).

Owned by the engine loop, like the scheduler. It keeps four timestamps per
traced request (an untraced one costs a dict lookup per step it runs in, and
nothing at all while no traced request is live) and writes the spans once
the request finishes, with their real start and end times:

    queue    added                 -> first step that computes it
    prefill  that step's start     -> the end of the step giving its first token
    decode   first token           -> finish (or abort)

A request aborted before a phase began ends in the phase it was in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sluice.engine.outputs import RequestDelta
from sluice.engine.scheduler import SchedulerPlan
from sluice.tracing import context_of, otlp_tracer

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Tracer


@dataclass(slots=True)
class _Timeline:
    context: Context
    num_prompt_tokens: int
    added_ns: int
    scheduled_ns: int | None = None
    first_token_ns: int | None = None
    num_output_tokens: int = 0


class EngineSpans:
    """Records traced requests' phases and writes their spans when they finish."""

    def __init__(self, tracer: Tracer, clock_ns: Callable[[], int] = time.time_ns):
        self._tracer = tracer
        self._clock_ns = clock_ns
        self._traced: dict[str, _Timeline] = {}
        self._step_started_ns = 0

    @property
    def num_traced(self) -> int:
        """Traced requests not finished yet."""
        return len(self._traced)

    def on_add(self, request_id: str, trace_context: str | None, num_prompt_tokens: int) -> None:
        context = context_of(trace_context)
        if context is not None:
            self._traced[request_id] = _Timeline(context, num_prompt_tokens, self._clock_ns())

    def on_step_start(self) -> None:
        if self._traced:
            self._step_started_ns = self._clock_ns()

    def on_step(self, plan: SchedulerPlan, deltas: list[RequestDelta]) -> None:
        """After a step: who started computing in it, and what it gave."""
        if not self._traced:
            return
        for scheduled in plan.scheduled:
            timeline = self._traced.get(scheduled.request_id)
            if timeline is not None and timeline.scheduled_ns is None:
                timeline.scheduled_ns = self._step_started_ns
        self.on_deltas(deltas)

    def on_deltas(self, deltas: list[RequestDelta]) -> None:
        """Deltas of a step or of aborts: first tokens and finishes."""
        if not self._traced:
            return
        now_ns = self._clock_ns()
        for delta in deltas:
            timeline = self._traced.get(delta.request_id)
            if timeline is None:
                continue
            if delta.new_token_ids and timeline.first_token_ns is None:
                timeline.first_token_ns = now_ns
            timeline.num_output_tokens += len(delta.new_token_ids)
            if delta.finish_reason is not None:
                del self._traced[delta.request_id]
                self._write(delta.request_id, timeline, delta.finish_reason, now_ns)

    def _write(self, request_id: str, timeline: _Timeline, finish_reason: str, end_ns: int) -> None:
        attributes = {"sluice.request_id": request_id}
        scheduled_ns = timeline.scheduled_ns or end_ns
        self._span("queue", timeline, timeline.added_ns, scheduled_ns, attributes)
        if timeline.scheduled_ns is None:
            return
        first_token_ns = timeline.first_token_ns or end_ns
        prefill = attributes | {"gen_ai.usage.input_tokens": timeline.num_prompt_tokens}
        self._span("prefill", timeline, scheduled_ns, first_token_ns, prefill)
        if timeline.first_token_ns is None:
            return
        decode = attributes | {
            "gen_ai.usage.output_tokens": timeline.num_output_tokens,
            "gen_ai.response.finish_reasons": (finish_reason,),
        }
        self._span("decode", timeline, first_token_ns, end_ns, decode)

    def _span(
        self, name: str, timeline: _Timeline, start_ns: int, end_ns: int, attributes: dict
    ) -> None:
        span = self._tracer.start_span(
            name, context=timeline.context, start_time=start_ns, attributes=attributes
        )
        span.end(end_time=end_ns)


def engine_spans(tracer: Tracer | None, otlp_traces_endpoint: str | None) -> EngineSpans | None:
    """The engine's spans: on `tracer` if given, else exported to the endpoint; None: off."""
    if tracer is None and otlp_traces_endpoint is not None:
        tracer = otlp_tracer(otlp_traces_endpoint, "sluice-engine")
    return None if tracer is None else EngineSpans(tracer)
