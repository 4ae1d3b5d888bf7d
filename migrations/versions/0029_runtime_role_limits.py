"""The runtime role cannot rewrite history: the owner's bounds on what it may ask of the
SECURITY DEFINER functions, triggers on what stays written, no temporary tables.

Revision ID: 0029
Revises: 0027

A security probe (SPEC section 26) found the runtime role could erase the history
through the functions it may call: orquestador_history_purge took its retention periods
from its caller (three calls with `interval '-1000 years'` deleted every audit row and
attempt and dropped the current and future months, and returned 0 each time), and
orquestador_history_partitions(1000) made two thousand partitions ahead, which slowed
every look-up of the history and which retention never drops.

- function_bound (owner's; the runtime role may read it): the least retention of each
  period, the most months ahead and the most rows a call. This revision writes the
  defaults (db/bounds.py); every `orquestador migrate` at head and `orquestador migrate
  grant` write them again from the retention settings of the owner's environment.
- The three SECURITY DEFINER functions, same signatures (grants kept), take their
  arguments within those bounds: a shorter period is the owner's floor, a negative
  month count or batch is 0, a larger one the owner's most. The history purge's count
  now holds the rows of the months it dropped too (less those it kept in DEFAULT).
- Months made beyond the bound before this revision, while still empty, are dropped.
- What stays written, for the runtime role (its column grants would allow more), by
  triggers that refuse with insufficient_privilege and let the table's owner through: a
  revoked machine credential stays revoked, a used sign-in link stays used, a sign-out's
  record stays until its token expires, and a SUCCEEDED checkpoint's output and status
  never change (but for an operator's retry of a step recorded for another contract).
  Their WHEN clauses keep the worker's hot path from calling them.
- PUBLIC loses TEMPORARY on the database: behind PgBouncer in transaction mode, a
  temporary `audit_event` made by any client of the runtime role stood in for the real
  one in other tenants' transactions on that server connection (the API's statements
  name no schema). The downgrade leaves it revoked.
"""

from typing import Any

from alembic import op
from alembic.script import ScriptDirectory
from sqlalchemy import text

from orquestador.db.bounds import FunctionBounds, apply_function_bounds
from orquestador.db.grants import grant_runtime
from orquestador.db.schema import (
    HISTORY_PARTITIONS_FUNCTION,
    HISTORY_PARTITIONS_SIGNATURE,
    HISTORY_PURGE_FUNCTION,
    HISTORY_PURGE_SIGNATURE,
    PURGE_SIMULATIONS_SIGNATURE,
)

revision = "0029"
down_revision = "0027"
branch_labels = None
depends_on = None

_DEFAULTS = FunctionBounds()


def _bound(name: str, schema: str = "") -> str:
    """SQL for one bound: its row, else the default, so a deleted row never lifts it."""
    prefix = f"{schema}." if schema else ""
    equals = "OPERATOR(pg_catalog.=)" if schema else "="
    return (
        f"coalesce((SELECT b.value FROM {prefix}function_bound AS b"
        f" WHERE b.name {equals} '{name}'), {getattr(_DEFAULTS, name)})"
    )


# 0012's purge (every name with its schema S), its period and batch within the bounds.
# GREATEST and LEAST compare with the type's own ordering, found by no search path.
_PURGE_SIMULATIONS_BODY = """
DECLARE
    purged pg_catalog.uuid[];
    -- Never younger than the owner's retention, never more than its batch.
    v_age pg_catalog.interval := GREATEST($1, pg_catalog.make_interval(days => {age}));
    v_batch pg_catalog.int4 := LEAST(GREATEST(coalesce($2, 0), 0), {batch});
BEGIN
    -- Simulated requests past their age whose executions are all simulated and ended,
    -- oldest first; SKIP LOCKED leaves a request being written to the next pass.
    SELECT coalesce(pg_catalog.array_agg(r.id), '{{}}') INTO purged
    FROM (
        SELECT r.id
        FROM {s}.request AS r
        WHERE r.simulation
          AND r.created_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) v_age)
          AND NOT EXISTS (
              SELECT 1 FROM {s}.execution AS e
              WHERE e.request_id OPERATOR(pg_catalog.=) r.id
                AND (NOT e.simulation OR e.finished_at IS NULL)
          )
        ORDER BY r.created_at
        LIMIT v_batch
        FOR UPDATE SKIP LOCKED
    ) AS r;
    UPDATE {s}.request AS r SET busy_execution_id = NULL
        WHERE r.id OPERATOR(pg_catalog.=) ANY (purged) AND r.busy_execution_id IS NOT NULL;
    DELETE FROM {s}.action_attempt AS a USING {s}.execution AS e
        WHERE a.execution_id OPERATOR(pg_catalog.=) e.id
          AND e.request_id OPERATOR(pg_catalog.=) ANY (purged);
    DELETE FROM {s}.action_execution AS c USING {s}.execution AS e
        WHERE c.execution_id OPERATOR(pg_catalog.=) e.id
          AND e.request_id OPERATOR(pg_catalog.=) ANY (purged);
    DELETE FROM {s}.execution AS e WHERE e.request_id OPERATOR(pg_catalog.=) ANY (purged);
    DELETE FROM {s}.request AS r WHERE r.id OPERATOR(pg_catalog.=) ANY (purged);
    RETURN pg_catalog.cardinality(purged);
END
"""

