"""`orquestador executions` as an operator runs it: a real process against a real API server."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest
from sqlalchemy import Engine

from orquestador.actions import Effect, TransientError, UncertainError
from orquestador.api.app import create_app
from orquestador.api.context import EXTENSION_KEY
from orquestador.api.execution_routes import ADAPTERS_EXTENSION
from orquestador.api.tokens import mint_token
from orquestador.config import Settings
from orquestador.dev import DEV_SUBJECT
from orquestador.machines import claim_next, create_command
from orquestador.serve import serve_in_thread
from orquestador.worker.executor import Executor
from tests.db_support import TestDatabase
from tests.integration.execution_page_support import (
    cancel_directly,
    end_past_deadline,
    park_wait,
    twin,
)
from tests.integration.worker_support import (
    ORG,
    OWNER,
    action,
    claim_one,
    decommission,
    execution,
    flow_definition,
    registry_of,
    request_row,
    run_once,
    scripted,
    settings,
    start_execution,
)
from tests.integration.worker_support import RecordingAdapter as Double

ORQUESTADOR = [sys.executable, "-m", "orquestador.cli"]
SECRET = "executions-cli-test-secret-" + "0123456789abcdef" * 3
OPERATOR_SCOPES = ["executions:reconcile", "executions:cancel", "requests:read-all"]
CHARGE_OUTPUT = {
    "type": "object",
    "required": ["chargeId"],
    "properties": {"chargeId": {"type": "string"}},
}


def _charge(*script: Any) -> Double:
    remaining = list(script)

    def play(ctx: Any) -> dict[str, Any]:
        step = remaining.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    return Double(
        "test.charge", Effect.NON_IDEMPOTENT_WRITE, output=play, output_schema=CHARGE_OUTPUT
    )


@dataclass
class Server:
    url: str
    port: int
    settings: Settings

    def token(self, *, org: str = ORG, sub: str = "operator-1", scopes: list[str]) -> str:
        return mint_token(self.settings, sub=sub, org=org, scopes=scopes)


@pytest.fixture
def server(database: TestDatabase) -> Iterator[Server]:
    """The API on a loopback port, served as `orquestador dev` serves it."""
    api_settings = Settings.from_env(
        {},
        database_url=database.runtime_dsn,
        request_api_enabled=True,
        flow_admin_enabled=True,
        jwt_secret=SECRET,
    )
    registry = registry_of(_charge())
    app = create_app(api_settings, registry=registry)
    app.extensions[ADAPTERS_EXTENSION] = registry
    http, thread = serve_in_thread(app, "127.0.0.1", 0)
    try:
        port = http.server_port
        yield Server(f"http://127.0.0.1:{port}/api/v1", port, api_settings)
    finally:
        http.shutdown()
        thread.join(10)
        app.extensions[EXTENSION_KEY].engine.dispose()


def _run(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run(
        [*ORQUESTADOR, "executions", *args],
        env={**base, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _as(server: Server, scopes: list[str] = OPERATOR_SCOPES, **who: Any) -> dict[str, str]:
    return {
        "ORQUESTADOR_API_URL": server.url,
        "ORQUESTADOR_TOKEN": server.token(scopes=scopes, **who),
    }


def _park(engine: Engine, charge: Double) -> uuid.UUID:
    definition = flow_definition([action("charge", "test.charge", onError="attention")])
    eid = start_execution(engine, definition, {"plan": "pro"})
    assert run_once(engine, Executor(registry_of(charge), settings())) == "RECONCILIATION_REQUIRED"
    return eid


def _one_line_no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("orquestador: ")


def test_find_inspect_and_confirm_a_parked_execution(
    server: Server, runtime_engine: Engine
) -> None:
    charge = _charge(UncertainError("read timed out"))
    eid = _park(runtime_engine, charge)
    pending = start_execution(runtime_engine, flow_definition([action("x", "test.charge")]))
    env = _as(server)

    listed = _run("list", "--status", "RECONCILIATION_REQUIRED", env=env)
    listed_json = _run("list", "--status", "RECONCILIATION_REQUIRED", "--json", env=env)
    shown = _run("show", str(eid), env=env)
    evidence = _run("evidence", str(eid), env=env)
    evidence_json = _run("evidence", str(eid), "--json", env=env)

    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["ID", "STATUS", "TRANSITION", "ERROR", "FLOW", "MACHINE", "CREATED"]
    assert row.split()[:4] == [str(eid), "RECONCILIATION_REQUIRED", "go", "UNCERTAIN_OUTCOME"]
    assert str(pending) not in listed.stdout
    page = json.loads(listed_json.stdout)
    assert ([item["id"] for item in page["items"]], page["next"]) == ([str(eid)], None)
    assert shown.returncode == 0 and "RECONCILIATION_REQUIRED" in shown.stdout
    assert evidence.returncode == 0, evidence.stderr
    assert "in doubt    charge" in evidence.stdout
    assert "--action charge --decision confirm|retry|fail" in evidence.stdout
    assert f"{eid}:charge" in evidence.stdout
    assert "read timed out" in evidence.stdout
    found = json.loads(evidence_json.stdout)
    assert (found["reason"], found["inDoubt"]) == ("UNCERTAIN_OUTCOME", "charge")
    # Out of the worker's way: the next run is the confirmed execution's.
    assert _run("cancel", str(pending), "--reason", "not needed", env=env).returncode == 0

    wrong = _run(
        "reconcile", str(eid), "--action", "charge", "--decision", "confirm",
        "--reason", "dashboard", "--output", '{"chargeId": 5}', env=env,
    )  # fmt: skip
    assert wrong.returncode == 1
    _one_line_no_traceback(wrong)
    assert "422 OUTPUT_INVALID" in wrong.stderr
    assert "/output/chargeId" in wrong.stderr

    confirmed = _run(
        "reconcile", str(eid), "--action", "charge", "--decision", "confirm",
        "--reason", "dashboard shows ch_1", "--output", '{"chargeId": "ch_1"}', "--json",
        env=env,
    )  # fmt: skip
    assert confirmed.returncode == 0, confirmed.stderr
    assert json.loads(confirmed.stdout)["status"] == "PENDING"
    assert run_once(runtime_engine, Executor(registry_of(charge), settings())) == "SUCCEEDED"
    assert len(charge.calls) == 1

    again = _run(
        "reconcile", str(eid), "--action", "charge", "--decision", "retry",
        "--reason", "second thoughts", "--json", env=env,
    )  # fmt: skip
    assert again.returncode == 1
    assert "409 NOT_RECONCILABLE" in again.stderr
    assert json.loads(again.stdout)["code"] == "NOT_RECONCILABLE"


def test_fail_from_the_command_line_moves_the_request(
    server: Server, runtime_engine: Engine
) -> None:
    eid = _park(runtime_engine, _charge(UncertainError("timeout")))

    failed = _run(
        "reconcile", str(eid), "--action", "charge", "--decision", "fail",
        "--reason", "provider has no record", "--to-state", "other", env=_as(server),
    )  # fmt: skip

    assert failed.returncode == 0, failed.stderr
    assert failed.stdout.startswith("decided: fail; the execution is FAILED")
    request = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert (request.state, request.busy_execution_id) == ("other", None)


def test_retry_with_a_correction_from_the_command_line(
    server: Server, runtime_engine: Engine, tmp_path: Path
) -> None:
    charge = _charge(UncertainError("connection reset"), {"chargeId": "ch_2"})
    definition = flow_definition(
        [action("charge", "test.charge", input={"plan": {"from": "/data/plan"}})]
    )
    eid = start_execution(runtime_engine, definition, {"plan": "pro"})
    assert run_once(runtime_engine, Executor(registry_of(charge), settings())) == (
        "RECONCILIATION_REQUIRED"
    )
    (tmp_path / "seats.json").write_text('{"count": 5}')

    corrected = _run(
        "reconcile", str(eid), "--action", "charge", "--decision", "retry",
        "--reason", "the customer chose basic", "--correct", "/plan=\"basic\"",
        "--correct", f"/seats=@{tmp_path / 'seats.json'}", env=_as(server),
    )  # fmt: skip

    assert corrected.returncode == 0, corrected.stderr
    first, second = corrected.stdout.splitlines()[:2]
    assert first == "decided: retry; the execution is PENDING"
    assert second.startswith("corrected: /plan, /seats")
    request = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert request.data == {"plan": "basic", "seats": {"count": 5}}
    assert run_once(runtime_engine, Executor(registry_of(charge), settings())) == "SUCCEEDED"
    assert charge.calls[-1].inputs == {"plan": "basic"}


def test_cancel_by_the_owner_and_its_refusal_the_second_time(
    server: Server, runtime_engine: Engine
) -> None:
    eid = start_execution(runtime_engine, flow_definition([action("x", "test.charge")]))
    owner = _as(server, ["requests:read", "requests:write"], sub=OWNER)

    first = _run("cancel", str(eid), "--reason", "ordered by mistake", env=owner)
    second = _run("cancel", str(eid), "--reason", "again", env=owner)

    assert first.returncode == 0, first.stderr
    assert "the execution is CANCELLED" in first.stdout
    # It says what became of the machine: here nothing was sent to one.
    assert first.stdout.rstrip().endswith("no machine command was under way")
    assert second.returncode == 1
    _one_line_no_traceback(second)
    assert "409 NOT_CANCELLABLE" in second.stderr


def test_cancel_of_a_running_execution_says_it_stops_when_the_call_returns(
    server: Server, runtime_engine: Engine
) -> None:
    eid = start_execution(runtime_engine, flow_definition([action("x", "test.charge")]))
    claim_one(runtime_engine, "w1")  # its step's call is running
    owner = _as(server, ["requests:read", "requests:write"], sub=OWNER)

    first = _run("cancel", str(eid), "--reason", "ordered by mistake", env=owner)
    second = _run("cancel", str(eid), "--reason", "again", env=owner)

    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(
        "cancel requested: the step's call is running; the execution stops when the call returns"
    )
    assert re.search(rf"cancel requested\s+by {OWNER} at ", first.stdout)
    assert second.returncode == 0, second.stderr  # the same answer, nothing new recorded
    assert execution(runtime_engine, eid).status == "RUNNING"


def test_a_cancel_names_each_machine_command_it_ended_or_asked_to_stop(
    server: Server, runtime_engine: Engine
) -> None:
    eid = start_execution(runtime_engine, flow_definition([action("x", "test.charge")]))
    ids = {}
    with runtime_engine.begin() as conn:
        for step, machine in (("taken", "m-1"), ("queued", "m-2")):
            ids[step] = create_command(
                conn,
                org_id=ORG,
                machine_id=machine,
                command="poweroff",
                args=[],
                external_key=f"{eid}:{step}",
            ).id
        assert claim_next(conn, org_id=ORG, machine_id="m-1").id == ids["taken"]
    operator = _as(server, ["executions:cancel", "requests:read-all"])

    cancelled = _run("cancel", str(eid), "--reason", "not needed", env=operator)

    assert cancelled.returncode == 0, cancelled.stderr
    lines = cancelled.stdout.splitlines()
    assert lines[-2:] == [
        f"machine command poweroff on m-2 ({ids['queued']}): cancelled, no agent will get it",
        f"machine command poweroff on m-1 ({ids['taken']}): already taken; its agent was "
        "asked to stop it",
    ]


def test_a_cancel_after_a_charge_says_the_execution_was_parked_not_cancelled(
    server: Server, runtime_engine: Engine
) -> None:
    charge = _charge({"chargeId": "ch_1"})
    receipt = Double("test.receipt", Effect.READ_ONLY, output=scripted(TransientError("busy")))
    definition = flow_definition(
        [action("charge", "test.charge"), action("receipt", "test.receipt")]
    )
    eid = start_execution(runtime_engine, definition, {"plan": "pro"})
    assert run_once(runtime_engine, Executor(registry_of(charge, receipt), settings())) == (
        "RETRY_WAIT"
    )
    owner = _as(server, ["requests:read", "requests:write"], sub=OWNER)

    parked = _run("cancel", str(eid), "--reason", "customer changed plan", env=owner)

    assert parked.returncode == 0, parked.stderr
    first_line = parked.stdout.splitlines()[0]
    assert first_line.startswith("not cancelled: parked for reconciliation")
    assert "charge" in first_line
    assert "CANCELLED_AFTER_WRITES" in parked.stdout
    assert "status      RECONCILIATION_REQUIRED" in parked.stdout
    request = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert (request.state, request.busy_execution_id) == ("new", eid)


def test_the_server_s_refusals_exit_1_with_the_problem(
    server: Server, runtime_engine: Engine
) -> None:
    eid = _park(runtime_engine, _charge(UncertainError("timeout")))

    no_scope = _run("evidence", str(eid), env=_as(server, ["requests:read-all"]))
    foreign = _run("evidence", str(eid), env=_as(server, org="org-elsewhere"))
    nonsense = _run("show", "../../flows", env=_as(server))
    bad_token = _run(
        "list", env={"ORQUESTADOR_API_URL": server.url, "ORQUESTADOR_TOKEN": "not-a-token"}
    )

    for result, fragment in (
        (no_scope, "403 INSUFFICIENT_SCOPE"),
        (foreign, "404 NOT_FOUND"),
        (nonsense, "404 NOT_FOUND"),
        (bad_token, "401 UNAUTHENTICATED"),
    ):
        assert result.returncode == 1, result.stderr
        _one_line_no_traceback(result)
        assert fragment in result.stderr
    assert execution(runtime_engine, eid).status == "RECONCILIATION_REQUIRED"


def test_usage_and_configuration_problems_exit_2_in_one_line(
    server: Server, tmp_path: Path
) -> None:
    env = _as(server)
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        # Bound, never listening: nothing answers on this port.
        silent = f"http://127.0.0.1:{bound.getsockname()[1]}/api/v1"
        unreachable = _run("list", env={**env, "ORQUESTADOR_API_URL": silent})
    nowhere = _run("list", env={"ORQUESTADOR_HOME": str(tmp_path / "none")}, cwd=tmp_path)
    not_json = _run(
        "reconcile", str(uuid.uuid4()), "--decision", "confirm", "--reason", "x",
        "--output", "{chargeId", env=env,
    )  # fmt: skip
    no_reason = _run("cancel", str(uuid.uuid4()), env=env)
    bad_status = _run("list", "--status", "DONE", env=env)
    bad_limit = _run("list", "--limit", "500", env=env)

    for result in (unreachable, nowhere, not_json):
        assert result.returncode == 2, result.stderr
        _one_line_no_traceback(result)
        assert len(result.stderr.strip().splitlines()) == 1
    assert "cannot reach the API" in unreachable.stderr
    assert "ORQUESTADOR_API_URL and ORQUESTADOR_TOKEN are not set" in nowhere.stderr
    assert "--output is not valid JSON" in not_json.stderr
    for result in (no_reason, bad_status, bad_limit):
        assert result.returncode == 2
        assert "Traceback" not in result.stderr


def test_in_a_dev_folder_the_dev_server_and_a_development_token_are_the_defaults(
    server: Server, tmp_path: Path
) -> None:
    home = tmp_path / ".orquestador"
    home.mkdir()
    # What `orquestador dev` leaves when no JWT_SECRET is set: its development key.
    (home / "dev-jwt-secret").write_text(SECRET + "\n")

    listed = _run("list", env={"API_PORT": str(server.port)}, cwd=tmp_path)

    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == "no executions"


def test_show_prints_what_a_wait_waits_for_and_then_beside_now(
    server: Server, runtime_engine: Engine, owner_engine: Engine
) -> None:
    env = _as(server)
    waiting = start_execution(runtime_engine, decommission(30), {"machineId": "m-1"})
    park_wait(owner_engine, str(waiting), org=ORG)
    ended = start_execution(runtime_engine, decommission(30), {"machineId": "m-2"})
    request_id = str(execution(runtime_engine, ended).request_id)
    end_past_deadline(owner_engine, str(ended), request_id, org=ORG, now="timed_out")

    shown_waiting = _run("show", str(waiting), env=env)
    shown_ended = _run("show", str(ended), env=env)
    listed = _run("list", env=env)
    cancel_directly(owner_engine, str(waiting))
    shown_cancelled = _run("show", str(waiting), env=env)

    assert shown_waiting.returncode == 0, shown_waiting.stderr
    out = shown_waiting.stdout
    assert "machine     m-1" in out
    assert "waiting for  command poweroff on machine m-1" in out
    assert "status now   sent" in out
    assert re.search(r"deadline     \S+Z \(([1-9]|1[0-9]|2[0-2]) s left\)", out), out
    assert "decision  not decided yet" in out
    ended_out = shown_ended.stdout
    assert '"status": "sent"' in ended_out.split("then", 1)[1]
    assert re.search(r"now\s+timed_out \(updated ", ended_out), ended_out
    assert "step wait failed (WAIT_DEADLINE_EXCEEDED); its error exit chose; to attention" in (
        ended_out
    )
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:]}
    flow_key = decommission(30)["key"][:5]  # each publish draws a new key: "flow-…"
    assert rows[str(waiting)][4].startswith(flow_key) and rows[str(waiting)][6] == "m-1"
    assert rows[str(ended)][6] == "m-2"
    cancelled = shown_cancelled.stdout
    assert "NOT_READY" not in cancelled and "not decided yet" not in cancelled
    assert "STOPPED" in cancelled and "decision  cancelled before anything was decided" in (
        cancelled
    )


def test_short_ids_name_one_execution_of_the_organization(
    server: Server, runtime_engine: Engine, owner_engine: Engine
) -> None:
    eid = str(_park(runtime_engine, _charge(UncertainError("timeout"))))
    env = _as(server)

    shown = _run("show", eid[:8], env=env)
    evidence = _run("evidence", eid[:10].upper(), env=env)
    too_short = _run("show", eid[:7], env=env)
    foreign = _run("show", eid[:8], env=_as(server, org="org-elsewhere"))
    absent = "ffffffff" if not eid.startswith("ffffffff") else "00000000"
    missing = _run("show", absent, env=env)
    twin_id = eid[:8] + "-0000-4000-8000-000000000000"
    twin(owner_engine, eid, twin_id)
    ambiguous = _run("show", eid[:8], env=env)
    longer = _run("show", eid[:13], env=env)

    assert shown.returncode == 0, shown.stderr
    assert f"execution   {eid}" in shown.stdout
    assert evidence.returncode == 0 and f"execution   {eid}" in evidence.stdout
    assert too_short.returncode == 2
    _one_line_no_traceback(too_short)
    assert "at least 8 of its first hex digits" in too_short.stderr
    for refused in (foreign, missing):
        assert refused.returncode == 1
        _one_line_no_traceback(refused)
        assert "404 NOT_FOUND" in refused.stderr
    # The same words for another organization's execution as for none at all.
    assert foreign.stderr == missing.stderr.replace(absent, eid[:8])
    assert ambiguous.returncode == 2
    _one_line_no_traceback(ambiguous)
    assert "ambiguous" in ambiguous.stderr and twin_id in ambiguous.stderr
    if eid[8:13] != "-0000":
        assert longer.returncode == 0 and f"execution   {eid}" in longer.stdout


def test_evidence_wraps_a_long_audit_detail_instead_of_cutting_it(
    server: Server, runtime_engine: Engine, owner_engine: Engine
) -> None:
    eid = _park(runtime_engine, _charge(UncertainError("timeout")))
    note = "checked-" + "x" * 300 + "-END"
    with owner_engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)"
            " SELECT org_id, 'NOTE', request_id, id, 'operator-1',"
            " jsonb_build_object('note', %s::text)"
            " FROM execution WHERE id = %s",
            (note, eid),
        )

    evidence = _run("evidence", str(eid), env=_as(server))

    assert evidence.returncode == 0, evidence.stderr
    audit = evidence.stdout.split("\naudit\n", 1)[1].splitlines()
    assert "…" not in evidence.stdout
    assert max(len(line) for line in audit) <= 100
    assert note in "".join(line.strip() for line in audit)


def test_in_a_dev_folder_the_recorded_dev_server_wins_over_api_port_and_loses_to_the_url(
    server: Server, tmp_path: Path
) -> None:
    home = tmp_path / ".orquestador"
    home.mkdir()
    (home / "dev-jwt-secret").write_text(SECRET + "\n")
    record = home / "dev-api.json"
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        # Bound, never listening: a command sent here could not list anything.
        silent_port = bound.getsockname()[1]
        silent = f"http://127.0.0.1:{silent_port}/api/v1"
        # What a running `orquestador dev` leaves (this test's process stands in for it).
        record.write_text(json.dumps({"url": server.url, "pid": os.getpid()}))
        found = _run("list", env={"API_PORT": str(silent_port)}, cwd=tmp_path)
        named = _run("list", env={"ORQUESTADOR_API_URL": silent}, cwd=tmp_path)
        # A dev process killed without a stop leaves its record behind: it is not used.
        ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                               capture_output=True, text=True, check=True)  # fmt: skip
        record.write_text(json.dumps({"url": silent, "pid": int(ended.stdout)}))
        stale = _run("list", env={"API_PORT": str(server.port)}, cwd=tmp_path)

    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "no executions"
    assert named.returncode == 2 and "cannot reach the API at " + silent in named.stderr
    assert stale.returncode == 0, stale.stderr
    assert not record.exists(), "the stale record is removed"


def test_executions_are_listed_by_flow_key_or_by_version_id(
    server: Server, runtime_engine: Engine
) -> None:
    definition = flow_definition([])
    first = start_execution(runtime_engine, definition)
    other = start_execution(runtime_engine, flow_definition([]))
    env = _as(server)
    flow_id = str(execution(runtime_engine, first).flow_id)

    by_key = _run("list", "--flow", definition["key"], "--json", env=env)
    by_id = _run("list", "--flow", flow_id, "--json", env=env)
    unknown = _run("list", "--flow", "no-such-key", "--json", env=env)

    assert by_key.returncode == by_id.returncode == unknown.returncode == 0, by_key.stderr
    assert [item["id"] for item in json.loads(by_key.stdout)["items"]] == [str(first)]
    assert [item["id"] for item in json.loads(by_id.stdout)["items"]] == [str(first)]
    assert json.loads(unknown.stdout)["items"] == []
    assert str(other) not in by_key.stdout


def test_list_takes_the_page_s_filters_and_refuses_one_it_does_not_know(
    server: Server, runtime_engine: Engine
) -> None:
    parked = _park(runtime_engine, _charge(UncertainError("read timed out")))
    on_m1 = start_execution(runtime_engine, flow_definition([]), {"machineId": "m-1"})
    start_execution(runtime_engine, flow_definition([]), {"machineId": "m-2"})
    env = _as(server)
    after = execution(runtime_engine, on_m1).created_at.isoformat()

    def ids(*args: str) -> list[str]:
        result = _run("list", *args, "--json", env=env)
        assert result.returncode == 0, result.stderr
        return [item["id"] for item in json.loads(result.stdout)["items"]]

    assert ids("--machine", "m-1") == [str(on_m1)]
    assert ids("--error-code", "UNCERTAIN_OUTCOME") == [str(parked)]
    assert str(on_m1) not in ids("--created-after", after)
    assert ids("--created-before", after) == [str(parked)]
    assert ids("--machine", "m-1", "--created-before", "2000-01-01T00:00:00Z") == []

    unknown = _run("list", "--machine-id", "m-1", env=env)
    no_offset = _run("list", "--created-after", "2026-12-01T00:00:00", env=env)

    assert unknown.returncode == 2 and "--machine-id" in unknown.stderr
    assert no_offset.returncode == 1
    _one_line_no_traceback(no_offset)
    assert "/createdAfter" in no_offset.stderr and "offset" in no_offset.stderr


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    """A server on this host that only writes down the Authorization header it is sent."""
    import threading

    from werkzeug.serving import make_server
    from werkzeug.wrappers import Request, Response

    heard: list[str] = []

    @Request.application
    def app(request: Request) -> Response:
        heard.append(request.headers.get("Authorization", ""))
        return Response('{"items": [], "next": null}', mimetype="application/json")

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/api/v1", heard
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


def test_orquestador_token_goes_only_to_orquestador_api_url(
    listener: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, heard = listener
    home = tmp_path / ".orquestador"
    home.mkdir()
    # What anyone can leave in a folder; pid 1 always exists, so it is never stale.
    (home / "dev-api.json").write_text(json.dumps({"url": url, "pid": 1}))
    secret = "a-real-operator-token"

    refused = _run("list", env={"ORQUESTADOR_TOKEN": secret}, cwd=tmp_path)

    assert refused.returncode == 2 and heard == []
    _one_line_no_traceback(refused)
    assert "ORQUESTADOR_TOKEN is sent only to ORQUESTADOR_API_URL" in refused.stderr

    # Beside the development key, the record on this host is the dev server: it gets the
    # development token, never ORQUESTADOR_TOKEN.
    (home / "dev-jwt-secret").write_text(SECRET + "\n")
    _run("list", env={"ORQUESTADOR_TOKEN": secret}, cwd=tmp_path)
    assert len(heard) == 1 and secret not in heard[0]
    claims = jwt.decode(heard[0].removeprefix("Bearer "), SECRET, algorithms=["HS256"],
                        options={"verify_aud": False})  # fmt: skip
    assert claims["sub"] == DEV_SUBJECT


def test_a_dev_record_naming_another_host_is_never_used(
    listener: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, heard = listener
    home = tmp_path / ".orquestador"
    home.mkdir()
    (home / "dev-jwt-secret").write_text(SECRET + "\n")
    (home / "dev-api.json").write_text(
        json.dumps({"url": "http://collector.invalid/api/v1", "pid": 1})
    )
    port = url.split(":")[2].split("/")[0]

    _run("list", env={"API_PORT": port}, cwd=tmp_path)

    # The record was passed over for this host's default address, where the dev server is.
    assert len(heard) == 1


def test_a_correction_takes_text_for_a_text_field_and_says_how_to_write_the_rest(
    server: Server, runtime_engine: Engine
) -> None:
    charge = _charge(UncertainError("connection reset"), {"chargeId": "ch_3"})
    schema = {
        "type": "object",
        "properties": {"plan": {"type": "string"}, "seats": {"type": "integer"}},
    }
    definition = flow_definition(
        [action("charge", "test.charge", input={"plan": {"from": "/data/plan"}})],
        data_schema=schema,
    )
    eid = start_execution(runtime_engine, definition, {"plan": "pro", "seats": 2})
    assert run_once(runtime_engine, Executor(registry_of(charge), settings())) == (
        "RECONCILIATION_REQUIRED"
    )
    retry = ["reconcile", str(eid), "--action", "charge", "--decision", "retry", "--reason", "r"]

    unread = _run(*retry, "--correct", "/plan=large", "--correct", "/seats=many", env=_as(server))
    corrected = _run(*retry, "--correct", "/plan=large", "--correct", "/seats=5", env=_as(server))

    assert unread.returncode == 1
    _one_line_no_traceback(unread)
    assert "422 CORRECTION_INVALID" in unread.stderr
    assert '/seats takes a whole number such as 950, not the text "many"' in unread.stderr
    assert corrected.returncode == 0, corrected.stderr
    request = request_row(runtime_engine, execution(runtime_engine, eid).request_id)
    assert request.data == {"plan": "large", "seats": 5}
