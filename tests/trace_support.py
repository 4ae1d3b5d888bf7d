"""Traces in tests: an in-memory exporter in place of OTLP, and a real OTLP/HTTP receiver.

`recorded_spans` turns tracing on for one test with the SDK's InMemorySpanExporter
(every span is kept as it ends) and off again afterwards; `spans_sampled_at_zero` does
the same with a sampler that keeps nothing. `OtlpReceiver` is a small
HTTP server on 127.0.0.1 that accepts `POST /v1/traces` as a collector does and
decodes each body (protobuf, `ExportTraceServiceRequest`).
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from orquestador import tracing


@pytest.fixture
def recorded_spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on for this test; the exporter holds every span that ended."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_provider(None)
        provider.shutdown()


@pytest.fixture
def spans_sampled_at_zero(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Tracing on with the sampler an operator set to keep no trace (the SDK reads it from
    OTEL_TRACES_SAMPLER, as the provider `tracing.configure` makes does)."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_provider(None)
        provider.shutdown()


def one_span(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, [span.name for span in spans]
    return found[0]


def hex_trace_id(span: ReadableSpan) -> str:
    return f"{span.context.trace_id:032x}"


def hex_span_id(span: ReadableSpan) -> str:
    return f"{span.context.span_id:016x}"


class OtlpReceiver:
    """What a collector received over OTLP/HTTP, decoded; `received` is set on each export."""

    def __init__(self) -> None:
        self.exports: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        self.received = threading.Event()
        self.url = ""
        self._lock = threading.Lock()

    @contextmanager
    def serve(self) -> Iterator[OtlpReceiver]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                export = ExportTraceServiceRequest()
                export.ParseFromString(body)
                with receiver._lock:
                    receiver.paths.append(self.path)
                    receiver.exports.append(export)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()
                receiver.received.set()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        self.url = f"http://127.0.0.1:{server.server_port}"
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()
            thread.join()

    def spans(self) -> list[tuple[str, Any]]:
        """(service.name, span) for every span received, in the order received."""
        with self._lock:
            exports = list(self.exports)
        found = []
        for export in exports:
            for resource_spans in export.resource_spans:
                service = next(
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                )
                for scope_spans in resource_spans.scope_spans:
                    found += [(service, span) for span in scope_spans.spans]
        return found


# Attributes a trace's line shows after the span's name, in this order.
_SHOWN = ("orquestador.action_id", "orquestador.capability")
_ENDED = ("http.response.status_code", "orquestador.status", "orquestador.outcome")


def trace_tree(spans: list[Any], trace_id: str) -> list[str]:
    """One line per span of the trace (OTLP spans as received): its name, the action and
    capability of an attempt, how it ended in parentheses; children indented under their
    parent in the order they started."""
    mine = [span for span in spans if span.trace_id.hex() == trace_id]
    ids = {span.span_id for span in mine}
    children: dict[bytes, list[Any]] = {}
    for span in sorted(mine, key=lambda span: span.start_time_unix_nano):
        parent = span.parent_span_id if span.parent_span_id in ids else b""
        children.setdefault(parent, []).append(span)
    lines: list[str] = []

    def walk(parent: bytes, depth: int) -> None:
        for span in children.get(parent, []):
            values = {a.key: _attribute(a.value) for a in span.attributes}
            words = [span.name, *(str(values[key]) for key in _SHOWN if key in values)]
            ended = [str(values[key]) for key in _ENDED if key in values]
            lines.append("  " * depth + " ".join(words) + (f" ({ended[0]})" if ended else ""))
            walk(span.span_id, depth + 1)

    walk(b"", 0)
    return lines


def _attribute(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value"))
