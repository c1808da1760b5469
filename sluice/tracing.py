"""OpenTelemetry traces: the tracer each process exports with, and W3C
`traceparent` in and out.

One trace per API request, across processes: the HTTP edge's request span
(sluice/server/observability/request_spans.py: `receive` and `stream` inside it) continues
the client's `traceparent` header, if any, and hands its own traceparent to
the engine in `EngineRequest.trace_context`, through the engine process's ZMQ
socket or a Ray replica's TCP one alike; the engine loop
(sluice/engine/engine_spans.py) records `queue`, `prefill` and `decode` as
children of it.

Off by default (`--otlp-traces-endpoint` unset): no tracer exists, nothing
here is imported, and the request path does one `is None` test per request
and per engine step. On, every process (the server, the engine process, each
replica) exports its own spans with OTLP over HTTP, in batches from a
background thread (the engine loop never waits on the collector).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

TRACER_NAME = "sluice"
# OTLP/HTTP's path for traces, added to an endpoint given without a path.
OTLP_TRACES_PATH = "/v1/traces"
# Spans wait at most this long in the batch before they are sent.
EXPORT_DELAY_MS = 500


def otlp_tracer(endpoint: str, service_name: str) -> Tracer:
    """A tracer whose spans go to the OTLP/HTTP collector at `endpoint`
    (`http://host:4318`, or the full `.../v1/traces` URL)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporter = OTLPSpanExporter(endpoint=traces_url(endpoint))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=EXPORT_DELAY_MS))
    return provider.get_tracer(TRACER_NAME)


def traces_url(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + OTLP_TRACES_PATH
    return endpoint


def context_of(traceparent: str | None) -> Context | None:
    """The W3C trace context `traceparent` names (None: none, or not a valid one)."""
    if not traceparent:
        return None
    from opentelemetry.trace import get_current_span
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    return context if get_current_span(context).get_span_context().is_valid else None


def traceparent_of(span: Span) -> str:
    """`span` as the W3C traceparent a child in another process continues."""
    from opentelemetry.trace import set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, Any] = {}
    TraceContextTextMapPropagator().inject(carrier, set_span_in_context(span))
    return carrier["traceparent"]