_PARTITIONS = f"""
CREATE OR REPLACE FUNCTION {HISTORY_PARTITIONS_FUNCTION}(p_months integer) RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    v_this date := date_trunc('month', clock_timestamp() AT TIME ZONE 'UTC')::date;
    -- At most the owner's months ahead: a thousand asked are that many.
    v_months integer := LEAST(GREATEST(coalesce(p_months, 0), 0),
                              {_bound("history_months_ahead")});
    v_made integer := 0;
    v_table text;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['audit_event', 'action_attempt'] LOOP
        FOR i IN 0 .. v_months LOOP
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

# Whether execution e's history is past its period (0024's rule, on the bounded periods).
_EXPIRED_TEMPLATE = """
    e.finished_at IS NOT NULL
    AND ((e.status IN ('SUCCEEDED', 'CANCELLED') AND e.finished_at < clock_timestamp() - {s})
      OR (e.status = 'FAILED' AND e.finished_at < clock_timestamp() - {f}))
"""
_EXPIRED = _EXPIRED_TEMPLATE.format(s="v_succeeded", f="v_failed")
# The same, inside a dynamic statement (EXECUTE ... USING v_succeeded, v_failed).
_EXPIRED_DYNAMIC = " ".join(_EXPIRED_TEMPLATE.format(s="$1", f="$2").split()).replace("'", "''")

_PURGE = f"""
CREATE OR REPLACE FUNCTION {HISTORY_PURGE_FUNCTION}(
    p_succeeded interval, p_failed interval, p_batch integer
) RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    -- Never shorter than the owner's periods, never more than its batch: a negative or
    -- NULL period is the owner's, a negative batch deletes nothing row by row.
    v_succeeded interval := GREATEST(
        p_succeeded, make_interval(days => {_bound("history_retention_days")}));
    v_failed interval := GREATEST(
        p_failed, make_interval(days => {_bound("history_retention_failed_days")}));
    v_batch integer := LEAST(GREATEST(coalesce(p_batch, 0), 0), {_bound("retention_batch")});
    v_month record;
    v_audit audit_event[];
    v_attempts action_attempt[];
    v_rows integer;
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
              <= clock_timestamp() - GREATEST(v_succeeded, v_failed)
        ORDER BY parent.relname, c.relname
    LOOP
        BEGIN
            -- Rows whose execution is still within its period outlive their month: they
            -- move to the DEFAULT partition (no month covers them once it is dropped).
            -- The month's other rows go with it, and count as deleted.
            IF v_month.parent = 'audit_event' THEN
                EXECUTE format(
                    'SELECT count(*), coalesce(array_agg(ROW(k.*)::audit_event)'
                    ' FILTER (WHERE EXISTS (SELECT 1 FROM execution e'
                    ' WHERE e.id = k.execution_id AND NOT ({_EXPIRED_DYNAMIC}))), ''{{}}'')'
                    ' FROM %s k',
                    v_month.name) INTO v_rows, v_audit USING v_succeeded, v_failed;
                EXECUTE format('DROP TABLE %s', v_month.name);
                INSERT INTO audit_event OVERRIDING SYSTEM VALUE SELECT * FROM unnest(v_audit);
                v_deleted := v_deleted + v_rows - cardinality(v_audit);
            ELSE
                EXECUTE format(
                    'SELECT count(*), coalesce(array_agg(ROW(k.*)::action_attempt)'
                    ' FILTER (WHERE EXISTS (SELECT 1 FROM execution e'
                    ' WHERE e.id = k.execution_id AND NOT ({_EXPIRED_DYNAMIC}))), ''{{}}'')'
                    ' FROM %s k',
                    v_month.name) INTO v_rows, v_attempts USING v_succeeded, v_failed;
                EXECUTE format('DROP TABLE %s', v_month.name);
                INSERT INTO action_attempt SELECT * FROM unnest(v_attempts);
                v_deleted := v_deleted + v_rows - cardinality(v_attempts);
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
        WHERE a.created_at < clock_timestamp() - LEAST(v_succeeded, v_failed)
          AND {_EXPIRED}
        LIMIT v_batch
        FOR SHARE OF e SKIP LOCKED
    );
    GET DIAGNOSTICS v_count = ROW_COUNT;
    v_deleted := v_deleted + v_count;
    DELETE FROM action_attempt
    WHERE (execution_id, action_id, attempt, started_at) IN (
        SELECT t.execution_id, t.action_id, t.attempt, t.started_at
        FROM action_attempt t JOIN execution e ON e.id = t.execution_id
        WHERE t.started_at < clock_timestamp() - LEAST(v_succeeded, v_failed)
          AND {_EXPIRED}
        LIMIT v_batch
        FOR SHARE OF e SKIP LOCKED
    );
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_deleted + v_count;
END
$$
"""

# Months beyond the bound (made by a caller who asked for a thousand), dropped while empty:
# retention never reaches a month ahead, and each one slows every look-up of the history.
_FAR_MONTHS = text(
    """
    SELECT format('%I.%I', n.nspname, c.relname) AS name
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE i.inhparent IN ('audit_event'::regclass, 'action_attempt'::regclass)
      AND c.relname ~ '_p[0-9]{4}_[0-9]{2}$'
      AND to_date(right(c.relname, 7), 'YYYY_MM')
          > date_trunc('month', clock_timestamp() AT TIME ZONE 'UTC')
            + make_interval(months => :ahead)
    ORDER BY c.relname
    """
)


# What stays written, whatever the runtime role's column grants allow: each trigger lets
# the table's owner through (who could drop it anyway) and refuses the rest with
# insufficient_privilege. The WHEN clauses keep them off every other row: the worker's
# hot path (RUNNING checkpoints becoming SUCCEEDED or FAILED) never calls a function.
_OWNER = (
    "pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID),"
    " 'MEMBER')"
)
_GUARDS: dict[str, str] = {
    # A revoked credential stays revoked: the column grant that lets the API revoke would
    # also set revoked_at back to NULL (a revoked agent token answered again).
    "orquestador_credential_stays_revoked": f"""
