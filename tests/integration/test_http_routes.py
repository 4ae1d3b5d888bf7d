"""HTTP routes against a real provider double: every outcome class, idempotency, SSRF, secrets.

The double is an HTTP server on 127.0.0.1 that deduplicates by Idempotency-Key and
counts the effects it performs; routes are read from a TOML file as an operator
writes it, and the worker's executor runs them.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from orquestador.actions import ActionContext, Identity
from orquestador.actions.errors import PermanentError, TransientError, UncertainError
from orquestador.actions.lookup import Found, NotFound
from orquestador.errors import IntegrationUnavailable
from orquestador.integrations import http_adapter
from orquestador.integrations.http_adapter import parse_retry_after
from tests.integration.route_provider import (
    BIG,
    HANG,
    REDIRECT,
    RESET_AFTER_COMMIT,
    Answer,
    RouteProvider,
)
from tests.integration.route_support import (
    LOOKUP,
    SECRET,
    billing_route,
    fast_executor,
    route_registry,
)
from tests.integration.worker_support import (
    action,
    audit,
    checkpoints,
    execution,
    flow_definition,
    make_due,
    run_once,
    start_execution,
)


def _adapter(tmp_path: Path, provider_url: str, toml: str):
    (adapter,) = route_registry(tmp_path, provider_url, toml).adapters()
    return adapter


def _ctx(inputs: dict[str, Any], key: str = "exec-1:charge", seconds: float = 1.0) -> ActionContext:
    return ActionContext(
        inputs=inputs,
        external_key=key,
        attempt=1,
        deadline=time.monotonic() + seconds,
        identity=Identity("org", "req", "exec"),
    )


def _flow(path_input: dict[str, Any] | None = None) -> dict[str, Any]:
    inputs = {"amount": {"const": 42}, **(path_input or {})}
    return flow_definition([action("charge", "billing.invoice", input=inputs)])


# --- outcome classes, one call each --------------------------------------------------


def test_a_body_template_builds_the_body_from_the_inputs(tmp_path):
    template = 'body = { total = { from = "/amount" }, currency = { const = "EUR" } }'
    with RouteProvider().serve() as provider:
        adapter = _adapter(tmp_path, provider.url, billing_route(extra=template))
        adapter.invoke(_ctx({"amount": 42, "note": "kept out of the body"}))
        (sent,) = provider.received
    assert json.loads(sent.body) == {"total": 42, "currency": "EUR"}


def test_a_body_template_whose_pointer_misses_refuses_before_sending(tmp_path):
    template = 'body = { total = { from = "/missing" } }'
    with RouteProvider().serve() as provider:
        adapter = _adapter(tmp_path, provider.url, billing_route(extra=template))
        with pytest.raises(PermanentError) as refused:
            adapter.invoke(_ctx({"amount": 42}))
        assert provider.received == []
    assert refused.value.code == "INPUT_INVALID"


def test_2xx_maps_the_answer_and_sends_key_body_and_headers(tmp_path):
    with RouteProvider().serve() as provider:
        adapter = _adapter(tmp_path, provider.url, billing_route())
        output = adapter.invoke(_ctx({"amount": 42}))
        (sent,) = provider.received
    assert output == {"id": "inv-1", "status": "draft"}
    assert (sent.method, sent.path, sent.host) == (
        "POST",
        "/v1/invoices",
        f"127.0.0.1:{provider.port}",
    )
    assert sent.headers["Idempotency-Key"] == "exec-1:charge"
    assert sent.headers["Authorization"] == f"Bearer {SECRET}"
    assert json.loads(sent.body) == {"amount": 42}


def test_the_attempts_deadline_goes_with_the_request(tmp_path):
    with RouteProvider().serve() as provider:
        adapter = _adapter(tmp_path, provider.url, billing_route())
        before = datetime.now(UTC)
        adapter.invoke(_ctx({"amount": 42}, seconds=30))
        (sent,) = provider.received
    # RFC 3339 in UTC: a provider may refuse a request that arrives after it.
    deadline = datetime.fromisoformat(sent.headers["Request-Deadline"].replace("Z", "+00:00"))
    assert timedelta(seconds=29) < deadline - before <= timedelta(seconds=31)
    assert sent.headers["Request-Deadline"].endswith("Z")


def test_a_call_paused_past_its_deadline_on_its_way_out_is_not_sent(tmp_path, monkeypatch):
    # A worker frozen after the call began (a GC pause, a frozen VM) must not send once
    # its deadline passed: another holder may have looked the write up meanwhile.
    ctx = _ctx({"amount": 42}, seconds=0.3)
    pooled = http_adapter.session_for

    def paused_on_the_way(use_environment_proxy: bool):
        time.sleep(max(0.0, ctx.deadline - time.monotonic()) + 0.05)
        return pooled(use_environment_proxy)

    monkeypatch.setattr(http_adapter, "session_for", paused_on_the_way)
    with RouteProvider().serve() as provider:
        adapter = _adapter(tmp_path, provider.url, billing_route())
        with pytest.raises(TransientError) as refused:
            adapter.invoke(ctx)
        assert provider.received == [], "a request left after its deadline"
    assert "deadline passed" in str(refused.value)


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504])
def test_transient_statuses_raise_transient_with_retry_after(tmp_path, status):
    with RouteProvider().serve() as provider:
        provider.then(Answer(status, {}, {"Retry-After": "7"}))
        adapter = _adapter(tmp_path, provider.url, billing_route())
        with pytest.raises(TransientError) as raised:
            adapter.invoke(_ctx({"amount": 1}))
    assert raised.value.retry_after == 7.0
    assert str(raised.value) == f"route billing.invoice@1: HTTP {status}"
    assert provider.effects == {}


def test_retry_after_as_an_http_date():
    in_a_minute = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 60))
    assert 55 <= parse_retry_after(in_a_minute) <= 61
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert parse_retry_after("soon") is None


def test_connection_refused_before_sending_is_transient(tmp_path):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    adapter = _adapter(tmp_path, f"http://127.0.0.1:{port}", billing_route())
    with pytest.raises(TransientError, match="connection refused"):
        adapter.invoke(_ctx({"amount": 1}))


def test_a_hang_past_the_timeout_is_uncertain(tmp_path):
    with RouteProvider().serve() as provider:
        provider.then(HANG)
        adapter = _adapter(tmp_path, provider.url, billing_route())
        with pytest.raises(UncertainError):
            adapter.invoke(_ctx({"amount": 1}, seconds=0.5))


def test_a_reset_after_the_effect_is_uncertain(tmp_path):
    with RouteProvider().serve() as provider:
        provider.then(RESET_AFTER_COMMIT)
        adapter = _adapter(tmp_path, provider.url, billing_route())
        with pytest.raises(UncertainError):
            adapter.invoke(_ctx({"amount": 1}))
    assert provider.effects == {"exec-1:charge": 1}


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        (Answer(422, {"title": "bad"}), "HTTP_422"),
        (Answer(404, None), "HTTP_404"),
        (Answer(402, {"code": "card_declined"}), "card_declined"),
        (Answer(400, {"code": "no spaces allowed here"}), "HTTP_400"),
    ],
)
def test_other_4xx_are_permanent_with_a_useful_code(tmp_path, answer, code):
    with RouteProvider().serve() as provider:
        provider.then(answer)
        adapter = _adapter(tmp_path, provider.url, billing_route())
        with pytest.raises(PermanentError) as raised:
            adapter.invoke(_ctx({"amount": 1}))
    assert raised.value.code == code


def test_redirects_are_not_followed(tmp_path):
    with RouteProvider().serve() as provider:
        provider.then(REDIRECT)
        adapter = _adapter(tmp_path, provider.url, billing_route())
        with pytest.raises(PermanentError) as raised:
            adapter.invoke(_ctx({"amount": 1}))
        assert len(provider.received) == 1
    assert raised.value.code == "HTTP_302"


def test_answers_past_one_mebibyte_are_cut(tmp_path):
    with RouteProvider().serve() as provider:
        provider.then(BIG)
        adapter = _adapter(tmp_path, provider.url, billing_route())
        with pytest.raises(UncertainError, match="larger than 1 MiB"):
            adapter.invoke(_ctx({"amount": 1}))


def test_environment_proxies_are_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with RouteProvider().serve() as provider:
        adapter = _adapter(tmp_path, provider.url, billing_route())
        assert adapter.invoke(_ctx({"amount": 1}))["id"] == "inv-1"


def test_lookup_finds_the_keyed_write_or_not(tmp_path):
    with RouteProvider().serve() as provider:
        adapter = _adapter(tmp_path, provider.url, billing_route("NON_IDEMPOTENT_WRITE", LOOKUP))
        assert adapter.lookup(_ctx({"amount": 1}, key="e:a")) == NotFound()
        adapter.invoke(_ctx({"amount": 1}, key="e:a"))
        assert adapter.lookup(_ctx({"amount": 1}, key="e:a")) == Found(
            {"id": "inv-1", "status": "draft"}
        )
        looked = [r for r in provider.received if r.method == "GET"]
    assert looked[-1].path == "/v1/invoices?idempotency_key=e%3Aa"


# --- SSRF: inputs never leave the configured host and path ---------------------------

ATTEMPTS = [
    "../admin",
    "..%2Fadmin",
    "a/../../admin",
    "evil@127.0.0.2",
    "x#fragment",
    "a%2Fb",
    "http://127.0.0.2:80/steal",
    "//127.0.0.2/steal",
    "ok\r\nHost: 127.0.0.2",
    "a?admin=true",
    "a b",
]


@pytest.mark.parametrize("value", ATTEMPTS)
def test_inputs_in_the_path_stay_inside_one_segment(tmp_path, value):
    toml = billing_route(path="/v1/customers/{customer}/invoices")
    with RouteProvider().serve() as provider:
        adapter = _adapter(tmp_path, provider.url, toml)
        adapter.invoke(_ctx({"amount": 1, "customer": value}))
        (sent,) = provider.received
    assert sent.host == f"127.0.0.1:{provider.port}"
    assert sent.path.startswith("/v1/customers/")
    assert sent.path.endswith("/invoices")
    segment = sent.path[len("/v1/customers/") : -len("/invoices")]
    assert "/" not in segment and "?" not in segment and "#" not in segment
    assert "\r" not in segment and "\n" not in segment and " " not in segment


@pytest.mark.parametrize("value", ["..", ".", ""])
def test_dot_segments_are_refused_before_sending(tmp_path, value):
    toml = billing_route(path="/v1/customers/{customer}/invoices")
    with RouteProvider().serve() as provider:
        adapter = _adapter(tmp_path, provider.url, toml)
        with pytest.raises(PermanentError) as raised:
            adapter.invoke(_ctx({"amount": 1, "customer": value}))
        assert provider.received == []
    assert raised.value.code == "INPUT_INVALID"


# --- through the worker: retries, Retry-After, exactly one effect ----------------------


def test_a_transient_answer_then_success_runs_once_at_the_provider(runtime_engine, tmp_path):
    with RouteProvider().serve() as provider:
        provider.then(Answer(503, {}))
        executor = fast_executor(route_registry(tmp_path, provider.url, billing_route()))
        eid = start_execution(runtime_engine, _flow())
        assert run_once(runtime_engine, executor) == "RETRY_WAIT"
        make_due(runtime_engine, eid)
        assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert provider.effects == {f"{eid}:charge": 1}
    keys = {r.headers["Idempotency-Key"] for r in provider.received}
    assert keys == {f"{eid}:charge"}
    assert checkpoints(runtime_engine, eid)["charge"].output == {"id": "inv-1", "status": "draft"}


@pytest.mark.parametrize(("header", "low", "high"), [("3600", 4.9, 5.1), ("0", 1.9, 2.1)])
def test_retry_after_is_honoured_and_clamped(runtime_engine, tmp_path, header, low, high):
    with RouteProvider().serve() as provider:
        provider.then(Answer(429, {}, {"Retry-After": header}))
        executor = fast_executor(
            route_registry(tmp_path, provider.url, billing_route()),
            retry_after_min_seconds=2,
            retry_after_max_seconds=5,
        )
        eid = start_execution(runtime_engine, _flow())
        assert run_once(runtime_engine, executor) == "RETRY_WAIT"
    with runtime_engine.connect() as conn:
        wait = conn.execute(
            text(
                "SELECT extract(epoch FROM next_attempt_at - updated_at)"
                " FROM execution WHERE id = :i"
            ),
            {"i": eid},
        ).scalar_one()
    assert low <= float(wait) <= high


def test_reset_after_commit_then_retry_makes_one_idempotent_effect(runtime_engine, tmp_path):
    with RouteProvider().serve() as provider:
        provider.then(RESET_AFTER_COMMIT)
        executor = fast_executor(
            route_registry(tmp_path, provider.url, billing_route("IDEMPOTENT_WRITE"))
        )
        eid = start_execution(runtime_engine, _flow())
        assert run_once(runtime_engine, executor) == "RETRY_WAIT"
        make_due(runtime_engine, eid)
        assert run_once(runtime_engine, executor) == "SUCCEEDED"
    key = f"{eid}:charge"
    assert provider.effects == {key: 1}
    assert provider.repeats == {key: 1}  # the retry got the first answer, made nothing
    assert checkpoints(runtime_engine, eid)["charge"].output["id"] == "inv-1"


def test_reset_after_commit_parks_a_non_idempotent_write(runtime_engine, tmp_path):
    with RouteProvider().serve() as provider:
        provider.then(RESET_AFTER_COMMIT)
        executor = fast_executor(
            route_registry(tmp_path, provider.url, billing_route("NON_IDEMPOTENT_WRITE"))
        )
        eid = start_execution(runtime_engine, _flow())
        assert run_once(runtime_engine, executor) == "RECONCILIATION_REQUIRED"
    assert provider.effects == {f"{eid}:charge": 1}
    assert len(provider.writes()) == 1


def test_reset_after_commit_is_settled_by_the_route_lookup(runtime_engine, tmp_path):
    with RouteProvider().serve() as provider:
        provider.then(RESET_AFTER_COMMIT)
        toml = billing_route("NON_IDEMPOTENT_WRITE", LOOKUP)
        executor = fast_executor(route_registry(tmp_path, provider.url, toml))
        eid = start_execution(runtime_engine, _flow())
        assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert provider.effects == {f"{eid}:charge": 1}
    assert len(provider.writes()) == 1
    assert checkpoints(runtime_engine, eid)["charge"].output == {"id": "inv-1", "status": "draft"}
    assert audit(runtime_engine, eid, "RECONCILED_BY_LOOKUP")


def test_a_hang_then_retry_of_an_idempotent_write_makes_one_effect(runtime_engine, tmp_path):
    with RouteProvider(hang_seconds=5).serve() as provider:
        provider.then(HANG)
        executor = fast_executor(
            route_registry(tmp_path, provider.url, billing_route("IDEMPOTENT_WRITE"))
        )
        eid = start_execution(runtime_engine, _flow())
        assert run_once(runtime_engine, executor) == "RETRY_WAIT"
        make_due(runtime_engine, eid)
        assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert provider.effects == {f"{eid}:charge": 1}


# --- secrets -----------------------------------------------------------------------------


def test_secrets_never_reach_logs_audit_or_evidence(runtime_engine, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    toml = billing_route(path="/v1/invoices?token=${BILLING_TOKEN}")
    with RouteProvider().serve() as provider:
        provider.then(Answer(503, {}), RESET_AFTER_COMMIT, Answer(401, {"code": "UNAUTHORIZED"}))
        executor = fast_executor(route_registry(tmp_path, provider.url, toml))
        first = start_execution(runtime_engine, _flow())
        run_once(runtime_engine, executor)
        make_due(runtime_engine, first)
        run_once(runtime_engine, executor)
        make_due(runtime_engine, first)
        run_once(runtime_engine, executor)
        assert all(SECRET in r.headers["Authorization"] for r in provider.received)
    # A write may have happened (the reset), so the 401 leaves it to a person.
    assert execution(runtime_engine, first).status == "RECONCILIATION_REQUIRED"
    assert SECRET not in caplog.text
    assert "token=" not in caplog.text
    with runtime_engine.connect() as conn:
        tables = ["audit_event", "action_attempt", "action_execution", "execution", "request"]
        dumped = " ".join(
            str(conn.execute(text(f"SELECT coalesce(json_agg(t)::text, '') FROM {t} t")).scalar())
            for t in tables
        )
    assert "route billing.invoice@1: HTTP 401" in dumped
    assert SECRET not in dumped
    assert "token=" not in dumped
    assert "127.0.0.1" not in dumped


# --- document.verify@1 -------------------------------------------------------------------

VERIFY = """
[[route]]
capability = "document.verify"
version = 1
method = "POST"
url = "${BILLING_URL}/v1/verify"
headers = { Authorization = "Bearer ${BILLING_TOKEN}" }
"""


def test_document_verify_runs_with_its_fixed_contract(runtime_engine, tmp_path):
    with RouteProvider().serve() as provider:
        registry = route_registry(tmp_path, provider.url, VERIFY)
        definition = flow_definition(
            [
                action(
                    "verify",
                    "document.verify",
                    input={
                        "documentType": {"const": "passport"},
                        "documentNumber": {"const": "X123"},
                        "country": {"const": "ES"},
                    },
                )
            ]
        )
        eid = start_execution(runtime_engine, definition)
        assert run_once(runtime_engine, fast_executor(registry)) == "SUCCEEDED"
    output = checkpoints(runtime_engine, eid)["verify"].output
    assert output == {
        "status": "REJECTED",
        "reasons": ["expired"],
        "reference": f"ver-{eid}:verify",
    }
    (adapter,) = registry.adapters()
    assert adapter.output_schema["properties"]["status"]["enum"] == [
        "VERIFIED",
        "REJECTED",
        "INCONCLUSIVE",
    ]


def test_document_verify_unconfigured_is_unavailable(tmp_path):
    registry = route_registry(tmp_path, "http://127.0.0.1:1", billing_route())
    with pytest.raises(IntegrationUnavailable):
        registry.get("document.verify", 1)


def test_one_session_per_process_is_reused(tmp_path):
    from orquestador.integrations.http_adapter import session_for

    assert session_for(False) is session_for(False)
    assert session_for(False).trust_env is False
    assert session_for(True).trust_env is True
    threading.Thread(target=lambda: None).start()
