"""Traces: one transition is one trace, from the API request across the queue to the provider.

The API accepts in this process and the worker claims afterwards, as another process
would: what joins them is the acceptance's traceparent stored with the execution.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy import Engine

from orquestador import tracing
from orquestador.api.app import create_app
from orquestador.config import Settings
from tests.db_support import TestDatabase
from tests.integration.api_support import ORG, SECRET, Api, running_api
from tests.integration.automation_support import AUTOMATION_SCOPES, moment_flow
from tests.integration.log_support import json_lines  # noqa: F401
from tests.integration.notice_support import outbox, set_preferences
from tests.integration.route_provider import Answer, RouteProvider
from tests.integration.route_support import billing_route, fast_executor, route_registry
from tests.integration.worker_support import (
    action,
    execution,
    flow_definition,
    make_due,
    run_once,
    wait_until,
)
from tests.smtp_sink import running_sink
from tests.trace_support import (
    OtlpReceiver,
    hex_span_id,
    hex_trace_id,
    one_span,
    recorded_spans,  # noqa: F401  (a fixture)
    spans_sampled_at_zero,  # noqa: F401  (a fixture)
)

ROOT = Path(__file__).resolve().parents[2]
TRANSITIONS_ROUTE = "/api/v1/requests/<uuid:request_id>/transitions"


def _lines(stream: io.StringIO, message: str) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    return [record for record in records if record["message"] == message]


def _charge_through_the_api(api: Api) -> str:
    """Publish a one-step flow calling the route, create a request, ask for its transition."""
    flow = api.publish(
        flow_definition([action("charge", "billing.invoice", input={"amount": {"const": 42}})])
    )
    created = api.create_request(flow["id"], {})
    accepted = api.transition(created["id"], "go", created["revision"])
    assert accepted.status_code == 202, accepted.get_data(as_text=True)
    return accepted.get_json()["executionId"]


def test_one_transition_is_one_trace_from_the_request_to_the_provider(
    database: TestDatabase,
    runtime_engine: Engine,
    tmp_path: Path,
    recorded_spans: InMemorySpanExporter,  # noqa: F811
    json_lines: io.StringIO,  # noqa: F811
) -> None:
    with RouteProvider().serve() as provider:
        registry = route_registry(tmp_path, provider.url, billing_route())
        with running_api(database.runtime_dsn, registry=registry) as api:
            execution_id = _charge_through_the_api(api)
            assert run_once(runtime_engine, fast_executor(registry)) == "SUCCEEDED"
            view = api.get(f"/executions/{execution_id}").get_json()
        (sent,) = provider.writes()

    spans = recorded_spans.get_finished_spans()
    request = next(s for s in spans if s.attributes.get("http.route") == TRANSITIONS_ROUTE)
    accept = one_span(spans, "transition.accept")
    claim = one_span(spans, "execution.claim")
    attempt = one_span(spans, "action.attempt")
    call = one_span(spans, "route.call")
    # One trace, each span the child of the one before: the queue in between included.
    trace_id = request.context.trace_id
    assert {s.context.trace_id for s in (accept, claim, attempt, call)} == {trace_id}
    assert request.parent is None
    assert accept.parent.span_id == request.context.span_id
    assert claim.parent.span_id == accept.context.span_id
    assert attempt.parent.span_id == claim.context.span_id
    assert call.parent.span_id == attempt.context.span_id

    assert request.name == f"POST {TRANSITIONS_ROUTE}"
    assert request.kind is SpanKind.SERVER
    assert request.attributes["http.request.method"] == "POST"
    assert request.attributes["http.response.status_code"] == 202
    assert accept.attributes["orquestador.execution_id"] == execution_id
    assert accept.attributes["orquestador.transition_id"] == "go"
    assert claim.attributes["orquestador.execution_id"] == execution_id
    assert claim.attributes["orquestador.status"] == "SUCCEEDED"
    assert dict(attempt.attributes) == {
        "orquestador.action_id": "charge",
        "orquestador.capability": "billing.invoice@1",
        "orquestador.effect": "IDEMPOTENT_WRITE",
        "orquestador.attempt": 1,
        "orquestador.outcome": "succeeded",
    }
    assert call.kind is SpanKind.CLIENT
    assert call.attributes["orquestador.route"] == "billing.invoice@1"
    assert call.attributes["http.response.status_code"] == 201

    # The provider was told the call's own span, in the same trace.
    version, sent_trace, sent_parent, _flags = sent.headers["traceparent"].split("-")
    assert (version, sent_trace, sent_parent) == ("00", hex_trace_id(call), hex_span_id(call))
    # What crossed the queue is the acceptance's span.
    stored = execution(runtime_engine, execution_id).trace_parent
    assert stored.split("-")[1:3] == [hex_trace_id(accept), hex_span_id(accept)]
    # And the execution's view names the trace, to find it by in a tracing backend.
    assert view["traceId"] == hex_trace_id(request)

    # Log lines name the trace and the span they were written in, on either side.
    (accepted_line,) = _lines(json_lines, "transition accepted")
    assert accepted_line["trace_id"] == hex_trace_id(request)
    assert accepted_line["span_id"] == hex_span_id(request)
    (answered_line,) = _lines(json_lines, "route answered")
    assert (answered_line["trace_id"], answered_line["span_id"]) == (
        hex_trace_id(call),
        hex_span_id(call),
    )


def test_a_retry_by_a_later_holder_stays_in_the_same_trace(
    database: TestDatabase,
    runtime_engine: Engine,
    tmp_path: Path,
    recorded_spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    with RouteProvider().serve() as provider:
        provider.then(Answer(503, {}))
        registry = route_registry(tmp_path, provider.url, billing_route())
        with running_api(database.runtime_dsn, registry=registry) as api:
            execution_id = _charge_through_the_api(api)
        executor = fast_executor(registry)
        assert run_once(runtime_engine, executor) == "RETRY_WAIT"
        make_due(runtime_engine, execution_id)
        assert run_once(runtime_engine, executor) == "SUCCEEDED"

    spans = recorded_spans.get_finished_spans()
    accept = one_span(spans, "transition.accept")
    claims = [s for s in spans if s.name == "execution.claim"]
    attempts = [s for s in spans if s.name == "action.attempt"]
    assert [c.attributes["orquestador.status"] for c in claims] == ["RETRY_WAIT", "SUCCEEDED"]
    assert all(c.parent.span_id == accept.context.span_id for c in claims)
    assert [
        (a.attributes["orquestador.attempt"], a.attributes["orquestador.outcome"]) for a in attempts
    ] == [
        (1, "retry"),
        (2, "succeeded"),
    ]
    # (The flow's publishing and the request's creation are traces of their own.)
    calls = [s for s in spans if s.name == "route.call"]
    assert [c.attributes["http.response.status_code"] for c in calls] == [503, 201]
    assert [c.parent.span_id for c in calls] == [a.context.span_id for a in attempts]
    assert {s.context.trace_id for s in claims + attempts + calls} == {accept.context.trace_id}


def test_the_product_exports_its_spans_to_an_otlp_http_receiver(
    database: TestDatabase, runtime_engine: Engine, tmp_path: Path
) -> None:
    with OtlpReceiver().serve() as receiver, RouteProvider().serve() as provider:
        registry = route_registry(tmp_path, provider.url, billing_route())
        settings = Settings.from_env(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "billing-api"},
            database_url=database.runtime_dsn,
            request_api_enabled=True,
            flow_admin_enabled=True,
            jwt_secret=SECRET,
        )
        try:
            api = Api(create_app(settings, registry=registry), settings)
            assert tracing.enabled()
            try:
                execution_id = _charge_through_the_api(api)
            finally:
                api.dispose()
            assert run_once(runtime_engine, fast_executor(registry)) == "SUCCEEDED"
        finally:
            # What the batch still holds goes out now, as at the end of a process.
            tracing.shutdown()
        assert receiver.received.wait(10)
        spans = receiver.spans()

    assert set(receiver.paths) == {"/v1/traces"}
    assert {service for service, _span in spans} == {"billing-api"}
    names = [span.name for _service, span in spans]
    for name in ("transition.accept", "execution.claim", "action.attempt", "route.call"):
        assert names.count(name) == 1, names
    assert f"POST {TRANSITIONS_ROUTE}" in names
    by_name = {span.name: span for _service, span in spans}
    claim = by_name["execution.claim"]
    assert claim.trace_id == by_name["transition.accept"].trace_id
    assert claim.parent_span_id == by_name["transition.accept"].span_id
    attributes = {a.key: a.value.string_value for a in claim.attributes}
    assert attributes["orquestador.execution_id"] == execution_id
    assert not tracing.enabled()


def test_with_no_endpoint_nothing_is_traced_nor_stored(
    database: TestDatabase, runtime_engine: Engine, tmp_path: Path
) -> None:
    with OtlpReceiver().serve() as receiver, RouteProvider().serve() as provider:
        registry = route_registry(tmp_path, provider.url, billing_route())
        with running_api(database.runtime_dsn, registry=registry) as api:
            assert not tracing.enabled()
            execution_id = _charge_through_the_api(api)
            assert run_once(runtime_engine, fast_executor(registry)) == "SUCCEEDED"
            assert "traceId" not in api.get(f"/executions/{execution_id}").get_json()
        (sent,) = provider.writes()
        tracing.shutdown()
    assert tracing.span("action.attempt") is tracing.NO_SPAN
    assert "traceparent" not in sent.headers
    assert execution(runtime_engine, execution_id).trace_parent is None
    assert not receiver.received.is_set() and receiver.exports == []


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def test_a_worker_process_continues_the_trace_to_the_email_and_exports_it_at_shutdown(
    database: TestDatabase,
    runtime_engine: Engine,
    recorded_spans: InMemorySpanExporter,  # noqa: F811
    processes: list[subprocess.Popen[bytes]],
) -> None:
    # The API accepts here (its spans kept in memory); a worker process, configured
    # only by its environment, claims it and exports its own spans over OTLP/HTTP.
    set_preferences(runtime_engine, ORG)
    inputs = {"title": {"const": "Reinstall finished"}, "body": {"const": "m-1 is back."}}
    with running_api(database.runtime_dsn) as api:
        flow = api.publish(flow_definition([action("tell", "notify", input=inputs, email=True)]))
        created = api.create_request(flow["id"], {})
        accepted = api.transition(created["id"], "go", created["revision"])
        assert accepted.status_code == 202, accepted.get_data(as_text=True)
    accept = one_span(recorded_spans.get_finished_spans(), "transition.accept")

    with OtlpReceiver().serve() as receiver, running_sink() as sink:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "WORKER_ENABLED": "true",
            "DATABASE_URL": database.runtime_dsn,
            "WORKER_POLL_MS": "100",
            "WORKER_DRAIN_SECONDS": "2",
            "SMTP_URL": sink.url,
            "SMTP_FROM": "orquestador@example.com",
            "LOG_LEVEL": "WARNING",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        }
        env.pop("OTEL_SERVICE_NAME", None)
        worker = subprocess.Popen([sys.executable, "-m", "orquestador.worker"], cwd=ROOT, env=env)
        processes.append(worker)
        sink.wait_for(1, timeout=60)
        wait_until(lambda: outbox(runtime_engine)[0].status == "sent", timeout=30, what="sent")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        spans = {span.name: (service, span) for service, span in receiver.spans()}

    assert {service for service, _span in spans.values()} == {"orquestador-worker"}
    claim, attempt, email = (
        spans[n][1] for n in ("execution.claim", "action.attempt", "email.send")
    )
    trace_id = accept.context.trace_id.to_bytes(16, "big")
    assert claim.trace_id == attempt.trace_id == email.trace_id == trace_id
    assert claim.parent_span_id == accept.context.span_id.to_bytes(8, "big")
    assert attempt.parent_span_id == claim.span_id
    # The mailer delivered later, from the outbox row: still the step's trace.
    assert email.parent_span_id == attempt.span_id
    outcome = {a.key: a.value.string_value for a in email.attributes}["orquestador.outcome"]
    assert outcome == "delivered"


def test_a_platform_event_starts_the_trace_its_execution_continues(
    database: TestDatabase,
    runtime_engine: Engine,
    recorded_spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    with running_api(database.runtime_dsn) as api:
        headers = api.headers(scopes=AUTOMATION_SCOPES)
        client = api.client()
        client.put("/api/v1/plans/vps", json={"name": "vps"}, headers=headers)
        flow_id = api.publish(moment_flow(), scopes=AUTOMATION_SCOPES)["id"]
        bound = client.put(
            "/api/v1/plans/vps/bindings/provisioned", json={"flowId": flow_id}, headers=headers
        )
        assert bound.status_code == 200, bound.get_data(as_text=True)
        event = {"id": "evt-1", "moment": "provisioned", "planId": "vps", "machineId": "m-42"}
        answered = client.post("/api/v1/events", json=event, headers=headers)
        assert answered.status_code == 202, answered.get_data(as_text=True)

    spans = recorded_spans.get_finished_spans()
    request = next(s for s in spans if s.attributes.get("http.route") == "/api/v1/events")
    start = one_span(spans, "event.start")
    assert start.parent.span_id == request.context.span_id
    assert start.attributes["orquestador.event_id"] == "evt-1"
    stored = execution(runtime_engine, answered.get_json()["executionId"]).trace_parent
    assert stored.split("-")[1:3] == [hex_trace_id(start), hex_span_id(start)]


# Another tenant's trace, sampled, with what a caller might try to slip onto our spans.
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
HOSTILE = {
    "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
    "tracestate": "probe=ana@example.com",
    "baggage": "user=ana@example.com",
}


def _charge_with_headers(api: Api, headers: dict[str, str]) -> str:
    """_charge_through_the_api, the transition sent with HEADERS besides the token."""
    flow = api.publish(
        flow_definition([action("charge", "billing.invoice", input={"amount": {"const": 42}})])
    )
    created = api.create_request(flow["id"], {})
    accepted = api.client().post(
        f"/api/v1/requests/{created['id']}/transitions",
        json={"transition": "go", "expectedRevision": created["revision"]},
        headers={**api.headers(), **headers},
    )
    assert accepted.status_code == 202, accepted.get_data(as_text=True)
    return accepted.get_json()["executionId"]


def test_a_callers_sampled_flag_does_not_override_a_sampler_that_keeps_nothing(
    database: TestDatabase,
    runtime_engine: Engine,
    tmp_path: Path,
    spans_sampled_at_zero: InMemorySpanExporter,  # noqa: F811
) -> None:
    with RouteProvider().serve() as provider:
        registry = route_registry(tmp_path, provider.url, billing_route())
        with running_api(database.runtime_dsn, registry=registry) as api:
            execution_id = _charge_with_headers(api, HOSTILE)
            assert run_once(runtime_engine, fast_executor(registry)) == "SUCCEEDED"
        (sent,) = provider.writes()

    # Not a span of the request, its acceptance, claim, attempt or call is exported.
    assert spans_sampled_at_zero.get_finished_spans() == ()
    stored = execution(runtime_engine, execution_id).trace_parent
    # What the worker continues is our own root, not sampled (flags' lowest bit).
    assert CALLER_TRACE not in stored and int(stored.split("-")[3], 16) & 1 == 0
    assert CALLER_TRACE not in sent.headers.get("traceparent", "")


def test_a_callers_traceparent_is_only_a_link_from_a_trace_of_our_own(
    database: TestDatabase,
    runtime_engine: Engine,
    tmp_path: Path,
    recorded_spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    with RouteProvider().serve() as provider:
        registry = route_registry(tmp_path, provider.url, billing_route())
        with running_api(database.runtime_dsn, registry=registry) as api:
            _charge_with_headers(api, HOSTILE)
            assert run_once(runtime_engine, fast_executor(registry)) == "SUCCEEDED"
        (sent,) = provider.writes()

    spans = recorded_spans.get_finished_spans()
    request = next(s for s in spans if s.attributes.get("http.route") == TRANSITIONS_ROUTE)
    assert request.parent is None and hex_trace_id(request) != CALLER_TRACE
    (link,) = request.links
    assert (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") == (
        CALLER_TRACE,
        CALLER_SPAN,
    )
    # The acceptance, the claim across the queue, the attempt and the call: our trace.
    assert {s.context.trace_id for s in spans if s.name != "POST /api/v1/flows"} >= {
        request.context.trace_id
    }
    call = one_span(spans, "route.call")
    assert call.context.trace_id == request.context.trace_id
    assert sent.headers["traceparent"].split("-")[1] == hex_trace_id(request)
    # Neither tracestate nor baggage reaches a span, a link or the provider.
    assert "tracestate" not in sent.headers and "baggage" not in sent.headers
    for span in spans:
        assert not span.context.trace_state and "ana@example.com" not in repr(span.to_json())


def test_a_trusted_proxys_traceparent_is_continued_without_its_tracestate(
    database: TestDatabase,
    runtime_engine: Engine,
    tmp_path: Path,
    recorded_spans: InMemorySpanExporter,  # noqa: F811
) -> None:
    with RouteProvider().serve() as provider:
        registry = route_registry(tmp_path, provider.url, billing_route())
        # The test client's peer is 127.0.0.1.
        with running_api(
            database.runtime_dsn, registry=registry, trusted_proxies="127.0.0.1"
        ) as api:
            _charge_with_headers(api, HOSTILE)
            assert run_once(runtime_engine, fast_executor(registry)) == "SUCCEEDED"
        (sent,) = provider.writes()

    spans = recorded_spans.get_finished_spans()
    request = next(s for s in spans if s.attributes.get("http.route") == TRANSITIONS_ROUTE)
    assert hex_trace_id(request) == CALLER_TRACE
    assert f"{request.parent.span_id:016x}" == CALLER_SPAN and not request.links
    assert sent.headers["traceparent"].split("-")[1] == CALLER_TRACE
    assert "tracestate" not in sent.headers
    assert all(not span.context.trace_state for span in spans)