BEGIN
    IF (NEW.revoked_at, NEW.revoked_by) IS DISTINCT FROM (OLD.revoked_at, OLD.revoked_by)
       AND NOT {_OWNER} THEN
        RAISE EXCEPTION 'a revoked machine credential stays revoked'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
""",
    # A used sign-in link stays used: a cleared used_at would sign its person in again.
    "orquestador_link_stays_used": f"""
BEGIN
    IF NEW.used_at IS DISTINCT FROM OLD.used_at AND NOT {_OWNER} THEN
        RAISE EXCEPTION 'a used sign-in link stays used'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
""",
    # A sign-out's record stays until its token expires (then the token is refused on its
    # own, and the sign-out's purge may take it): without it the session counts again.
    "orquestador_sign_out_stays": f"""
BEGIN
    IF OLD.expires_at >= clock_timestamp() AND NOT {_OWNER} THEN
        RAISE EXCEPTION 'a sign-out is kept until its token expires'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN OLD;
END
""",
    # A SUCCEEDED checkpoint's output and status never change: later steps, the decision
    # and the promise (a succeeded step never runs again) read them. The one way back is
    # an operator's retry of a step recorded for another contract (the execution parked
    # for CONTRACT_MISMATCH naming it): the step then runs as new, by decision, audited.
    "orquestador_success_stays": f"""
BEGIN
    IF {_OWNER} THEN
        RETURN NEW;
    END IF;
    IF NEW.output IS DISTINCT FROM OLD.output THEN
        RAISE EXCEPTION 'a succeeded checkpoint''s output never changes'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.status <> 'SUCCEEDED' AND NOT (
        NEW.status = 'FAILED' AND NEW.error_code = 'RETRY_APPROVED'
        AND EXISTS (
            SELECT 1 FROM execution e
            WHERE e.id = NEW.execution_id AND e.status = 'RECONCILIATION_REQUIRED'
              AND e.error_code = 'CONTRACT_MISMATCH'
              AND e.error_detail ->> 'actionId' = NEW.action_id))
    THEN
        RAISE EXCEPTION 'a succeeded checkpoint stays succeeded'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END
