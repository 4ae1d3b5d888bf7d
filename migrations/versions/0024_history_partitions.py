"""History at scale: audit_event and action_attempt partitioned by month; the leader's
functions for months ahead and for the history's retention.

Revision ID: 0024
Revises: 0023

Both tables only grow (the runtime role may insert and read them, nothing else), and a
large installation's reached hundreds of GB, where neither a DELETE nor a VACUUM keeps
up. Each becomes a table partitioned by RANGE of its time column, one partition a UTC
month (<table>_pYYYY_MM) and a DEFAULT partition (<table>_default) for any row of a
month without one; a month past every retention is then dropped whole.

A partitioned table's primary key must hold the partition key: audit_event's becomes
(id, created_at) (id stays an identity, so still unique and still the order of events),
action_attempt's (execution_id, action_id, attempt, started_at). Every line of one
attempt carries its checkpoint's start (the interrupted line and the ended line alike),
so the ON CONFLICT DO NOTHING of the protocol's writes still meets the earlier line.

The rows move in this migration's transaction: the old table is renamed, the new one
made with partitions for every month from its oldest row to three months ahead, the
rows copied (ids kept, the identity continuing where the old one stood), the old table
dropped and the runtime role's grants given again, exactly as before. The downgrade
moves the rows back into plain tables the same way.

Two functions owned by the owner and run with its rights (SECURITY DEFINER, search_path
pinned, EXECUTE for the runtime role only), as 0009's purge:
- orquestador_history_partitions(months): this month's and the next MONTHS' partitions
  of both tables, made when missing; returns how many it made.
- orquestador_history_purge(succeeded, failed, batch): one bounded round of retention.
  First, at most one month of each table older than the longer period is dropped whole;
  the rows in it of an execution not yet past its period (not ended, parked in
  RECONCILIATION_REQUIRED, or ended more recently) are moved to the DEFAULT partition
  first. Then up to BATCH rows of each table whose execution ended SUCCEEDED or
  CANCELLED more than SUCCEEDED ago, or FAILED more than FAILED ago, are deleted. A row
  of no execution goes with its month.
Both wait at most lock_timeout (2 s) for a table's lock: a leader never queues the
product's writes behind a long reader; a month it could not take is tried next pass.
"""

from alembic import op
from sqlalchemy import text

from orquestador.db.grants import grant_runtime, runtime_role
from orquestador.db.schema import (
    HISTORY_PARTITIONS_FUNCTION,
    HISTORY_PARTITIONS_SIGNATURE,
    HISTORY_PURGE_FUNCTION,
    HISTORY_PURGE_SIGNATURE,
)

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

MONTHS_AHEAD = 3
_MONTH_SIGNATURE = "orquestador_history_month(text, date)"

_AUDIT_COLUMNS = """
    id bigint GENERATED ALWAYS AS IDENTITY,
    org_id text NOT NULL,
    kind text NOT NULL,
    request_id uuid,
    execution_id uuid,
    actor text,
    detail jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
"""
_ATTEMPT_COLUMNS = """
    execution_id uuid NOT NULL,
    action_id text NOT NULL,
    attempt integer NOT NULL,
    fencing_token bigint NOT NULL,
    status text NOT NULL,
    error_code text,
    message text,
    started_at timestamptz NOT NULL,
    finished_at timestamptz,
    CONSTRAINT ck_action_attempt_status CHECK (status IN ('SUCCEEDED', 'FAILED', 'UNKNOWN')),
    CONSTRAINT ck_action_attempt_message_length CHECK (length(message) <= 1024)
"""
_ATTEMPT_KEY = (
    "ALTER TABLE action_attempt ADD CONSTRAINT"
    " fk_action_attempt_execution_id_action_id_action_execution"
    " FOREIGN KEY (execution_id, action_id)"
    " REFERENCES action_execution (execution_id, action_id)"
)

