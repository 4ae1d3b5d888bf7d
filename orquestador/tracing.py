"""Traces: OpenTelemetry spans when OTEL_EXPORTER_OTLP_ENDPOINT is set, nothing when it is not.

The only module that imports OpenTelemetry, and only once tracing is turned on: the SDK
and its OTLP exporter are an optional extra (`orquestador[otel]`). Off, every function
here answers at once (a span is one shared object that does nothing), so the worker's
hot paths pay a function call and no more.

A trace crosses the queue through the W3C `traceparent` of the acceptance, stored with
the execution (and with an e-mail's outbox row): the worker that claims it later, in
another process, continues the same trace from there. A trace starts at the API's own
request span: a caller's `traceparent` is linked to, never continued (but from a trusted
proxy), so the configured sampler decides and no caller picks the trace id.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from orquestador.config import Settings

log = logging.getLogger(__name__)

# Values other than str, int, float and bool (a UUID) are written as text, and only once
# tracing is on: callers hand their values over as they are, at no cost while it is off.
Attributes = Mapping[str, Any]
T = TypeVar("T")
R = TypeVar("R")

# The W3C header (and stored column) that carries a span's context to whoever continues it.
TRACEPARENT = "traceparent"


class _NoSpan:
    """The span handed out while tracing is off: enters, records and ends nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_attribute(self, key: str, value: Any) -> None:
        return None


NO_SPAN = _NoSpan()

# Set once tracing is on in this process; None: off.
_tracer: Tracer | None = None
_provider: TracerProvider | None = None
_lock = threading.Lock()


def configure(settings: Settings, default_service: str) -> bool:
    """Turn tracing on in this process when OTEL_EXPORTER_OTLP_ENDPOINT is set; True if on.

    The service is OTEL_SERVICE_NAME, else `default_service` (orquestador-api,
    orquestador-worker). Spans are batched and exported over OTLP/HTTP to
    `<endpoint>/v1/traces`; what is still batched is flushed when the process exits.
    Without the `otel` extra installed, tracing stays off and one warning says why.
    """
    endpoint = settings.otel_exporter_otlp_endpoint
    if not endpoint or _tracer is not None:
        return _tracer is not None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed "
            "(pip install 'orquestador[otel]'): no traces are exported"
        )
        return False
    service = settings.otel_service_name or default_service
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter))
    use_provider(provider)
    log.info("traces exported", extra={"endpoint": endpoint, "service": service})
    return True


def use_provider(provider: TracerProvider | None) -> None:
    """Trace through `provider` from now on (None: off again); `configure` calls it, tests too."""
    global _tracer, _provider
    with _lock:
        _provider = provider
        _tracer = provider.get_tracer("orquestador") if provider is not None else None


def enabled() -> bool:
    return _tracer is not None


def shutdown() -> None:
    """Export what is still batched and stop; tracing is off afterwards."""
    provider = _provider
    use_provider(None)
    if provider is not None:
        provider.shutdown()


def span(
    name: str,
    attributes: Attributes | None = None,
    *,
    parent: str | None = None,
    kind: str = "internal",
) -> AbstractContextManager[Any]:
    """A span around the `with` block, current inside it; NO_SPAN while tracing is off.

    `parent`: a stored `traceparent` to continue (the acceptance's, in the worker);
    None: the current span, if any. `kind`: internal, server, client or consumer.
    Exceptions that leave the block are not errors by themselves (the worker ends a
    run by raising): outcomes are attributes the code sets.
    """
    tracer = _tracer
    if tracer is None:
        return NO_SPAN
    return tracer.start_as_current_span(
        name,
        context=_extract(parent) if parent else None,
        kind=_kind(kind),
        attributes=_values(attributes),
        record_exception=False,
        set_status_on_exception=False,
    )


def note(key: str, value: Any) -> None:
    """Set an attribute on the current span (none while tracing is off)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attribute(key, _value(value))


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the current span, to store for whoever continues; or None."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    inject_headers(carrier)
    return carrier.get(TRACEPARENT)


def inject_headers(headers: dict[str, str]) -> None:
    """Add the current span's `traceparent` (and `tracestate`) to outgoing headers."""
    if _tracer is None:
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    TraceContextTextMapPropagator().inject(headers)


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span as hex, for log lines; None without one."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)


def carried(function: Callable[[T], R]) -> Callable[[T], R]:
    """`function`, to run on another thread inside the caller's current span.

    Threads do not inherit context variables; an adapter's call thread must, so that
    its spans (an HTTP route's) and the `traceparent` it sends are the attempt's.
    """
    if _tracer is None:
        return function
    context = contextvars.copy_context()

    def in_context(argument: T) -> R:
        return context.run(function, argument)

    return in_context


@contextmanager
def request_span(
    name: str,
    headers: Mapping[str, str],
    attributes: Attributes,
    *,
    trusted_caller: bool = False,
) -> Iterator[Span | _NoSpan]:
    """A server span for one API request: the root of a trace of its own.

    A caller's `traceparent` is its word only: anyone reaching the port could join
    another tenant's trace (its id would go on to the providers) or, with the sampled
    flag, have every span of its transition exported whatever the sampler says. So it is
    kept as a link (a tracing backend still finds the caller's trace from ours) and the
    configured sampler decides on the new root. From one of TRUSTED_PROXIES
    (`trusted_caller`), which sets its own, the span continues it instead. `tracestate`
    and baggage are never read: a header's value goes on no span.
    """
    tracer = _tracer
    if tracer is None:
        yield NO_SPAN
        return
    from opentelemetry import trace
    from opentelemetry.context import Context

    caller = _caller_span_context(headers.get(TRACEPARENT))
    if caller is not None and trusted_caller:
        context, links = trace.set_span_in_context(trace.NonRecordingSpan(caller)), None
    else:
        # An empty context, not the current one: nothing of the caller's is a parent.
        context, links = Context(), [trace.Link(caller)] if caller is not None else None
    with tracer.start_as_current_span(
        name,
        context=context,
        kind=_kind("server"),
        attributes=_values(attributes),
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        yield current


def _caller_span_context(traceparent: str | None) -> Any:
    """The span context a W3C `traceparent` names (no trace state), or None if invalid."""
    if not traceparent:
        return None
    from opentelemetry import trace

    context = trace.get_current_span(_extract(traceparent)).get_span_context()
    return context if context.is_valid else None


def _values(attributes: Attributes | None) -> dict[str, str | int | float | bool] | None:
    if attributes is None:
        return None
    return {key: _value(value) for key, value in attributes.items()}


def _value(value: Any) -> str | int | float | bool:
    return value if isinstance(value, str | int | float | bool) else str(value)


def _extract(traceparent: str) -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({TRACEPARENT: traceparent})


def _kind(kind: str) -> Any:
    from opentelemetry.trace import SpanKind

    return SpanKind[kind.upper()]


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a stored W3C `traceparent` (`00-<trace id>-<span id>-<flags>`), or
    None; read without OpenTelemetry, so the API shows it whether tracing is on or off."""
    parts = (traceparent or "").split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or parts[1] == "0" * 32:
        return None
    trace_id = parts[1].lower()
    return trace_id if all(c in "0123456789abcdef" for c in trace_id) else None
