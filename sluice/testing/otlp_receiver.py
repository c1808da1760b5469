"""An OTLP/HTTP collector on localhost, for tests: every span it is sent,
with the `service.name` of the process that sent it.

    receiver = OtlpReceiver()   # listening at receiver.url
    ... --otlp-traces-endpoint receiver.url ...
    receiver.wait_for(num_spans)
    receiver.close()
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class OtlpReceiver:
    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        # (service name, protobuf Span), in the order they came.
        self.spans: list[tuple[str, object]] = []
        self.received = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                export = ExportTraceServiceRequest.FromString(body)
                with receiver.received:
                    for resource_spans in export.resource_spans:
                        service = next(a.value.string_value for a in resource_spans.resource.attributes
                                       if a.key == "service.name")  # fmt: skip
                        for scope_spans in resource_spans.scope_spans:
                            receiver.spans += [(service, span) for span in scope_spans.spans]
                    receiver.received.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, num_spans: int, timeout_s: float = 60) -> None:
        with self.received:
            assert self.received.wait_for(lambda: len(self.spans) >= num_spans, timeout_s), (
                f"{len(self.spans)} spans of {num_spans}"
            )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