# One month's partition of one history table, made when missing. Not executable by the
# runtime role: the definer functions below call it with the owner's rights.
_MONTH = """
CREATE FUNCTION orquestador_history_month(p_table text, p_month date) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_name text := p_table || '_p' || to_char(p_month, 'YYYY_MM');
    v_schema text;
BEGIN
    IF p_table NOT IN ('audit_event', 'action_attempt') THEN
        RAISE EXCEPTION 'not a history table: %', p_table;
    END IF;
    SELECT n.nspname INTO v_schema
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = p_table::regclass;
    IF to_regclass(format('%I.%I', v_schema, v_name)) IS NOT NULL THEN
        RETURN false;
    END IF;
    -- Bounds are UTC months, whatever the session's time zone. Named with the parent's
    -- schema: the first schema of a pinned search_path is pg_catalog.
    EXECUTE format(
        'CREATE TABLE %I.%I PARTITION OF %I.%I FOR VALUES FROM (%L) TO (%L)',
        v_schema, v_name, v_schema, p_table,
        date_trunc('month', p_month::timestamp) AT TIME ZONE 'UTC',
        (date_trunc('month', p_month::timestamp) + interval '1 month') AT TIME ZONE 'UTC');
    RETURN true;
END
$$
"""

_PARTITIONS = f"""
CREATE FUNCTION {HISTORY_PARTITIONS_FUNCTION}(p_months integer) RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    v_this date := date_trunc('month', clock_timestamp() AT TIME ZONE 'UTC')::date;
    v_made integer := 0;
    v_table text;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['audit_event', 'action_attempt'] LOOP
        FOR i IN 0 .. greatest(p_months, 0) LOOP
            BEGIN
                IF orquestador_history_month(v_table, (v_this + make_interval(months => i))::date)
                THEN
                    v_made := v_made + 1;
                END IF;
            EXCEPTION
                -- Busy table: next pass. Rows of that month already in the DEFAULT
                -- partition (a clock far ahead): they stay there, and so does the month.
                WHEN lock_not_available OR check_violation THEN
                    RAISE WARNING 'history partition %_p% not made: %',
                        v_table, to_char(v_this + make_interval(months => i), 'YYYY_MM'), SQLERRM;
            END;
        END LOOP;
    END LOOP;
    RETURN v_made;
END
$$
"""

# Whether execution e's history is past its period: ended SUCCEEDED or CANCELLED longer
# ago than p_succeeded, or FAILED longer ago than p_failed. Never a running, waiting or
# parked (RECONCILIATION_REQUIRED) one.
_EXPIRED_TEMPLATE = """
    e.finished_at IS NOT NULL
    AND ((e.status IN ('SUCCEEDED', 'CANCELLED') AND e.finished_at < clock_timestamp() - {s})
      OR (e.status = 'FAILED' AND e.finished_at < clock_timestamp() - {f}))
"""
_EXPIRED = _EXPIRED_TEMPLATE.format(s="p_succeeded", f="p_failed")
# The same, inside a dynamic statement (EXECUTE ... USING p_succeeded, p_failed).
_EXPIRED_DYNAMIC = " ".join(_EXPIRED_TEMPLATE.format(s="$1", f="$2").split()).replace("'", "''")

