"""A trace receiver for tests: an OTLP/HTTP (protobuf) endpoint on 127.0.0.1 that keeps the
spans it is sent, as the collector's own protobuf messages."""

from __future__ import annotations

import contextlib
import gzip
import http.server
import threading
from collections.abc import Iterator

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class OtlpReceiver:
    def __init__(self, server: http.server.ThreadingHTTPServer) -> None:
        self.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        self._spans: list[Span] = []
        self._lock = threading.Lock()

    def received(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    self._spans.extend(scope.spans)

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()


@contextlib.contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP receiver serving on a free port of 127.0.0.1 while the block runs."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            receiver.received(ExportTraceServiceRequest.FromString(body))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = OtlpReceiver(server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
