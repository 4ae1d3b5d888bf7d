"""The maintenance loop: retention deletes exactly what is past its age, by one leader."""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from orquestador.db.engine import make_engine
from orquestador.metrics import (
    DB_OLDEST_TRANSACTION_SECONDS,
    EMAIL_OUTBOX_DEPTH,
    QUEUE_DEPTH,
    QUOTA_USE_RATIO,
    RECONCILIATION_REQUIRED,
)
from orquestador.worker.listener import libpq_conninfo
from orquestador.worker.maintenance import LeaderLock, MaintenanceLoop, PassReport
from orquestador.worker.queue_gauges import QueueGauges
from tests.db_support import RUNTIME_ROLE
from tests.integration.schedule_support import schedule_flow
from tests.integration.worker_support import (
    ORG,
    accept_transition,
    create_request,
    flow_definition,
    migrated_with,
    publish_flow,
    settings,
    wait_until,
)

DAY = "interval '1 day'"


def _command(engine: Engine, status: str, finished_days_ago: float | None) -> uuid.UUID:
    with engine.begin() as conn:
        return conn.execute(
            text(
                "INSERT INTO machine_command (org_id, machine_id, command, status, external_key,"
                " created_at, finished_at)"
                " VALUES (:org, 'm-1', 'reboot', :status, :key, now() - interval '400 days',"
                f" now() - :days * {DAY}) RETURNING id"
            ),
            {
                "org": ORG,
                "status": status,
                "key": uuid.uuid4().hex,
                "days": finished_days_ago,
            },
        ).scalar_one()


def _notice(engine: Engine, dismissed_days_ago: float | None) -> uuid.UUID:
    with engine.begin() as conn:
        return conn.execute(
            text(
                "INSERT INTO panel_notice (org_id, category, title, body, external_key,"
                " created_at, dismissed_at)"
                " VALUES (:org, 'automation', 't', 'b', :key, now() - interval '400 days',"
                f" now() - :days * {DAY}) RETURNING id"
            ),
            {"org": ORG, "key": uuid.uuid4().hex, "days": dismissed_days_ago},
        ).scalar_one()


def _email(
    engine: Engine, status: str, sent_days_ago: float | None, notice: uuid.UUID | None = None
) -> uuid.UUID:
    with engine.begin() as conn:
        return conn.execute(
            text(
                "INSERT INTO email_outbox (org_id, notice_id, message_id, recipients, subject,"
                " body, status, created_at, sent_at)"
                " VALUES (:org, :notice, :mid, '[\"ops@example.com\"]', 's', 'b', :status,"
                f" now() - interval '400 days', now() - :days * {DAY}) RETURNING id"
            ),
            {
                "org": ORG,
                "notice": notice,
                "mid": f"<{uuid.uuid4().hex}@test>",
                "status": status,
                "days": sent_days_ago,
            },
        ).scalar_one()


def _request_with_execution(
    engine: Engine, *, simulation: bool, created_days_ago: float, finished: bool
) -> tuple[uuid.UUID, uuid.UUID]:
    """A request with one execution (finished or not), a checkpoint and an attempt row."""
    flow_id = publish_flow(engine, flow_definition([]))
    request_id = create_request(engine, flow_id, simulation=simulation)
    execution_id = accept_transition(engine, request_id, simulation=simulation)
    with engine.begin() as conn:
        conn.execute(
            text(f"UPDATE request SET created_at = now() - :days * {DAY} WHERE id = :id"),
            {"days": created_days_ago, "id": request_id},
        )
        if finished:
            conn.execute(
                text(
                    "UPDATE execution SET status = 'SUCCEEDED', finished_at = now() WHERE id = :id"
                ),
                {"id": execution_id},
            )
            conn.execute(
                text("UPDATE request SET busy_execution_id = NULL WHERE id = :id"),
                {"id": request_id},
            )
        conn.execute(
            text(
                "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
                " fencing_token, input_hash, external_key, effect, capability, adapter_version)"
                " VALUES (:eid, 'a', 'SUCCEEDED', 1, 1, 'h', :key, 'READ_ONLY', 'test.read', 1)"
            ),
            {"eid": execution_id, "key": f"{execution_id}:a"},
        )
        conn.execute(
            text(
                "INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token,"
                " status, started_at) VALUES (:eid, 'a', 1, 1, 'SUCCEEDED', now())"
            ),
            {"eid": execution_id},
        )
    return request_id, execution_id


