"""An OTLP/HTTP trace receiver on loopback: decodes what an exporter sends with opentelemetry-proto.

``delay_s`` makes it a slow collector (each request waits before it is answered).
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    start_ns: int
    end_ns: int
    resource: dict[str, Any] = field(default_factory=dict)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class OTLPReceiver:
    def __init__(self, *, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.spans: list[Span] = []
        self.requests = 0
        self.bodies: list[bytes] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                receiver._take(self.path, body)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

        return Handler

    def _take(self, path: str, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    spans.append(Span(
                        name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(), attributes={a.key: _value(a.value) for a in s.attributes},
                        status_code=s.status.code, status_message=s.status.message,
                        start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano, resource=resource,
                    ))  # fmt: skip
        with self._lock:
            self.requests += 1
            self.bodies.append(body)
            self.spans.extend(spans)

    def wait_for(self, predicate: Any, timeout_s: float = 20.0) -> list[Span]:
        """Spans received so far, once ``predicate(spans)`` holds (or fail after a generous timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"the collector did not receive the expected spans: {[s.name for s in spans]}")
