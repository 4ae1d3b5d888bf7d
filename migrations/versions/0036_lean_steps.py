"""A safe step records its attempt when it ends (SPEC 28): the batch writer takes it whole.

Revision ID: 0036
Revises: 0035

orquestador_write_batch (same signature, so a worker of 0034 keeps working):
  - a SUCCEEDED row may carry the step's whole attempt (attempt, input hash, external
    key, effect, capability, adapter version, start): a read that wrote no RUNNING
    checkpoint. It is upserted SUCCEEDED, under the same conditions as a start (never
    over a success, another key, or an interrupted non-idempotent write), with its line
    in the history; `first_started_at` is kept when the step had one.
  - a RUNNING row may carry its start (`started_at`): the record of a read's call that
    already ran and ended otherwise than in success, written just before its outcome;
    it is written even when a cancel was requested (it starts nothing).
  - a row may ride more than one SUCCEEDED (`riders`: the run's reads since its last
    write); it goes on only when all of them were written.
  - each written SUCCEEDED is answered with its action id.
  - a SUCCEEDED row may carry when its call returned (`finished_at`, the worker's measure
    in database time): a held-back success ends then, not when it is written, since the
    next step may have begun in between (never before the attempt's own start).
  - the answer carries the database's clock after every write (`at`): the floor the
    worker measures its own times from.
"""

import importlib.util
from pathlib import Path
from types import ModuleType

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None

# Step 3: a read's success with its whole attempt, written in one upsert.
_LEAN_SUCCEEDED = """
        ), lean AS (
            -- A read that wrote no RUNNING checkpoint: its attempt, whole, as it ended.
            INSERT INTO action_execution AS a (
                execution_id, action_id, status, attempt, fencing_token, input_hash,
                external_key, effect, capability, adapter_version, output, error_code,
                started_at, finished_at, first_started_at, observed)
            SELECT h.execution_id, h.action_id, 'SUCCEEDED', h.attempt, h.token,
                   h.input_hash, h.external_key, h.effect, h.capability, h.adapter_version,
                   h.output, NULL, h.started_at, coalesce(h.finished_at, clock_timestamp()),
                   h.started_at, h.observed
            FROM holder h
            WHERE h.external_key IS NOT NULL
            ON CONFLICT (execution_id, action_id) DO UPDATE
            SET status = 'SUCCEEDED', attempt = EXCLUDED.attempt,
                fencing_token = EXCLUDED.fencing_token, input_hash = EXCLUDED.input_hash,
                external_key = EXCLUDED.external_key, effect = EXCLUDED.effect,
                capability = EXCLUDED.capability, adapter_version = EXCLUDED.adapter_version,
                output = EXCLUDED.output, error_code = NULL, started_at = EXCLUDED.started_at,
                finished_at = EXCLUDED.finished_at,
                first_started_at = coalesce(a.first_started_at, EXCLUDED.first_started_at),
                observed = coalesce(EXCLUDED.observed, a.observed)
            WHERE a.status <> 'SUCCEEDED'
              AND a.external_key = EXCLUDED.external_key
              AND NOT (a.effect = 'NON_IDEMPOTENT_WRITE' AND a.status IN ('RUNNING', 'UNKNOWN'))
            RETURNING a.execution_id, a.action_id, a.attempt, a.fencing_token, a.started_at,
                      a.finished_at
        ), ended AS (
            SELECT * FROM succeeded UNION ALL SELECT * FROM lean
        ), history AS ("""

# Every SUCCEEDED a row rides was written (a row of an older worker rides one at most).
_RIDERS_WRITTEN = """
    (i.after_action IS NULL
     OR (SELECT count(*) FROM unnest(v_done, v_done_tokens) AS d(id, token)
         WHERE d.id = i.execution_id AND d.token = i.token) >= coalesce(i.riders, 1))
"""


def _migration(name: str) -> ModuleType:
    # A migration file is not an importable module name.
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _once(body: str, old: str, new: str, count: int = 1) -> str:
    assert body.count(old) == count, f"expected {count} of {old!r} in the batch function"
    return body.replace(old, new)