def _exists(engine: Engine, table: str, row_id: uuid.UUID) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(f"SELECT count(*) FROM {table} WHERE id = :id"), {"id": row_id}
            ).scalar_one()
        )


def _count(engine: Engine, sql: str, **params: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


def _one_pass(engine: Engine, **retention: int) -> PassReport:
    """A maintenance loop's single pass as the leader, with these retention settings."""
    reports: list[PassReport] = []
    loop = MaintenanceLoop(settings(**retention), engine, "w-test", on_pass=reports.append)
    try:
        assert loop.run_once() is False
    finally:
        loop.lock.release()
    (report,) = reports
    return report


def test_retention_deletes_what_is_past_its_age_and_nothing_else(owner_engine, runtime_engine):
    old_final = _command(owner_engine, "succeeded", 3)
    recent_final = _command(owner_engine, "failed", 0.5)
    unfinished = _command(owner_engine, "running", None)  # created 400 days ago
    old_sent = _email(owner_engine, "sent", 3)
    recent_sent = _email(owner_engine, "sent", 0.5)
    pending = _email(owner_engine, "pending", None)
    old_dismissed = _notice(owner_engine, 3)
    recent_dismissed = _notice(owner_engine, 0.5)
    not_dismissed = _notice(owner_engine, None)
    # An old dismissed notice whose e-mail is still pending stays until it is settled:
    # deleting the notice would take the undelivered e-mail with it.
    waiting_notice = _notice(owner_engine, 3)
    waiting_email = _email(owner_engine, "pending", None, notice=waiting_notice)
    old_simulation, old_simulated_execution = _request_with_execution(
        owner_engine, simulation=True, created_days_ago=3, finished=True
    )
    recent_simulation, _ = _request_with_execution(
        owner_engine, simulation=True, created_days_ago=0.5, finished=True
    )
    running_simulation, _ = _request_with_execution(
        owner_engine, simulation=True, created_days_ago=3, finished=False
    )
    real_request, real_execution = _request_with_execution(
        owner_engine, simulation=False, created_days_ago=300, finished=True
    )
    audit_before = _count(owner_engine, "SELECT count(*) FROM audit_event")
    migrated_with(owner_engine, simulation_retention_days=1)

    report = _one_pass(
        runtime_engine,
        machine_command_retention_days=1,
        email_retention_days=1,
        notice_retention_days=1,
        simulation_retention_days=1,
    )

    assert report.deleted == {
        "machine_command": 1,
        "email_outbox": 1,
        "panel_notice": 1,
        "request": 1,
        "schedule_fire": 0,
        "bulk_action": 0,
        "audit_event": 0,  # the history's retention (tests/integration/test_history_retention.py)
    }
    assert not _exists(owner_engine, "machine_command", old_final)
    assert _exists(owner_engine, "machine_command", recent_final)
    assert _exists(owner_engine, "machine_command", unfinished)
    assert not _exists(owner_engine, "email_outbox", old_sent)
    assert _exists(owner_engine, "email_outbox", recent_sent)
    assert _exists(owner_engine, "email_outbox", pending)
    assert not _exists(owner_engine, "panel_notice", old_dismissed)
    assert _exists(owner_engine, "panel_notice", recent_dismissed)
    assert _exists(owner_engine, "panel_notice", not_dismissed)
    assert _exists(owner_engine, "panel_notice", waiting_notice)
    assert _exists(owner_engine, "email_outbox", waiting_email)
    assert not _exists(owner_engine, "request", old_simulation)
    assert not _exists(owner_engine, "execution", old_simulated_execution)
    for table in ("action_execution", "action_attempt"):
        assert not _count(
            owner_engine,
            f"SELECT count(*) FROM {table} WHERE execution_id = :id",
            id=old_simulated_execution,
        )
    assert _exists(owner_engine, "request", recent_simulation)
    assert _exists(owner_engine, "request", running_simulation)
    assert _exists(owner_engine, "request", real_request)
    assert _exists(owner_engine, "execution", real_execution)
    assert _count(
        owner_engine,
        "SELECT count(*) FROM action_attempt WHERE execution_id = :id",
        id=real_execution,
    )
    # Audit rows are never touched, not even the purged simulation's.
    assert _count(owner_engine, "SELECT count(*) FROM audit_event") == audit_before


def _schedule_fired(engine: Engine, *fired_days_ago: float) -> str:
    """A schedule with one fire row per age given."""
    flow_id = publish_flow(engine, schedule_flow())
    schedule_id = f"s-{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO schedule (org_id, id, flow_id, every_seconds, updated_by,"
                " next_fire_at) VALUES (:org, :id, :flow, 60, 'ops', now())"
            ),
            {"org": ORG, "id": schedule_id, "flow": flow_id},
        )
        for days in fired_days_ago:
            conn.execute(
                text(
                    "INSERT INTO schedule_fire (org_id, schedule_id, fire_time, fired_at)"
                    " VALUES (:org, :id, now() - make_interval(secs => :d * 86400),"
                    " now() - make_interval(secs => :d * 86400))"
                ),
                {"org": ORG, "id": schedule_id, "d": days},
            )
    return schedule_id


