"""notify@1 through a real worker and a real SMTP server: which notices are e-mailed, and why."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from orquestador.actions import ActionContext, AdapterRegistry, Identity, load_registry
from orquestador.domain.schemas import validator_for
from orquestador.notices.writing import message_id_for
from orquestador.worker.daemon import Worker
from tests.integration.notice_support import (
    ORG,
    RECIPIENTS,
    new_mailer,
    outbox,
    running,
    set_preferences,
)
from tests.integration.worker_support import (
    accept_transition,
    action,
    audit,
    checkpoints,
    create_request,
    execution,
    flow_definition,
    publish_flow,
    settings,
    start_execution,
    status_is,
    wait_until,
)
from tests.smtp_sink import SmtpSink, running_sink

PUBLIC_BASE_URL = "https://orquestador.example.com/"


@pytest.fixture
def sink() -> Iterator[SmtpSink]:
    with running_sink() as sink:
        yield sink


@pytest.fixture
def worker(database, runtime_engine, sink) -> Iterator[Worker]:
    """A worker with the built-in adapters and its mailer delivering to the sink."""
    worker_settings = settings(
        database_url=database.runtime_dsn,
        smtp_url=sink.url,
        smtp_from="orquestador@example.com",
        public_base_url=PUBLIC_BASE_URL,
    )
    worker = Worker(worker_settings, runtime_engine, load_registry(worker_settings))
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(timeout=30)


def _notify_flow(*, email: bool | None = None, **inputs: Any) -> dict[str, Any]:
    """A notify node; `email` is the node's own switch (absent when None)."""
    values = {"title": "Backup failed", "body": "The nightly backup of m-1 failed.", **inputs}
    node = action("tell", "notify", input={name: {"const": v} for name, v in values.items()})
    if email is not None:
        node["email"] = email
    return flow_definition([node])


def _run(engine, *, email: bool | None = None, **inputs: Any) -> tuple[uuid.UUID, dict[str, Any]]:
    execution_id = start_execution(engine, _notify_flow(email=email, **inputs))
    wait_until(status_is(engine, execution_id, "SUCCEEDED", "FAILED"), what="the execution")
    assert execution(engine, execution_id).status == "SUCCEEDED"
    return execution_id, checkpoints(engine, execution_id)["tell"].output


def _notice(engine, notice_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT * FROM panel_notice WHERE id = :id"), {"id": notice_id}
        ).one()


def _written(engine, execution_id: uuid.UUID) -> dict[str, Any]:
    [row] = audit(engine, execution_id, "NOTICE_WRITTEN")
    return row.detail


def test_email_only_when_the_node_asks_and_the_organization_wants_it(runtime_engine, worker, sink):
    set_preferences(runtime_engine)
    unticked, unticked_out = _run(runtime_engine, severity="critical", email=False)
    ticked, ticked_out = _run(runtime_engine, email=True, title="Disk full on m-1")
    set_preferences(runtime_engine, opt_out=["automation"])
    opted_out, opted_out_out = _run(runtime_engine, email=True)
    set_preferences(runtime_engine, recipients=[])
    nobody, nobody_out = _run(runtime_engine, email=True)
    set_preferences(runtime_engine)
    again, again_out = _run(runtime_engine, email=True, title="Disk full on m-2")

    received = sink.wait_for(2)
    expected = {
        message_id_for(f"{ticked}:tell"): "Disk full on m-1",
        message_id_for(f"{again}:tell"): "Disk full on m-2",
    }
    assert {m.message_id: str(m.message["Subject"]) for m in received} == expected
    assert all(m.rcpt_tos == RECIPIENTS for m in received)

    outcomes = {
        unticked: (unticked_out, "off_on_node"),
        ticked: (ticked_out, "queued"),
        opted_out: (opted_out_out, "org_opted_out"),
        nobody: (nobody_out, "no_recipients"),
        again: (again_out, "queued"),
    }
    wait_until(lambda: all(r.status == "sent" for r in outbox(runtime_engine)), what="sent")
    for execution_id, (output, email) in outcomes.items():
        assert output["email"] == email
        notice = _notice(runtime_engine, output["noticeId"])
        assert (notice.email, notice.test, notice.org_id, notice.category) == (
            email,
            False,
            ORG,
            "automation",
        )
        assert notice.execution_id == execution_id
        assert notice.external_key == f"{execution_id}:tell"
        assert _written(runtime_engine, execution_id) == {
            "noticeId": output["noticeId"],
            "email": email,
            "test": False,
        }
    assert _notice(runtime_engine, unticked_out["noticeId"]).severity == "critical"
    assert _notice(runtime_engine, ticked_out["noticeId"]).severity == "info"
    rows = outbox(runtime_engine)
    assert sorted(str(row.notice_id) for row in rows) == sorted(
        [ticked_out["noticeId"], again_out["noticeId"]]
    )
    assert len(sink.received()) == 2