""",
}
# (trigger, table, event, WHEN or None, function)
_TRIGGERS = (
    (
        "machine_credential_stays_revoked",
        "machine_credential",
        "UPDATE",
        "OLD.revoked_at IS NOT NULL",
        "orquestador_credential_stays_revoked",
    ),
    (
        "sign_in_link_stays_used",
        "sign_in_link",
        "UPDATE",
        "OLD.used_at IS NOT NULL",
        "orquestador_link_stays_used",
    ),
    (
        "page_session_revocation_stays",
        "page_session_revocation",
        "DELETE",
        None,
        "orquestador_sign_out_stays",
    ),
    (
        "action_execution_success_stays",
        "action_execution",
        "UPDATE",
        "OLD.status = 'SUCCEEDED'",
        "orquestador_success_stays",
    ),
)


def _schema() -> str:
    schema = op.get_bind().execute(text("SELECT current_schema()")).scalar_one()
    return op.get_bind().dialect.identifier_preparer.quote(schema)


def _revision_module(revision_id: str) -> Any:
    """An earlier revision's module, for the function bodies a downgrade puts back."""
    script = ScriptDirectory.from_config(op.get_context().config)
    return script.get_revision(revision_id).module


def _definer_settings(schema: str) -> None:
    # CREATE OR REPLACE resets a function's SET clauses: 0024's are given again.
    for signature in (HISTORY_PARTITIONS_SIGNATURE, HISTORY_PURGE_SIGNATURE):
        op.execute(
            text(
                f"ALTER FUNCTION {schema}.{signature}"
                f" SET search_path = pg_catalog, {schema}, pg_temp"
            )
        )
        op.execute(text(f"ALTER FUNCTION {schema}.{signature} SET lock_timeout = '2s'"))


def upgrade() -> None:
    schema = _schema()
    op.execute(
        text(
            "CREATE TABLE function_bound (name text NOT NULL, value integer NOT NULL,"
            " CONSTRAINT pk_function_bound PRIMARY KEY (name),"
            " CONSTRAINT ck_function_bound_value_not_negative CHECK (value >= 0))"
        )
    )
    apply_function_bounds(op.get_bind(), _DEFAULTS)
    grant_runtime("function_bound", ("SELECT",))

    body = _PURGE_SIMULATIONS_BODY.format(
        s=schema,
        age=_bound("simulation_retention_days", schema),
        batch=_bound("retention_batch", schema),
    )
    op.execute(
        text(
            f"""
            CREATE OR REPLACE FUNCTION {schema}.{PURGE_SIMULATIONS_SIGNATURE} RETURNS integer
            LANGUAGE plpgsql
            SECURITY DEFINER
            SET search_path = pg_catalog, {schema}, pg_temp
            AS $function${body}$function$
            """
        )
    )
    op.execute(text(_PARTITIONS))
    op.execute(text(_PURGE))
    _definer_settings(schema)

    for function, body in _GUARDS.items():
        op.execute(
            text(
                f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql"
                f" SET search_path = pg_catalog, {schema}, pg_temp"
                f" AS $function${body}$function$"
            )
        )
        # Fired as triggers only; nobody calls them.
        op.execute(text(f"REVOKE ALL ON FUNCTION {schema}.{function}() FROM PUBLIC"))
    for trigger, table, event, when, function in _TRIGGERS:
        condition = f" WHEN ({when})" if when else ""
        op.execute(
            text(
                f"CREATE TRIGGER {trigger} BEFORE {event} ON {table} FOR EACH ROW{condition}"
                f" EXECUTE FUNCTION {function}()"
            )
        )

    # No temporary table can stand in for a product table on a pooled connection; only
    # the database's owner can revoke it (for anyone else REVOKE changes nothing).
    # Left revoked by the downgrade: the product never made one.
    database = op.get_bind().execute(text("SELECT current_database()")).scalar_one()
    quoted = op.get_bind().dialect.identifier_preparer.quote(database)
    op.execute(text(f"REVOKE TEMPORARY ON DATABASE {quoted} FROM PUBLIC"))

    far = op.get_bind().execute(_FAR_MONTHS, {"ahead": _DEFAULTS.history_months_ahead})
    for name in far.scalars().all():
        if op.get_bind().execute(text(f"SELECT NOT EXISTS (SELECT 1 FROM {name})")).scalar():
            op.execute(text(f"DROP TABLE {name}"))


def downgrade() -> None:
    schema = _schema()
    for trigger, table, _, _, _ in _TRIGGERS:
        op.execute(text(f"DROP TRIGGER {trigger} ON {table}"))
    for function in _GUARDS:
        op.execute(text(f"DROP FUNCTION {function}()"))
    before_purge = _revision_module("0012")
    op.execute(
        text(
            f"""
            CREATE OR REPLACE FUNCTION {schema}.{PURGE_SIMULATIONS_SIGNATURE} RETURNS integer
            LANGUAGE plpgsql
            SECURITY DEFINER
            SET search_path = pg_catalog, {schema}, pg_temp
            AS $function${before_purge._PURGE_BODY.format(s=schema)}$function$
            """
        )
    )
    history = _revision_module("0024")
    for created in (history._PARTITIONS, history._PURGE):
        op.execute(text(created.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)))
    _definer_settings(schema)
    op.execute(text("DROP TABLE function_bound"))