def _bulk(engine: Engine, execution_id: uuid.UUID, finished_days_ago: float | None) -> uuid.UUID:
    """A bulk action with one item, finished that long ago (None: still running)."""
    done = finished_days_ago is not None
    with engine.begin() as conn:
        bulk_id = conn.execute(
            text(
                "INSERT INTO bulk_action (org_id, actor, action, reason, filter, status, total,"
                " finished_at) VALUES (:org, 'ops', 'cancel', 'tidy', '{}', :status, 1,"
                " CASE WHEN :done THEN now() - make_interval(secs => :d * 86400) END) RETURNING id"
            ),
            {
                "org": ORG,
                "status": "DONE" if done else "RUNNING",
                "done": done,
                "d": finished_days_ago or 0,
            },
        ).scalar_one()
        conn.execute(
            text(
                "INSERT INTO bulk_item (bulk_id, execution_id, outcome, finished_at)"
                " VALUES (:b, :e, CASE WHEN :done THEN 'SUCCEEDED' END,"
                " CASE WHEN :done THEN now() END)"
            ),
            {"b": bulk_id, "e": execution_id, "done": done},
        )
    return bulk_id


def test_old_fire_rows_and_finished_bulks_go_and_nothing_else(owner_engine, runtime_engine):
    schedule_id = _schedule_fired(owner_engine, 3, 2, 0.5)
    _, execution_id = _request_with_execution(
        owner_engine, simulation=False, created_days_ago=5, finished=True
    )
    old_done = _bulk(owner_engine, execution_id, 3)
    recent_done = _bulk(owner_engine, execution_id, 0.5)
    running = _bulk(owner_engine, execution_id, None)

    report = _one_pass(runtime_engine, schedule_fire_retention_days=1, bulk_retention_days=1)

    assert (report.deleted["schedule_fire"], report.deleted["bulk_action"]) == (2, 1)
    fired = _count(
        owner_engine, "SELECT count(*) FROM schedule_fire WHERE schedule_id = :id", id=schedule_id
    )
    assert fired == 1  # the recent one; the schedule itself stays
    assert _count(owner_engine, "SELECT count(*) FROM schedule WHERE id = :id", id=schedule_id)
    assert not _exists(owner_engine, "bulk_action", old_done)
    assert _exists(owner_engine, "bulk_action", recent_done)
    assert _exists(owner_engine, "bulk_action", running)
    remaining = _count(
        owner_engine, "SELECT count(*) FROM bulk_item WHERE bulk_id = :id", id=old_done
    )
    assert remaining == 0  # its items went with it
    assert _exists(owner_engine, "execution", execution_id)


