"""Simulations stay simulations; the runtime role changes only what the protocol writes.

Revision ID: 0012
Revises: 0011

What the third security review found (SPEC section 16), and what this revision does:

- A real transition accepted on a dry run's request ran for real. Besides the API's 404,
  the schema now makes the mix impossible for every writer (API, platform consumer, dry
  runs, a hand-written INSERT): execution (request_id, simulation) references request
  (id, simulation). A database that already holds such a mix (accepted before this
  revision) keeps it as evidence and is told so in a warning; the key then stays NOT
  VALID (new rows are checked, those are not) and the purge never deletes those
  requests, since they hold a real execution.
- The runtime role could UPDATE every column, `simulation` included, and then purge a
  real request as a dry run. It now holds UPDATE on the columns the protocol writes
  only (_UPDATE_COLUMNS), nothing at table level.
- orquestador_purge_simulations (SECURITY DEFINER) ran with the migration's search_path:
  pg_temp came first for tables, so a temporary table steered its deletes, and a role
  with CREATE on the schema could add an overload that matched a call better. It now
  pins `search_path = pg_catalog, <schema>, pg_temp` and names every table, function,
  operator and type with its schema.
- orquestador_write_batch was executable by PUBLIC; now only by the runtime role, with
  its search_path pinned the same way (it keeps running with the caller's rights).

The platform role's column-level INSERT is applied with the other role grants at head
(`orquestador migrate`, `orquestador migrate grant`), not here: a migration does not
know the platform role.
"""

import logging

from alembic import op
from sqlalchemy import text

from orquestador.db.grants import owns, restrict_updates, runtime_role
from orquestador.db.schema import PURGE_SIMULATIONS_SIGNATURE, WRITE_BATCH_SIGNATURE

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

log = logging.getLogger("orquestador.migrations")

_UNIQUE = "uq_request_id_simulation"
_FOREIGN_KEY = "fk_execution_request_id_simulation_request"

# The columns each UPDATE of the runtime role's code sets, as of this revision (schema.py's
# RUNTIME_UPDATE_COLUMNS holds the current list; this one stays as it was written).
_UPDATE_COLUMNS: dict[str, tuple[str, ...]] = {
    "request": ("state", "revision", "data", "busy_execution_id", "updated_at"),
    "execution": (
        "status",
        "attempts",
        "max_attempts",
        "fencing_token",
        "lease_owner",
        "lease_expires_at",
        "next_attempt_at",
        "result",
        "error_code",
        "error_detail",
        "wait_key",
        "started_at",
        "updated_at",
        "finished_at",
    ),
    "action_execution": (
        "status",
        "attempt",
        "fencing_token",
        "input_hash",
        "external_key",
        "effect",
        "capability",
        "adapter_version",
        "output",
        "error_code",
        "attempt_base",
        "first_started_at",
        "observed",
        "started_at",
        "finished_at",
    ),
    "machine_command": ("status", "exit_code", "output", "updated_at", "sent_at", "finished_at"),
    "hosting_plan": ("name",),
    "plan_flow_binding": ("flow_id",),
    "panel_notice": ("dismissed_at",),
    "notification_preference": ("recipients", "updated_at"),
    "email_outbox": (
        "status",
        "attempts",
        "next_attempt_at",
        "lease_owner",
        "lease_expires_at",
        "last_error",
        "sent_at",
    ),
    "platform_event": ("processed_at", "outcome", "request_id", "execution_id"),
}

# The purge of migration 0009, unchanged in what it does. Every name carries its schema
# (S, the tables' schema; pg_catalog for the built-ins), operators included: nothing is
# found through the search path, so neither a temporary table nor an object someone
# created in S can stand in for one. OPERATOR() binds like any other operator, hence
# the parentheses.
_PURGE_BODY = """
DECLARE
    purged pg_catalog.uuid[];
BEGIN
    -- Simulated requests past their age whose executions are all simulated and ended,
    -- oldest first; SKIP LOCKED leaves a request being written to the next pass.
    SELECT coalesce(pg_catalog.array_agg(r.id), '{{}}') INTO purged
    FROM (
        SELECT r.id
        FROM {s}.request AS r
        WHERE r.simulation
          AND r.created_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) $1)
          AND NOT EXISTS (
              SELECT 1 FROM {s}.execution AS e
              WHERE e.request_id OPERATOR(pg_catalog.=) r.id
                AND (NOT e.simulation OR e.finished_at IS NULL)
          )
        ORDER BY r.created_at
        LIMIT $2
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

# 0009's body, for the downgrade.
_PURGE_BODY_0009 = """
DECLARE
    purged uuid[];
