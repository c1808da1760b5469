"""The engine's queue, prefill and decode spans on an injected clock: their
times, attributes and parent; an abort ends a request in the phase it was
in; untraced requests and invalid traceparents leave no timeline."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sluice.engine.engine_spans import EngineSpans
from sluice.engine.outputs import RequestDelta
from sluice.engine.sampling_params import SamplingParams
from sluice.engine.scheduler import ScheduledRequest, SchedulerPlan

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class Clock:
    def __init__(self) -> None:
        self.now_ns = 1_000

    def __call__(self) -> int:
        return self.now_ns


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    clock = Clock()
    return EngineSpans(provider.get_tracer("test"), clock), clock, exporter


def plan_of(*request_ids: str) -> SchedulerPlan:
    scheduled = [ScheduledRequest(request_id, [1], 0, 1, [0], True, SamplingParams(), [1], [])
                 for request_id in request_ids]  # fmt: skip
    return SchedulerPlan(scheduled, len(scheduled))


def delta(request_id: str, num_tokens: int, finish_reason: str | None = None) -> RequestDelta:
    return RequestDelta(request_id, tuple(range(num_tokens)), None, finish_reason, None, 3)


def step(spans: EngineSpans, clock: Clock, plan: SchedulerPlan, deltas, duration_ns: int = 10):
    spans.on_step_start()
    clock.now_ns += duration_ns
    spans.on_step(plan, deltas)


def test_a_request_gets_queue_prefill_and_decode_spans_with_their_times(traced):
    spans, clock, exporter = traced
    spans.on_add("r", TRACEPARENT, 3)  # at 1000
    clock.now_ns = 1_500
    step(spans, clock, plan_of("r"), [])  # a prefill chunk: 1500..1510, no token
    step(spans, clock, plan_of("r"), [delta("r", 1)])  # the first token at 1520
    step(spans, clock, plan_of("r"), [delta("r", 2, "length")])  # finished at 1530
    named = {span.name: span for span in exporter.get_finished_spans()}
    assert {name: (s.start_time, s.end_time) for name, s in named.items()} == {
        "queue": (1_000, 1_500), "prefill": (1_500, 1_520), "decode": (1_520, 1_530)
    }  # fmt: skip
    for span in named.values():
        assert format(span.context.trace_id, "032x") == TRACE_ID
        assert format(span.parent.span_id, "016x") == PARENT_ID
        assert span.attributes["sluice.request_id"] == "r"
    assert named["prefill"].attributes["gen_ai.usage.input_tokens"] == 3
    assert named["decode"].attributes["gen_ai.usage.output_tokens"] == 3
    assert named["decode"].attributes["gen_ai.response.finish_reasons"] == ("length",)


def test_an_abort_ends_a_request_in_the_phase_it_was_in(traced):
    spans, clock, exporter = traced
    spans.on_add("queued", TRACEPARENT, 3)
    spans.on_add("prefilling", TRACEPARENT, 3)
    step(spans, clock, plan_of("prefilling"), [])
    clock.now_ns += 5
    spans.on_deltas([delta("queued", 0, "abort"), delta("prefilling", 0, "abort")])
    names = sorted((s.attributes["sluice.request_id"], s.name)
                   for s in exporter.get_finished_spans())  # fmt: skip
    assert names == [("prefilling", "prefill"), ("prefilling", "queue"), ("queued", "queue")]


def test_untraced_requests_and_bad_traceparents_keep_no_timeline(traced):
    spans, clock, exporter = traced
    for trace_context in (None, "", "00-zz-yy-01", f"00-{'0' * 32}-{PARENT_ID}-01"):
        spans.on_add("r", trace_context, 3)
    step(spans, clock, plan_of("r"), [delta("r", 1, "stop")])
    assert exporter.get_finished_spans() == ()
    assert spans.num_traced == 0