def test_zero_days_deletes_every_final_row_at_the_next_pass(owner_engine, runtime_engine):
    just_finished = _command(owner_engine, "timed_out", 0)
    pending_command = _command(owner_engine, "pending", None)
    just_sent = _email(owner_engine, "sent", 0)
    just_dismissed = _notice(owner_engine, 0)
    new_simulation, _ = _request_with_execution(
        owner_engine, simulation=True, created_days_ago=0, finished=True
    )
    new_real, _ = _request_with_execution(
        owner_engine, simulation=False, created_days_ago=0, finished=True
    )
    migrated_with(owner_engine, simulation_retention_days=0)

    report = _one_pass(
        runtime_engine,
        machine_command_retention_days=0,
        email_retention_days=0,
        notice_retention_days=0,
        simulation_retention_days=0,
    )

    assert sum(report.deleted.values()) == 4
    assert not _exists(owner_engine, "machine_command", just_finished)
    assert not _exists(owner_engine, "email_outbox", just_sent)
    assert not _exists(owner_engine, "panel_notice", just_dismissed)
    assert not _exists(owner_engine, "request", new_simulation)
    assert _exists(owner_engine, "machine_command", pending_command)
    assert _exists(owner_engine, "request", new_real)


def test_the_runtime_role_cannot_delete_real_history_itself(owner_engine, runtime_engine):
    real_request, real_execution = _request_with_execution(
        owner_engine, simulation=False, created_days_ago=300, finished=True
    )
    for table, row_id in (("execution", real_execution), ("request", real_request)):
        with (
            pytest.raises(ProgrammingError, match="permission denied"),
            runtime_engine.begin() as conn,
        ):
            conn.execute(text(f"DELETE FROM {table} WHERE id = :id"), {"id": row_id})
    # The purge function, its one way in, ignores a real request however old.
    with runtime_engine.begin() as conn:
        purged = conn.execute(
            text("SELECT orquestador_purge_simulations(interval '0 days', 100)")
        ).scalar_one()
    assert purged == 0
    assert _exists(owner_engine, "request", real_request)


def test_the_leader_samples_the_queue_gauges_and_hands_off_expired_email_leases(
    owner_engine, runtime_engine
):
    _request_with_execution(owner_engine, simulation=False, created_days_ago=0, finished=False)
    _, blocked = _request_with_execution(
        owner_engine, simulation=False, created_days_ago=0, finished=False
    )
    stuck = _email(owner_engine, "pending", None)
    with owner_engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE execution SET status = 'RECONCILIATION_REQUIRED', finished_at = NULL"
                " WHERE id = :id"
            ),
            {"id": blocked},
        )
        conn.execute(
            text(
                "UPDATE execution SET next_attempt_at = now() - interval '90 seconds'"
                " WHERE status = 'PENDING'"
            )
        )
        # A mailer died holding this row: its lease expired, its retry is an hour away.
        conn.execute(
            text(
                "UPDATE email_outbox SET lease_owner = 'dead-worker',"
                " lease_expires_at = now() - interval '1 second',"
                " next_attempt_at = now() + interval '1 hour' WHERE id = :id"
            ),
            {"id": stuck},
        )

    report = _one_pass(runtime_engine)

    assert report.queue_depth["PENDING"] == 1
    assert report.queue_depth["RECONCILIATION_REQUIRED"] == 1
    assert report.queue_depth["RUNNING"] == 0
    assert 89 <= report.oldest_due_seconds < 200
    assert report.email_outbox_depth == 1
    assert report.handed_off == 1
    assert QUEUE_DEPTH.labels(status="PENDING")._value.get() == 1
    assert RECONCILIATION_REQUIRED._value.get() == 1
    assert EMAIL_OUTBOX_DEPTH._value.get() == 1
    with owner_engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT lease_owner, next_attempt_at <= now() AS due FROM email_outbox"
                " WHERE id = :id"
            ),
            {"id": stuck},
        ).one()
    assert row.lease_owner is None and row.due


