"""A minimal OTLP/HTTP trace collector in a thread: accepts ``POST /v1/traces`` (protobuf),
keeps the spans. For the tracing tests and the tracing benchmark.

It runs in a plain thread (``http.server``), not in Trio: a test waits for spans with
``await trio.to_thread.run_sync(collector.wait_for, count, timeout)``.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

__all__ = ["Collector", "attributes", "running_collector"]


@final
class Collector:
    """The spans received so far, and the service names they came from."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.services: set[str] = set()
        self.requests = 0
        self._changed = threading.Condition()
        self.url = ""

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self._changed:
            self.requests += 1
            for resource_spans in request.resource_spans:
                for attribute in resource_spans.resource.attributes:
                    if attribute.key == "service.name":
                        self.services.add(attribute.value.string_value)
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(scope_spans.spans)
            self._changed.notify_all()

    def wait_for(self, count: int, timeout: float) -> list[Span]:
        """The spans, once there are at least ``count`` (blocking; at most ``timeout``
        seconds, then whatever arrived)."""
        with self._changed:
            self._changed.wait_for(lambda: len(self.spans) >= count, timeout)
            return list(self.spans)


def attributes(span: Span) -> dict[str, Any]:
    """A span's attributes as a plain dictionary."""
    out: dict[str, Any] = {}
    for attribute in span.attributes:
        value = attribute.value
        out[attribute.key] = getattr(value, value.WhichOneof("value") or "string_value")
    return out


@contextmanager
def running_collector() -> Iterator[Collector]:
    """A collector listening on a free loopback port (``collector.url``, the base URL an
    exporter's ``endpoint`` names), until the block ends."""
    collector = Collector()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            collector.add(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    collector.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
