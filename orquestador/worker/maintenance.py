"""The maintenance loop: retention, history months, undelivered commands, queue gauges and
the e-mail hand-off.

Every worker runs this loop (the daemon starts it beside the background loops); each
pass, a worker first makes sure it holds the maintenance lock, a PostgreSQL session
advisory lock taken on a connection of its own.
The lock lives exactly as long as that connection: a worker that dies, or whose
connection drops (a database restart, a failover), loses it, and another worker takes
it at its next pass. So at any time at most one worker does the work, with no cron and
no table of leaders. Everything a pass does is safe to repeat (bounded batches,
SKIP LOCKED), so a pass interrupted by a lost connection leaves nothing half done.

Two passes can overlap for a moment: a leader whose lock connection dropped may still
be in its current step when another worker takes the lock and starts. That stays safe
because no step depends on being alone: each is its own transaction, deletes only
rows past their age that it could lock (SKIP LOCKED, so two passes take disjoint
rows), expires only pending commands past their deliver-by time (SKIP LOCKED), hands
off only expired outbox leases (idempotent), or reads gauges.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, TextClause, text
from sqlalchemy.exc import ProgrammingError

from orquestador.config import Settings, libpq_url
from orquestador.db.bounds import floors_above, read_function_bounds
from orquestador.db.schema import OPEN_EXECUTION, PURGE_SIMULATIONS_FUNCTION
from orquestador.db.sql_literals import quoted
from orquestador.domain.quotas import Quotas
from orquestador.domain.statuses import UNHELD, BulkStatus, ExecutionStatus, OutboxStatus
from orquestador.history.retention import make_months_ahead, purge_history
from orquestador.loop import Loop
from orquestador.machines.expiry import expire_undelivered
from orquestador.machines.liveness import count_offline
from orquestador.machines.retention import delete_final_commands
from orquestador.metrics import (
    AGENTS_OFFLINE,
    DB_DEAD_TUPLES,
    DB_OLDEST_TRANSACTION_SECONDS,
    EMAIL_OUTBOX_DEPTH,
    GAUGED_QUOTAS,
    HOT_TABLES,
    MAINTENANCE_LEADER,
    OLDEST_DUE_SECONDS,
    QUEUE_DEPTH,
    QUEUE_STATUSES,
    QUOTA_USE_RATIO,
    RECONCILIATION_REQUIRED,
)
from orquestador.redaction import error_line
from orquestador.worker.listener import libpq_conninfo

log = logging.getLogger(__name__)

# The advisory lock key of the maintenance leader (a fixed bigint: every worker of one
# database must use the same; no other part of the product takes advisory locks).
MAINTENANCE_LOCK_KEY = 7_311_970_042_001
# Rows deleted per statement (one transaction each), and statements per table per pass:
# a pass stays short, and a large backlog drains over the next passes.
RETENTION_BATCH = 500
RETENTION_BATCHES_PER_PASS = 20
# The lock connection notices a dead peer within about this long (TCP keepalives).
_KEEPALIVE: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5}
_CONNECT_TIMEOUT_SECONDS = 5


class LeaderLock:
    """pg_try_advisory_lock on a dedicated connection; held while that connection lives."""

    def __init__(self, conninfo: str, key: int = MAINTENANCE_LOCK_KEY) -> None:
        self._conninfo = conninfo
        self._key = key
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self.held = False

    def hold(self) -> bool:
        """True when this process holds the lock now (taking it if it is free).

        A connection that fails its check means the lock is gone with it (the server
        ended the session); the error propagates after the connection is dropped, and
        the next call starts over.
        """
        try:
            if self._conn is None or self._conn.closed:
                self.held = False
                self._conn = psycopg.connect(
                    self._conninfo,
                    autocommit=True,
                    application_name="orquestador-maintenance",
                    connect_timeout=_CONNECT_TIMEOUT_SECONDS,
                    **_KEEPALIVE,
                )
            if self.held:
                self._conn.execute("SELECT 1")
            else:
                row = self._conn.execute("SELECT pg_try_advisory_lock(%s)", (self._key,)).fetchone()
                self.held = bool(row and row[0])
            return self.held
        except Exception:
            self.release()
            raise

    def release(self) -> None:
        """Give the lock back, then close the connection.

        Closing alone would also drop it, but only once the server has ended the
        session, a moment later: the next leader (or the next pass of a test) could find
        it still taken. An already broken connection has nothing left to release.
        """
        held, self.held = self.held, False
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                if held:
                    conn.execute("SELECT pg_advisory_unlock(%s)", (self._key,))
                conn.close()


@dataclass
class PassReport:
    """What one pass of the leader did (tests and the pass's log line read it)."""

    deleted: dict[str, int] = field(default_factory=dict)
    history_months_made: int = 0
    # Pending machine commands past their deliver-by time, now expired.
    expired_commands: int = 0
    handed_off: int = 0
    queue_depth: dict[str, int] = field(default_factory=dict)
    oldest_due_seconds: float = 0.0
    reconciliation_required: int = 0
    email_outbox_depth: int = 0
    agents_offline: int = 0
    oldest_transaction_seconds: float = 0.0
    dead_tuples: dict[str, int] = field(default_factory=dict)
    quota_use: dict[str, float] = field(default_factory=dict)


# --- retention ----------------------------------------------------------------

# Delivered e-mails (and those given up on) past their age; a pending one never.
_DELETE_FINAL_EMAILS = text(
    f"""
    DELETE FROM email_outbox
    WHERE id IN (
        SELECT id FROM email_outbox
        WHERE status IN ('{OutboxStatus.SENT}', '{OutboxStatus.FAILED}')
          AND coalesce(sent_at, created_at) <= clock_timestamp() - make_interval(days => :days)
        ORDER BY coalesce(sent_at, created_at)
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    """
)

# Dismissed notices past their age. A notice's e-mail goes with it (ON DELETE CASCADE),
# so one whose e-mail is still pending waits until the e-mail is settled.
_DELETE_DISMISSED_NOTICES = text(
    f"""
    DELETE FROM panel_notice
    WHERE id IN (
        SELECT n.id FROM panel_notice n
        WHERE n.dismissed_at <= clock_timestamp() - make_interval(days => :days)
          AND NOT EXISTS (
              SELECT 1 FROM email_outbox o
              WHERE o.notice_id = n.id AND o.status = '{OutboxStatus.PENDING}'
          )
        ORDER BY n.dismissed_at
        LIMIT :batch
        FOR UPDATE OF n SKIP LOCKED
    )
    """
)

# A schedule never goes back to a fire time it handled (its next fire time only moves on),
# so a fire row past its age guards nothing any more.
_DELETE_OLD_FIRES = text(
    """
    DELETE FROM schedule_fire
    WHERE (org_id, schedule_id, fire_time) IN (
        SELECT f.org_id, f.schedule_id, f.fire_time FROM schedule_fire f
        WHERE f.fired_at <= clock_timestamp() - make_interval(days => :days)
        ORDER BY f.fired_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    """
)

# A finished bulk action and its items go together: the items first, in the same
# statement. A batch counts bulks; their items are at most BULK_MAX_ITEMS each.
_DELETE_FINISHED_BULKS = text(
    f"""
    WITH old AS (
        SELECT id FROM bulk_action
        WHERE status = '{BulkStatus.DONE}'
          AND finished_at <= clock_timestamp() - make_interval(days => :days)
        ORDER BY finished_at
        LIMIT greatest(:batch / 100, 1)
        FOR UPDATE SKIP LOCKED
    ), items AS (
        DELETE FROM bulk_item WHERE bulk_id IN (SELECT id FROM old)
    )
    DELETE FROM bulk_action WHERE id IN (SELECT id FROM old)
    """
)

# Requests and executions are append-only for the runtime role; migration 0009's
# function deletes simulated ones only (with executions, checkpoints and attempts).
_PURGE_SIMULATIONS = text(
    f"SELECT {PURGE_SIMULATIONS_FUNCTION}(make_interval(days => :days), :batch)"
)


Deleter = Callable[[Connection, int, int], int]


def _rows_deleted_by(statement: TextClause) -> Deleter:
    def delete_batch(conn: Connection, days: int, batch: int) -> int:
        return int(conn.execute(statement, {"days": days, "batch": batch}).rowcount)

    return delete_batch


def _purge_simulations(conn: Connection, days: int, batch: int) -> int:
    # Counts simulated requests; their executions and checkpoints go with them.
    return int(conn.execute(_PURGE_SIMULATIONS, {"days": days, "batch": batch}).scalar_one())


def _history_by_outcome(failed_days: int) -> Deleter:
    # `days` is the period of succeeded and cancelled executions; failed ones keep theirs.
    def delete_batch(conn: Connection, days: int, batch: int) -> int:
        return purge_history(conn, days, failed_days, batch)

    return delete_batch


def retention_rules(settings: Settings) -> list[tuple[str, int, Deleter]]:
    """(table, age in days, delete one batch) for every table with a retention period."""
    return [
        ("machine_command", settings.machine_command_retention_days, delete_final_commands),
        ("email_outbox", settings.email_retention_days, _rows_deleted_by(_DELETE_FINAL_EMAILS)),
        (
            "panel_notice",
            settings.notice_retention_days,
            _rows_deleted_by(_DELETE_DISMISSED_NOTICES),
        ),
        ("request", settings.simulation_retention_days, _purge_simulations),
        (
            "schedule_fire",
            settings.schedule_fire_retention_days,
            _rows_deleted_by(_DELETE_OLD_FIRES),
        ),
        ("bulk_action", settings.bulk_retention_days, _rows_deleted_by(_DELETE_FINISHED_BULKS)),
        # Audit rows and attempts together (counted under the first table).
        (
            "audit_event",
            settings.history_retention_days,
            _history_by_outcome(settings.history_retention_failed_days),
        ),
    ]


def apply_retention(
    engine: Engine,
    settings: Settings,
    *,
    batch: int = RETENTION_BATCH,
    batches_per_pass: int = RETENTION_BATCHES_PER_PASS,
) -> tuple[dict[str, int], bool]:
    """Delete what is past its age, batch by batch; (deleted per table, more left)."""
    _warn_below_floors(engine, settings)
    deleted: dict[str, int] = {}
    more = False
    for table, days, delete_batch in retention_rules(settings):
        total = 0
        try:
            for _ in range(batches_per_pass):
                with engine.begin() as conn:
                    count = delete_batch(conn, days, batch)
                total += count
                if count < batch:
                    break
            else:
                more = True
        except ProgrammingError as exc:
            # A missing grant (or a function a migration has not created yet) stops this
            # table's retention only: the others, the gauges and the hand-off go on. A lost
            # connection is not this error and fails the pass (the loop backs off).
            log.warning(
                "retention of %s failed: %s (`orquestador migrate grant` applies the runtime"
                " role's grants, `orquestador check` names what is missing)",
                table,
                error_line(exc),
            )
        deleted[table] = total
    return deleted, more


def expire_commands(
    engine: Engine,
    *,
    batch: int = RETENTION_BATCH,
    batches_per_pass: int = RETENTION_BATCHES_PER_PASS,
) -> tuple[int, bool]:
    """Expire pending commands past their deliver-by time, batch by batch; (how many,
    more left). No agent could be handed them anyway: this only says so on every page."""
    total = 0
    for _ in range(batches_per_pass):
        with engine.begin() as conn:
            count = expire_undelivered(conn, batch)
        total += count
        if count < batch:
            return total, False
    return total, True


def _warn_below_floors(engine: Engine, settings: Settings) -> None:
    """One line a pass for each retention setting below the owner's floor: the functions
    keep the floor's days, so this worker's setting does not take effect."""
    try:
        with engine.connect() as conn:
            bounds = read_function_bounds(conn)
    except ProgrammingError:
        return  # no SELECT on the bounds: the retention's own warnings say what is missing
    for setting, value, floor in floors_above(settings, bounds) if bounds else ():
        log.warning(
            "%s=%d is below the %d days the owner allows (set when it migrated): kept %d"
            " days; to go lower, run 'orquestador migrate grant' as the owner with %s=%d",
            setting,
            value,
            floor,
            floor,
            setting,
            value,
        )


def make_history_months(engine: Engine) -> int:
    """The history's months ahead (idempotent); 0 with a warning when it cannot."""
    try:
        with engine.begin() as conn:
            return make_months_ahead(conn)
    except ProgrammingError as exc:
        # A database before migration 0024, or a missing grant: rows go to the DEFAULT
        # partition meanwhile, and the rest of the pass goes on.
        log.warning(
            "history months ahead not made: %s (`orquestador migrate` creates the function,"
            " `orquestador migrate grant` grants it)",
            error_line(exc),
        )
        return 0


# --- gauges and hand-off ------------------------------------------------------------

# Three counts, each served by a partial index of execution.
_WAITING_DEPTH = text(
    f"SELECT status, count(*) FROM execution WHERE status IN ({quoted(UNHELD)}) GROUP BY status"
)
_RUNNING_DEPTH = text(f"SELECT count(*) FROM execution WHERE status = '{ExecutionStatus.RUNNING}'")
_RECONCILIATION_DEPTH = text(
    f"SELECT count(*) FROM execution WHERE status = '{ExecutionStatus.RECONCILIATION_REQUIRED}'"
)
# How long the oldest claimable execution has waited: due and not running, or running
# under a lease that expired (its worker is gone).
_OLDEST_DUE = text(
    f"""
    SELECT greatest(
        (SELECT extract(epoch FROM clock_timestamp() - min(next_attempt_at))
         FROM execution
         WHERE status IN ({quoted(UNHELD)}) AND NOT key_blocked
           AND next_attempt_at <= clock_timestamp()),
        (SELECT extract(epoch FROM clock_timestamp() - min(lease_expires_at))
         FROM execution
         WHERE status = '{ExecutionStatus.RUNNING}' AND lease_expires_at <= clock_timestamp()),
        0)
    """
)
_OUTBOX_DEPTH = text(f"SELECT count(*) FROM email_outbox WHERE status = '{OutboxStatus.PENDING}'")
# The oldest open transaction in this database but the sampler's own. Without
# pg_read_all_stats a role sees only its own sessions' xact_start: the product's.
_OLDEST_TRANSACTION = text(
    """
    SELECT coalesce(extract(epoch FROM clock_timestamp() - min(xact_start)), 0)
    FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND xact_start IS NOT NULL
    """
)
# Dead tuples per hot table; a partition counts for the table it belongs to.
_DEAD_TUPLES = text(
    """
    SELECT coalesce(parent.relname, s.relname) AS name, sum(s.n_dead_tup)::bigint AS dead
    FROM pg_stat_user_tables s
    LEFT JOIN pg_inherits i ON i.inhrelid = s.relid
    LEFT JOIN pg_class parent ON parent.oid = i.inhparent
    WHERE s.schemaname = current_schema()
      AND coalesce(parent.relname, s.relname) = ANY(:tables)
    GROUP BY 1
    """
).bindparams(tables=list(HOT_TABLES))
# A mailer that died holding a row leaves an expired lease: clear it and make the row
# due now, so any mailer takes it at once instead of after its backoff.
_HAND_OFF = text(
    f"""
    UPDATE email_outbox
    SET lease_owner = NULL, lease_expires_at = NULL,
        next_attempt_at = least(next_attempt_at, clock_timestamp())
    WHERE status = '{OutboxStatus.PENDING}' AND lease_expires_at <= clock_timestamp()
    """
)


# Each organization's use of the quotas that last: schedules held, the transition
# tokens its bucket is short of (refilled for the time since it was last drawn on), and
# its executions not ended (from the partial index ix_execution_open).
_QUOTA_USE = text(
    f"""
    SELECT org_id, 'schedules' AS quota, count(*)::float AS used
    FROM schedule GROUP BY org_id
    UNION ALL
    SELECT substr(name, length('org-transitions:') + 1), 'transitionsBurst', tokens
    FROM rate_bucket WHERE name LIKE 'org-transitions:%'
    UNION ALL
    SELECT org_id, 'openExecutions', count(*)::float
    FROM execution WHERE {OPEN_EXECUTION} GROUP BY org_id
    """
)


def quota_use_ratios(conn: Connection, quotas_for: Callable[[str], Quotas]) -> dict[str, float]:
    """Per gauged quota, the highest share of its limit any organization uses."""
    ratios = dict.fromkeys(GAUGED_QUOTAS, 0.0)
    for org, quota, value in conn.execute(_QUOTA_USE):
        limits = quotas_for(org)
        if quota == "schedules":
            used, limit = value, limits.schedules
        elif quota == "openExecutions":
            used, limit = value, limits.open_executions
        else:
            # The bucket's tokens as last written; refilling since only lowers the use.
            used, limit = limits.transitions_burst - value, limits.transitions_burst
        share = used / limit if limit > 0 else (1.0 if used > 0 else 0.0)
        ratios[quota] = max(ratios[quota], min(1.0, max(0.0, share)))
    return ratios


def sample_gauges(
    conn: Connection,
    report: PassReport,
    *,
    agent_offline_seconds: float,
    quotas_for: Callable[[str], Quotas] | None = None,
) -> None:
    depth: dict[str, int] = {status: 0 for status in QUEUE_STATUSES}
    depth.update({status: int(n) for status, n in conn.execute(_WAITING_DEPTH).all()})
    depth[ExecutionStatus.RUNNING] = int(conn.execute(_RUNNING_DEPTH).scalar_one())
    depth[ExecutionStatus.RECONCILIATION_REQUIRED] = int(
        conn.execute(_RECONCILIATION_DEPTH).scalar_one()
    )
    report.queue_depth = depth
    report.oldest_due_seconds = float(conn.execute(_OLDEST_DUE).scalar_one())
    report.reconciliation_required = depth[ExecutionStatus.RECONCILIATION_REQUIRED]
    report.email_outbox_depth = int(conn.execute(_OUTBOX_DEPTH).scalar_one())
    report.agents_offline = count_offline(conn, agent_offline_seconds)
    report.oldest_transaction_seconds = float(conn.execute(_OLDEST_TRANSACTION).scalar_one())
    report.dead_tuples = {table: 0 for table in HOT_TABLES}
    report.dead_tuples.update({row.name: int(row.dead) for row in conn.execute(_DEAD_TUPLES)})
    for status, n in depth.items():
        QUEUE_DEPTH.labels(status=status).set(n)
    OLDEST_DUE_SECONDS.set(report.oldest_due_seconds)
    RECONCILIATION_REQUIRED.set(report.reconciliation_required)
    EMAIL_OUTBOX_DEPTH.set(report.email_outbox_depth)
    AGENTS_OFFLINE.set(report.agents_offline)
    DB_OLDEST_TRANSACTION_SECONDS.set(report.oldest_transaction_seconds)
    for table, dead in report.dead_tuples.items():
        DB_DEAD_TUPLES.labels(table=table).set(dead)
    if quotas_for is not None:
        report.quota_use = quota_use_ratios(conn, quotas_for)
        for quota, share in report.quota_use.items():
            QUOTA_USE_RATIO.labels(quota=quota).set(share)


def _zero_gauges() -> None:
    # A worker that is not the leader reports 0, so `max` over all workers is the
    # leader's value (a former leader would otherwise keep exposing stale numbers).
    for status in QUEUE_STATUSES:
        QUEUE_DEPTH.labels(status=status).set(0)
    OLDEST_DUE_SECONDS.set(0)
    RECONCILIATION_REQUIRED.set(0)
    EMAIL_OUTBOX_DEPTH.set(0)
    AGENTS_OFFLINE.set(0)
    DB_OLDEST_TRANSACTION_SECONDS.set(0)
    for table in HOT_TABLES:
        DB_DEAD_TUPLES.labels(table=table).set(0)
    for quota in GAUGED_QUOTAS:
        QUOTA_USE_RATIO.labels(quota=quota).set(0)


# --- the loop ------------------------------------------------------------------


class MaintenanceLoop(Loop):
    """Every MAINTENANCE_INTERVAL_SECONDS: lead or stand by; the leader does one pass."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        worker_id: str,
        *,
        lock: LeaderLock | None = None,
        on_pass: Callable[[PassReport], None] | None = None,
    ) -> None:
        super().__init__("maintenance", settings.maintenance_interval_seconds)
        self.settings = settings
        self.engine = engine
        self.worker_id = worker_id
        # An advisory lock is session state: a direct connection when PgBouncer fronts
        # DATABASE_URL (LISTEN_DATABASE_URL names it).
        direct = settings.listen_database_url or libpq_conninfo(engine.url)
        self.lock = lock or LeaderLock(libpq_url(direct))
        self.on_pass = on_pass
        self.passes = 0  # passes this worker did as the leader
        self._was_leader = False
        self._lock = threading.Lock()
        # Held while the gauges are set or zeroed: a worker stepping down never leaves
        # a sample behind it.
        self._gauges_lock = threading.Lock()

    def run(self) -> None:
        try:
            super().run()
        finally:
            self.lock.release()
            if self._was_leader:
                MAINTENANCE_LEADER.set(0)

    def run_once(self) -> bool:
        try:
            leader = self.lock.hold()
        except Exception:
            self._step_down("its connection failed")
            raise
        if not leader:
            self._step_down("another worker holds the lock")
            return False
        if not self._was_leader:
            log.info("maintenance leadership taken", extra={"worker_id": self.worker_id})
            self._was_leader = True
            MAINTENANCE_LEADER.set(1)
        return self.run_pass()

    def _step_down(self, why: str) -> None:
        if self._was_leader:
            log.warning("maintenance leadership lost: %s", why, extra={"worker_id": self.worker_id})
            with self._gauges_lock:
                self._was_leader = False
                MAINTENANCE_LEADER.set(0)
                _zero_gauges()

    def sample_gauges_if_leader(self) -> bool:
        """Sample the gauges now when this worker leads (between its passes); whether it did."""
        with self._gauges_lock:
            if not self._was_leader:
                return False
            with self.engine.connect() as conn:
                sample_gauges(
                    conn,
                    PassReport(),
                    agent_offline_seconds=self.settings.agent_offline_seconds,
                    quotas_for=self.settings.quotas_for,
                )
        return True

    def run_pass(self) -> bool:
        """One pass (the caller holds the lock); True when retention has more to delete."""
        report = PassReport()
        report.history_months_made = make_history_months(self.engine)
        report.deleted, more = apply_retention(self.engine, self.settings)
        report.expired_commands, expiring = expire_commands(self.engine)
        more |= expiring
        with self.engine.begin() as conn:
            report.handed_off = conn.execute(_HAND_OFF).rowcount
        with self._gauges_lock, self.engine.connect() as conn:
            sample_gauges(
                conn,
                report,
                agent_offline_seconds=self.settings.agent_offline_seconds,
                quotas_for=self.settings.quotas_for,
            )
        with self._lock:
            self.passes += 1
        deleted = sum(report.deleted.values())
        log.log(
            logging.INFO
            if deleted or report.handed_off or report.expired_commands
            else logging.DEBUG,
            "maintenance pass",
            extra={
                "worker_id": self.worker_id,
                "deleted": deleted,
                **{f"deleted_{table}": n for table, n in report.deleted.items() if n},
                "handed_off": report.handed_off,
                "expired_commands": report.expired_commands,
                "history_months_made": report.history_months_made,
                "oldest_due_seconds": round(report.oldest_due_seconds, 3),
                "reconciliation_required": report.reconciliation_required,
                "email_outbox_depth": report.email_outbox_depth,
            },
        )
        if self.on_pass is not None:
            self.on_pass(report)
        return more