def _registry(database) -> AdapterRegistry:
    return load_registry(settings(database_url=database.runtime_dsn))


def _context(key: str, *, simulation: bool = False, **inputs: Any) -> ActionContext:
    execution_id, _, _ = key.partition(":")
    return ActionContext(
        inputs={"title": "Quota exceeded", "body": "m-1 is over quota.", **inputs},
        external_key=key,
        attempt=1,
        deadline=float("inf"),
        identity=Identity(ORG, str(uuid.uuid4()), execution_id, actor="user-1"),
        simulation=simulation,
    )


def test_a_retry_of_the_same_step_returns_the_same_notice_and_never_a_second_email(
    database, runtime_engine, sink
):
    set_preferences(runtime_engine)
    notify = _registry(database).get("notify", 1)
    key = f"{uuid.uuid4()}:tell"
    first = notify.invoke(_context(key, email=True))
    # Two more attempts at once, as a stale worker and its successor might make them.
    both = threading.Barrier(2, timeout=10)
    answers: list[dict[str, Any]] = []

    def retry() -> None:
        both.wait()
        answers.append(notify.invoke(_context(key, email=True)))

    threads = [threading.Thread(target=retry) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    assert answers == [first, first]
    assert first["email"] == "queued"
    [row] = outbox(runtime_engine)
    assert str(row.notice_id) == first["noticeId"]
    with runtime_engine.connect() as conn:
        written = conn.scalar(
            text("SELECT count(*) FROM audit_event WHERE kind = 'NOTICE_WRITTEN'")
        )
        notices = conn.scalar(text("SELECT count(*) FROM panel_notice"))
    assert (written, notices) == (1, 1)
    with running(new_mailer(runtime_engine, sink.url)):
        sink.wait_for(1)
        wait_until(lambda: outbox(runtime_engine)[0].status == "sent", what="sent")
    assert [m.message_id for m in sink.received()] == [message_id_for(key)]


def test_a_retry_after_the_preferences_changed_still_answers_the_first_decision(
    database, runtime_engine
):
    notify = _registry(database).get("notify", 1)
    key = f"{uuid.uuid4()}:tell"
    set_preferences(runtime_engine, opt_out=["automation"])
    first = notify.invoke(_context(key, email=True))
    set_preferences(runtime_engine)
    assert notify.invoke(_context(key, email=True)) == first
    assert first["email"] == "org_opted_out"
    assert outbox(runtime_engine) == []


def test_a_simulation_writes_a_test_notice_and_never_an_email(database, runtime_engine):
    set_preferences(runtime_engine)
    notify = _registry(database).get("notify", 1)
    assert notify.simulate is not None
    ctx = _context(f"{uuid.uuid4()}:tell", email=True)
    output = notify.simulate(ctx)
    # A simulated context reaching invoke is treated the same way.
    invoked = notify.invoke(_context(f"{uuid.uuid4()}:tell", simulation=True, email=True))

    assert output["email"] == invoked["email"] == "simulation"
    # The dry run says what the real run would have done about e-mail.
    assert ctx.observed == {
        "summary": "would notify: Quota exceeded; would e-mail 2 recipients",
        "email": "queued",
        "recipients": ["ops@example.com", "oncall@example.com"],
    }
    for answer in (output, invoked):
        notice = _notice(runtime_engine, answer["noticeId"])
        assert (notice.test, notice.email) == (True, "simulation")
    assert outbox(runtime_engine) == []


def test_a_simulated_execution_mails_nobody(runtime_engine, worker, sink):
    set_preferences(runtime_engine)
    simulated = start_execution(runtime_engine, _notify_flow(email=True), simulation=True)
    wait_until(status_is(runtime_engine, simulated, "SUCCEEDED", "FAILED"), what="the dry run")
    real, _ = _run(runtime_engine, email=True)  # the control: the mailer is running

    [received] = sink.wait_for(1)
    assert received.message_id == message_id_for(f"{real}:tell")
    output = checkpoints(runtime_engine, simulated)["tell"].output
    assert output["email"] == "simulation"
    assert _notice(runtime_engine, output["noticeId"]).test is True
    assert len(outbox(runtime_engine)) == 1


@pytest.mark.parametrize(
    ("inputs", "path"),
    [
        ({"title": "two\r\nlines", "body": ""}, "/title"),
        ({"title": "two\u2028lines", "body": ""}, "/title"),
        ({"title": "bell\x07", "body": ""}, "/title"),
        ({"title": "", "body": ""}, "/title"),
        ({"title": "t", "body": "nul\x00"}, "/body"),
        ({"title": "t", "body": "", "severity": "loud"}, "/severity"),
        ({"title": "t", "body": "", "email": "yes"}, "/email"),
        ({"title": "t", "body": "", "to": "x@example.com"}, ""),
        ({"body": ""}, ""),
    ],
)
def test_inputs_that_could_break_a_header_or_the_row_are_refused(database, inputs, path):
    notify = _registry(database).get("notify", 1)
    errors = list(validator_for(notify.input_schema).iter_errors(inputs))
    assert errors
    assert {
        "/" + "/".join(map(str, e.absolute_path)) if e.absolute_path else "" for e in errors
    } == {path}


def test_an_email_names_its_flow_and_machine_and_links_the_execution_page(
    runtime_engine, worker, sink
):
    set_preferences(runtime_engine)
    definition = _notify_flow(email=True)
    request_id = create_request(
        runtime_engine, publish_flow(runtime_engine, definition), machine_id="m-7"
    )
    execution_id = accept_transition(runtime_engine, request_id)

    [received] = sink.wait_for(1)

    text_lines = received.message.get_content().splitlines()
    assert text_lines[0] == "The nightly backup of m-1 failed."
    assert text_lines[-3:] == [
        f"Flow: {definition['key']} (version 1)",
        "Machine: m-7",
        f"Execution: https://orquestador.example.com/ui/executions/{execution_id}",
    ]
    # The panel notice is the body alone.
    notice = _notice(
        runtime_engine, checkpoints(runtime_engine, execution_id)["tell"].output["noticeId"]
    )
    assert notice.body == "The nightly backup of m-1 failed."


def test_an_email_names_the_machine_its_request_s_data_names_as_every_page_does(
    runtime_engine, worker, sink
):
    # A request made with the data alone names its machine only there: the footer reads
    # it as the pages, the search and the filters do.
    set_preferences(runtime_engine)
    definition = _notify_flow(email=True)
    request_id = create_request(
        runtime_engine, publish_flow(runtime_engine, definition), {"machineId": "m-9"}
    )
    accept_transition(runtime_engine, request_id)

    [received] = sink.wait_for(1)

    assert "Machine: m-9" in received.message.get_content().splitlines()


def test_without_a_public_base_url_an_email_has_no_link_line(database, runtime_engine):
    set_preferences(runtime_engine)
    notify = _registry(database).get("notify", 1)  # PUBLIC_BASE_URL unset
    definition = _notify_flow(email=True)
    request_id = create_request(runtime_engine, publish_flow(runtime_engine, definition))
    key = f"{uuid.uuid4()}:tell"
    ctx = _context(key, email=True)
    ctx = ActionContext(
        inputs=ctx.inputs,
        external_key=key,
        attempt=1,
        deadline=float("inf"),
        identity=Identity(ORG, str(request_id), key.partition(":")[0]),
    )

    notify.invoke(ctx)

    [row] = outbox(runtime_engine)
    assert row.body.endswith(f"\n-- \nFlow: {definition['key']} (version 1)\n")
    assert "Execution:" not in row.body and "Machine:" not in row.body