def test_three_workers_exactly_one_works_each_interval(database, runtime_engine):
    interval = 0.3
    passes: list[tuple[str, float]] = []
    record = threading.Lock()
    engines = [make_engine(database.runtime_dsn, pool_size=3) for _ in range(3)]
    loops = []
    for number, engine in enumerate(engines):
        name = f"w{number}"

        def note(report: PassReport, name: str = name) -> None:
            with record:
                passes.append((name, time.monotonic()))

        loop = MaintenanceLoop(settings(maintenance_interval_seconds=1), engine, name, on_pass=note)
        loop.interval_seconds = interval  # the setting is whole seconds; the test is short
        loops.append(loop)
    try:
        for loop in loops:
            loop.start()
        wait_until(lambda: len(passes) >= 8, timeout=30, what="eight maintenance passes")
    finally:
        for loop in loops:
            loop.stop()
        for loop in loops:
            loop.join(10)
        for engine in engines:
            engine.dispose()

    workers = {name for name, _ in passes}
    assert len(workers) == 1, f"more than one worker did maintenance: {workers}"
    # One pass per interval: never two at once, never a long gap.
    times = [at for _, at in passes]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert min(gaps) >= interval * 0.8
    assert max(gaps) < interval * 6


def test_a_lost_lock_connection_is_lost_leadership(database):
    conninfo = libpq_conninfo(make_url(database.runtime_dsn))
    first, second = LeaderLock(conninfo), LeaderLock(conninfo)
    try:
        assert first.hold() is True
        assert second.hold() is False
        first.release()  # the connection closes: the server frees the lock with it
        # ...once its backend has seen the close, which a busy server does a moment later.
        wait_until(second.hold, timeout=10, what="the lock freed with the closed session")
        assert second.hold() is True
        assert first.hold() is False
    finally:
        first.release()
        second.release()


def test_a_missing_grant_stops_one_tables_retention_not_the_pass(
    owner_engine, runtime_engine, caplog
):
    old_final = _command(owner_engine, "succeeded", 3)
    with owner_engine.begin() as conn:
        conn.execute(
            text(
                "REVOKE EXECUTE ON FUNCTION orquestador_purge_simulations(interval, integer)"
                f" FROM {RUNTIME_ROLE}"
            )
        )
    try:
        with caplog.at_level(logging.WARNING, logger="orquestador.worker.maintenance"):
            report = _one_pass(runtime_engine, machine_command_retention_days=1)
    finally:
        with owner_engine.begin() as conn:
            conn.execute(
                text(
                    "GRANT EXECUTE ON FUNCTION orquestador_purge_simulations(interval, integer)"
                    f" TO {RUNTIME_ROLE}"
                )
            )
    assert report.deleted["machine_command"] == 1
    assert report.deleted["request"] == 0
    assert not _exists(owner_engine, "machine_command", old_final)
    assert "PENDING" in report.queue_depth  # the gauges were still sampled
    (line,) = [r for r in caplog.records if r.getMessage().startswith("retention of request")]
    assert "permission denied" in line.getMessage()


def test_the_leader_reports_the_oldest_open_transaction_and_dead_tuples(
    owner_engine, runtime_engine
):
    """A transaction left open (an idle client, a stuck job) shows as an age; rows a
    delete left behind show as dead tuples of their table until vacuum takes them."""
    _request_with_execution(owner_engine, simulation=False, created_days_ago=0, finished=True)
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE request SET updated_at = now()"))
        conn.execute(text("SELECT pg_stat_force_next_flush()"))
    held = runtime_engine.connect()
    try:
        held.execute(text("SELECT 1"))  # a transaction opened and left open
        opened = held.execute(text("SELECT clock_timestamp()")).scalar_one()

        report = _one_pass(runtime_engine)

        with owner_engine.connect() as conn:
            now = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
        assert 0 < report.oldest_transaction_seconds <= (now - opened).total_seconds() + 1
        assert report.dead_tuples["request"] >= 1
        assert set(report.dead_tuples) >= {"execution", "audit_event", "action_attempt"}
        assert DB_OLDEST_TRANSACTION_SECONDS._value.get() == report.oldest_transaction_seconds
    finally:
        held.close()

    assert _one_pass(runtime_engine).oldest_transaction_seconds == 0