_PURGE = f"""
CREATE FUNCTION {HISTORY_PURGE_FUNCTION}(
    p_succeeded interval, p_failed interval, p_batch integer
) RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    v_month record;
    v_audit audit_event[];
    v_attempts action_attempt[];
    v_count integer;
    v_deleted integer := 0;
BEGIN
    -- 1. The oldest month of each table that ended before the longer period began.
    FOR v_month IN
        SELECT DISTINCT ON (parent.relname) parent.relname AS parent,
               format('%I.%I', n.nspname, c.relname) AS name
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_class parent ON parent.oid = i.inhparent
        WHERE i.inhparent IN ('audit_event'::regclass, 'action_attempt'::regclass)
          AND c.relname ~ '_p[0-9]{{4}}_[0-9]{{2}}$'
          AND (to_date(right(c.relname, 7), 'YYYY_MM')::timestamp
               + interval '1 month') AT TIME ZONE 'UTC'
              <= clock_timestamp() - greatest(p_succeeded, p_failed)
        ORDER BY parent.relname, c.relname
    LOOP
        BEGIN
            -- Rows whose execution is still within its period outlive their month: they
            -- move to the DEFAULT partition (no month covers them once it is dropped).
            IF v_month.parent = 'audit_event' THEN
                EXECUTE format(
                    'SELECT coalesce(array_agg(ROW(k.*)::audit_event), ''{{}}'') FROM %s k'
                    ' WHERE EXISTS (SELECT 1 FROM execution e WHERE e.id = k.execution_id'
                    ' AND NOT ({_EXPIRED_DYNAMIC}))',
                    v_month.name) INTO v_audit USING p_succeeded, p_failed;
                EXECUTE format('DROP TABLE %s', v_month.name);
                INSERT INTO audit_event OVERRIDING SYSTEM VALUE SELECT * FROM unnest(v_audit);
            ELSE
                EXECUTE format(
                    'SELECT coalesce(array_agg(ROW(k.*)::action_attempt), ''{{}}'') FROM %s k'
                    ' WHERE EXISTS (SELECT 1 FROM execution e WHERE e.id = k.execution_id'
                    ' AND NOT ({_EXPIRED_DYNAMIC}))',
                    v_month.name) INTO v_attempts USING p_succeeded, p_failed;
                EXECUTE format('DROP TABLE %s', v_month.name);
                INSERT INTO action_attempt SELECT * FROM unnest(v_attempts);
            END IF;
            RAISE LOG 'history partition % dropped', v_month.name;
        EXCEPTION WHEN lock_not_available THEN
            RAISE WARNING 'history partition % not dropped: %', v_month.name, SQLERRM;
        END;
    END LOOP;

    -- 2. Row by row, inside the months kept: one batch of each table. Only rows older
    -- than the shorter period can qualify, so younger months are never read. The
    -- execution is share-locked, so one that leaves its end (an operator's retry)
    -- meanwhile is seen as it is then.
    DELETE FROM audit_event
    WHERE (id, created_at) IN (
        SELECT a.id, a.created_at
        FROM audit_event a JOIN execution e ON e.id = a.execution_id
        WHERE a.created_at < clock_timestamp() - least(p_succeeded, p_failed)
          AND {_EXPIRED}
        LIMIT p_batch
        FOR SHARE OF e SKIP LOCKED
    );
    GET DIAGNOSTICS v_count = ROW_COUNT;
    v_deleted := v_deleted + v_count;
    DELETE FROM action_attempt
    WHERE (execution_id, action_id, attempt, started_at) IN (
        SELECT t.execution_id, t.action_id, t.attempt, t.started_at
        FROM action_attempt t JOIN execution e ON e.id = t.execution_id
        WHERE t.started_at < clock_timestamp() - least(p_succeeded, p_failed)
          AND {_EXPIRED}
        LIMIT p_batch
        FOR SHARE OF e SKIP LOCKED
    );
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_deleted + v_count;
END
$$
"""


def _schema() -> str:
    return op.get_bind().execute(text("SELECT current_schema()")).scalar_one()


def _scalar(sql: str) -> object:
    return op.get_bind().execute(text(sql)).scalar()