def _body(cancel: ModuleType, rows: ModuleType) -> str:
    """0034's body with a read's whole attempt, recorded starts and many riders."""
    body: str = cancel._body(rows)
    # Step 3: the succeed rows may carry the attempt; the UPDATE takes only the others.
    body = _once(
        body,
        "AS i(execution_id uuid, token bigint, action_id text, output jsonb,\n"
        "                     observed jsonb)",
        "AS i(execution_id uuid, token bigint, action_id text, output jsonb,\n"
        "                     observed jsonb, attempt int, input_hash text,\n"
        "                     external_key text, effect text, capability text,\n"
        "                     adapter_version int, started_at timestamptz,\n"
        "                     finished_at timestamptz)",
    )
    # A held-back success ends when its call returned (the worker's measure, in database
    # time), not when it is written: the next step may have begun in between.
    body = _once(
        body,
        "SET status = 'SUCCEEDED', output = h.output, finished_at = clock_timestamp(),",
        "SET status = 'SUCCEEDED', output = h.output,\n"
        "                finished_at = greatest(a.started_at,\n"
        "                                       coalesce(h.finished_at, clock_timestamp())),",
    )
    body = _once(
        body,
        "\n            RETURNING a.execution_id, a.action_id, a.attempt, a.fencing_token, "
        "a.started_at,\n                      a.finished_at\n        ), history AS (",
        "\n              AND h.external_key IS NULL"
        "\n            RETURNING a.execution_id, a.action_id, a.attempt, a.fencing_token, "
        "a.started_at,\n                      a.finished_at" + _LEAN_SUCCEEDED,
    )
    body = _once(
        body,
        "started_at, finished_at\n            FROM succeeded\n        )\n",
        "started_at, finished_at\n            FROM ended\n        )\n",
    )
    body = _once(
        body,
        "SELECT coalesce(jsonb_agg(jsonb_build_array(s.execution_id, s.fencing_token)), '[]'),",
        "SELECT coalesce(jsonb_agg(jsonb_build_array(s.execution_id, s.fencing_token,\n"
        "                                            s.action_id)), '[]'),",
    )
    body = _once(body, "        FROM succeeded s;\n", "        FROM ended s;\n")
    # Step 4: a start may carry its start (a read's call that ran) and its riders.
    body = _once(
        body,
        "adapter_version int, after_action text)",
        "adapter_version int, after_action text,\n"
        "                     riders int, started_at timestamptz)",
    )
    body = _once(
        body,
        "h.external_key, h.effect, h.capability, h.adapter_version, NULL, NULL,\n"
        "                   clock_timestamp(), NULL, clock_timestamp()",
        "h.external_key, h.effect, h.capability, h.adapter_version, NULL, NULL,\n"
        "                   coalesce(h.started_at, clock_timestamp()), NULL,\n"
        "                   coalesce(h.started_at, clock_timestamp())",
    )
    # Step 5: a finish rides its riders too.
    body = _once(
        body,
        "expected jsonb,\n                     after_action text)",
        "expected jsonb,\n                     after_action text, riders int)",
    )
    # A recorded start begins nothing: a cancel requested meanwhile does not hold it back.
    start_holder = f"SELECT i.* FROM input i {rows._HELD} WHERE {rows._RIDER_WRITTEN}"
    body = _once(
        body,
        start_holder + cancel._NOT_CANCELLED,
        start_holder + " AND (i.started_at IS NOT NULL OR NOT (i.execution_id = ANY (v_cancel)))",
    )
    body = _once(body, rows._RIDER_WRITTEN, _RIDERS_WRITTEN, count=2)
    # The database's clock after every write of the batch: the worker's floor for the
    # times it measures itself (a step's start and end, written later).
    return _once(
        body,
        "'cancelRequested', v_cancel_requested);",
        "'cancelRequested', v_cancel_requested,\n"
        "                              'at', clock_timestamp());",
    )


def upgrade() -> None:
    rows = _migration("0011_write_batch_rows.py")
    rows._replace(_body(_migration("0034_cancel_requested.py"), rows))


def downgrade() -> None:
    rows = _migration("0011_write_batch_rows.py")
    rows._replace(_migration("0034_cancel_requested.py")._body(rows))