def test_a_pass_expires_pending_commands_past_their_deliver_by_time(owner_engine, runtime_engine):
    with owner_engine.begin() as conn:
        for key, deliver_by in (
            ("late", "- interval '1 second'"),
            ("on-time", "+ interval '1 hour'"),
        ):
            conn.execute(
                text(
                    "INSERT INTO machine_command (org_id, machine_id, command, external_key,"
                    f" deliver_by) VALUES ('acme', 'm-1', 'reboot', :key, now() {deliver_by})"
                ),
                {"key": f"{uuid.uuid4()}:{key}"},
            )

    report = _one_pass(runtime_engine)

    assert report.expired_commands == 1
    with owner_engine.connect() as conn:
        statuses = conn.execute(
            text("SELECT split_part(external_key, ':', 2), status FROM machine_command ORDER BY 1")
        ).all()
    assert [tuple(row) for row in statuses] == [("late", "expired"), ("on-time", "pending")]
    assert _one_pass(runtime_engine).expired_commands == 0


def test_the_leader_s_queue_gauges_follow_the_queue_between_passes(
    database, owner_engine, runtime_engine
):
    """A pass every 60 s would leave the gauges a minute behind: the gauge loop samples
    them between passes, on the leader only, and a worker that does not lead sets none."""
    leader = MaintenanceLoop(settings(), runtime_engine, "w-leader")
    other = MaintenanceLoop(settings(), runtime_engine, "w-other")
    try:
        leader.run_once()
        assert other.run_once() is False  # the lock is the leader's
        before = QUEUE_DEPTH.labels(status="PENDING")._value.get()
        _request_with_execution(owner_engine, simulation=False, created_days_ago=0, finished=False)

        assert other.sample_gauges_if_leader() is False
        assert QUEUE_DEPTH.labels(status="PENDING")._value.get() == before
        gauges = QueueGauges(leader)
        assert gauges.interval_seconds <= 5
        assert gauges.run_once() is False

        assert QUEUE_DEPTH.labels(status="PENDING")._value.get() == before + 1
        assert leader.passes == 1  # no maintenance pass ran for it
    finally:
        leader.lock.release()
        other.lock.release()


def test_the_quota_gauges_show_the_organization_nearest_its_limit(owner_engine, runtime_engine):
    flow_id = publish_flow(owner_engine, schedule_flow())
    with owner_engine.begin() as conn:
        # One organization holds 30 schedules of its 100, another 5; one bucket is short
        # of 50 of its 200 transition tokens.
        for org, count in (("org-big", 30), ("org-small", 5)):
            conn.execute(
                text(
                    "INSERT INTO schedule (org_id, id, flow_id, every_seconds, updated_by)"
                    " SELECT :org, 's-' || n, :flow, 3600, 'tester'"
                    " FROM generate_series(1, :count) AS n"
                ),
                {"org": org, "flow": flow_id, "count": count},
            )
        conn.execute(
            text(
                "INSERT INTO rate_bucket (name, tokens, refilled_at)"
                " VALUES ('org-transitions:org-small', 150, now())"
            )
        )

    # Two executions not ended, one ended, of the 8 the organization may hold.
    go = publish_flow(owner_engine, flow_definition([]))
    ended = accept_transition(runtime_engine, create_request(runtime_engine, go))
    for _ in range(2):
        accept_transition(runtime_engine, create_request(runtime_engine, go))
    with owner_engine.begin() as conn:
        conn.execute(
            text("UPDATE execution SET status = 'SUCCEEDED' WHERE id = :id"), {"id": ended}
        )

    report = _one_pass(runtime_engine, quota_open_executions=8)

    assert report.quota_use == {
        "schedules": 0.3,
        "transitionsBurst": 0.25,
        "openExecutions": 0.25,
    }
    assert QUOTA_USE_RATIO.labels(quota="schedules")._value.get() == 0.3
    assert QUOTA_USE_RATIO.labels(quota="openExecutions")._value.get() == 0.25