def _partition(table: str, key: str, columns: str, primary_key: tuple[str, ...]) -> None:
    """Replace TABLE by a table partitioned by month of KEY holding the same rows."""
    op.execute(text(f"ALTER TABLE {table} RENAME TO {table}_unpartitioned"))
    op.execute(text(f"ALTER INDEX pk_{table} RENAME TO pk_{table}_unpartitioned"))
    op.execute(text(f"CREATE TABLE {table} ({columns}) PARTITION BY RANGE ({key})"))
    op.execute(text(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT"))
    # Every month that holds a row, through this month and MONTHS_AHEAD more.
    op.execute(
        text(
            f"""
            SELECT orquestador_history_month(:table, month::date)
            FROM generate_series(
                date_trunc('month', coalesce(
                    (SELECT min({key}) FROM {table}_unpartitioned), clock_timestamp())
                    AT TIME ZONE 'UTC'),
                date_trunc('month', clock_timestamp() AT TIME ZONE 'UTC')
                    + make_interval(months => :ahead),
                interval '1 month') AS month
            """
        ).bindparams(table=table, ahead=MONTHS_AHEAD)
    )
    overriding = " OVERRIDING SYSTEM VALUE" if table == "audit_event" else ""
    op.execute(text(f"INSERT INTO {table}{overriding} SELECT * FROM {table}_unpartitioned"))
    # The keys and indexes once the rows are in: built in one pass, not row by row.
    op.execute(
        text(
            f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY ({', '.join(primary_key)})"
        )
    )


def _unpartition(table: str, columns: str, primary_key: tuple[str, ...]) -> None:
    """Replace the partitioned TABLE by a plain one holding the same rows."""
    op.execute(text(f"ALTER TABLE {table} RENAME TO {table}_partitioned"))
    op.execute(text(f"ALTER INDEX pk_{table} RENAME TO pk_{table}_partitioned"))
    op.execute(text(f"CREATE TABLE {table} ({columns})"))
    overriding = " OVERRIDING SYSTEM VALUE" if table == "audit_event" else ""
    op.execute(text(f"INSERT INTO {table}{overriding} SELECT * FROM {table}_partitioned"))
    op.execute(
        text(
            f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY ({', '.join(primary_key)})"
        )
    )


def _audit_indexes_renamed(suffix: str) -> None:
    for column in ("execution_id", "request_id"):
        op.execute(
            text(f"ALTER INDEX ix_audit_event_{column} RENAME TO ix_audit_event_{column}_{suffix}")
        )


def _audit_indexes() -> None:
    for column in ("execution_id", "request_id"):
        op.execute(text(f"CREATE INDEX ix_audit_event_{column} ON audit_event ({column})"))


def _continue_identity(old_sequence: str) -> None:
    # The next id is the one the old table would have given: none is ever handed out twice.
    last, called = (
        op.get_bind().execute(text(f"SELECT last_value, is_called FROM {old_sequence}")).one()
    )
    op.execute(
        text(f"ALTER TABLE audit_event ALTER COLUMN id RESTART WITH {last + 1 if called else last}")
    )


def _functions_owned(schema: str) -> None:
    role = runtime_role()
    for signature in (_MONTH_SIGNATURE, HISTORY_PARTITIONS_SIGNATURE, HISTORY_PURGE_SIGNATURE):
        op.execute(
            text(
                f"ALTER FUNCTION {schema}.{signature}"
                f" SET search_path = pg_catalog, {schema}, pg_temp"
            )
        )
        op.execute(text(f"REVOKE ALL ON FUNCTION {schema}.{signature} FROM PUBLIC"))
    for signature in (HISTORY_PARTITIONS_SIGNATURE, HISTORY_PURGE_SIGNATURE):
        op.execute(text(f"ALTER FUNCTION {schema}.{signature} SET lock_timeout = '2s'"))
        if role is not None:
            quoted = op.get_bind().dialect.identifier_preparer.quote(role)
            op.execute(text(f"GRANT EXECUTE ON FUNCTION {schema}.{signature} TO {quoted}"))


def upgrade() -> None:
    schema = _schema()
    op.execute(text(_MONTH))

    _audit_indexes_renamed("unpartitioned")
    op.execute(text("ALTER SEQUENCE audit_event_id_seq RENAME TO audit_event_unpartitioned_id_seq"))
    _partition("audit_event", "created_at", _AUDIT_COLUMNS, ("id", "created_at"))
    _continue_identity("audit_event_unpartitioned_id_seq")
    _audit_indexes()
    op.execute(text("DROP TABLE audit_event_unpartitioned"))

    _partition(
        "action_attempt",
        "started_at",
        _ATTEMPT_COLUMNS,
        ("execution_id", "action_id", "attempt", "started_at"),
    )
    op.execute(text("DROP TABLE action_attempt_unpartitioned"))
    op.execute(text(_ATTEMPT_KEY))

    for table in ("audit_event", "action_attempt"):
        grant_runtime(table, ("SELECT", "INSERT"))

    op.execute(text(_PARTITIONS))
    op.execute(text(_PURGE))
    _functions_owned(schema)


def downgrade() -> None:
    for signature in (HISTORY_PURGE_SIGNATURE, HISTORY_PARTITIONS_SIGNATURE, _MONTH_SIGNATURE):
        op.execute(text(f"DROP FUNCTION {signature}"))

    _audit_indexes_renamed("partitioned")
    op.execute(text("ALTER SEQUENCE audit_event_id_seq RENAME TO audit_event_partitioned_id_seq"))
    _unpartition("audit_event", _AUDIT_COLUMNS, ("id",))
    _continue_identity("audit_event_partitioned_id_seq")
    _audit_indexes()
    op.execute(text("DROP TABLE audit_event_partitioned"))

    _unpartition("action_attempt", _ATTEMPT_COLUMNS, ("execution_id", "action_id", "attempt"))
    op.execute(text("DROP TABLE action_attempt_partitioned"))
    op.execute(text(_ATTEMPT_KEY))

    for table in ("audit_event", "action_attempt"):
        grant_runtime(table, ("SELECT", "INSERT"))