BEGIN
    SELECT coalesce(array_agg(r.id), '{}') INTO purged
    FROM (
        SELECT r.id
        FROM request r
        WHERE r.simulation
          AND r.created_at < now() - $1
          AND NOT EXISTS (
              SELECT 1 FROM execution e
              WHERE e.request_id = r.id
                AND (NOT e.simulation OR e.finished_at IS NULL)
          )
        ORDER BY r.created_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ) r;
    UPDATE request SET busy_execution_id = NULL
        WHERE id = ANY(purged) AND busy_execution_id IS NOT NULL;
    DELETE FROM action_attempt a USING execution e
        WHERE a.execution_id = e.id AND e.request_id = ANY(purged);
    DELETE FROM action_execution c USING execution e
        WHERE c.execution_id = e.id AND e.request_id = ANY(purged);
    DELETE FROM execution WHERE request_id = ANY(purged);
    DELETE FROM request WHERE id = ANY(purged);
    RETURN cardinality(purged);
END
"""

# Requests whose executions are not all of the request's kind: only a real transition
# accepted on a dry run's request before this revision makes one.
_MIXED = text(
    """
    SELECT r.id
    FROM request r
    WHERE EXISTS (SELECT 1 FROM execution e
                  WHERE e.request_id = r.id AND e.simulation <> r.simulation)
    ORDER BY r.id
    """
)

# The report names this many of them; the query above finds every one.
_MIXED_SHOWN = 20


def _quote(name: str) -> str:
    return op.get_bind().dialect.identifier_preparer.quote(name)


def _schema() -> str:
    """The schema the tables were created in (the migration's current schema), quoted."""
    return _quote(op.get_bind().execute(text("SELECT current_schema()")).scalar_one())


def upgrade() -> None:
    bind = op.get_bind()
    schema = _schema()

    op.create_unique_constraint(_UNIQUE, "request", ["id", "simulation"])
    op.execute(
        text(
            f"ALTER TABLE execution ADD CONSTRAINT {_FOREIGN_KEY}"
            " FOREIGN KEY (request_id, simulation) REFERENCES request (id, simulation)"
            " NOT VALID"
        )
    )
    mixed = [str(row.id) for row in bind.execute(_MIXED)]
    if mixed:
        shown = ", ".join(mixed[:_MIXED_SHOWN]) + (" ..." if len(mixed) > _MIXED_SHOWN else "")
        log.warning(
            "%d request(s) hold executions of the other kind (a real transition accepted on"
            " a dry run's request): kept as they are and never purged; %s stays NOT VALID"
            " for them: %s",
            len(mixed),
            _FOREIGN_KEY,
            shown,
        )
    else:
        op.execute(text(f"ALTER TABLE execution VALIDATE CONSTRAINT {_FOREIGN_KEY}"))

    role = runtime_role()
    if role is not None:
        for table, columns in _UPDATE_COLUMNS.items():
            restrict_updates(bind, role, table, columns)

    op.execute(
        text(
            f"""
            CREATE OR REPLACE FUNCTION {schema}.{PURGE_SIMULATIONS_SIGNATURE} RETURNS integer
            LANGUAGE plpgsql
            SECURITY DEFINER
            SET search_path = pg_catalog, {schema}, pg_temp
            AS $function${_PURGE_BODY.format(s=schema)}$function$
            """
        )
    )
    op.execute(
        text(
            f"ALTER FUNCTION {schema}.{WRITE_BATCH_SIGNATURE}"
            f" SET search_path = pg_catalog, {schema}, pg_temp"
        )
    )
    for signature in (PURGE_SIMULATIONS_SIGNATURE, WRITE_BATCH_SIGNATURE):
        op.execute(text(f"REVOKE ALL ON FUNCTION {schema}.{signature} FROM PUBLIC"))
        if role is not None:
            op.execute(text(f"GRANT EXECUTE ON FUNCTION {schema}.{signature} TO {_quote(role)}"))


def downgrade() -> None:
    schema = _schema()
    role = runtime_role()
    if role is not None:
        quoted = _quote(role)
        # Back to the whole table: revoking first drops the column grants with it.
        for table in _UPDATE_COLUMNS:
            if owns(op.get_bind(), role, table):
                continue
            op.execute(text(f"REVOKE UPDATE ON TABLE {table} FROM {quoted}"))
            op.execute(text(f"GRANT UPDATE ON TABLE {table} TO {quoted}"))
    batch = f"{schema}.{WRITE_BATCH_SIGNATURE}"
    op.execute(text(f"GRANT EXECUTE ON FUNCTION {batch} TO PUBLIC"))
    op.execute(text(f"ALTER FUNCTION {batch} SET search_path FROM CURRENT"))
    op.execute(
        text(
            f"""
            CREATE OR REPLACE FUNCTION {schema}.{PURGE_SIMULATIONS_SIGNATURE} RETURNS integer
            LANGUAGE plpgsql
            SECURITY DEFINER
            SET search_path FROM CURRENT
            AS $function${_PURGE_BODY_0009}$function$
            """
        )
    )
    op.drop_constraint(_FOREIGN_KEY, "execution", type_="foreignkey")
    op.drop_constraint(_UNIQUE, "request", type_="unique")
