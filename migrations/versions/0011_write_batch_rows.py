"""write_batch(): every row checked once, written whole or not at all, never waited on.

Revision ID: 0011
Revises: 0010

The review of 0010's function found three ways it broke the writer's own promises:

- each step re-checked the lease by the clock, so a lease running out between two
  steps refused a row half way: its next step's RUNNING committed while the riding
  SUCCEEDED did not (the next holder re-ran the first step and parked the second,
  which was never called);
- the next step's RUNNING was written before the riding SUCCEEDED;
- a finish was answered by execution id alone, so a stale holder's finish batched
  with the current holder's was told it had succeeded;
- and one row locked by another session (an operator's open transaction) stalled the
  whole batch, and with it every execution of the worker.

This version (same signature, so workers of 0010 keep working through an upgrade):

1. locks the finishes' requests and then every execution under its fence, once, in id
   order, with SKIP LOCKED: a row someone else holds is not waited for but answered
   `busy` (the writer tries it again alone, shortly, and gives up after the lock
   timeout, leaving it to lease recovery);
2. writes only rows it locked, identified by (execution id, token), in this order:
   SUCCEEDED checkpoints (riding ones included), RUNNING checkpoints, finishes; a row
   whose riding SUCCEEDED was refused writes nothing else;
3. before returning (so before COMMIT), checks that no lease it locked ran out while
   it worked; if one did, it raises `OQL01` and nothing of the batch is kept (the
   writer splits the batch, and the row that fails alone is answered LeaseLost).

SECURITY INVOKER, search_path pinned, EXECUTE with PUBLIC: as in 0010.
"""

import importlib.util
from pathlib import Path

from alembic import op
from sqlalchemy import text

from orquestador.db.schema import LEASE_RAN_OUT_SQLSTATE, WRITE_BATCH_FUNCTION

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# A row of the batch that this transaction locked under its fence in step 2: the
# (execution id, token) pairs. Later steps trust the lock, not the clock: the row
# cannot change under it, and step 6 checks the leases once more before COMMIT.
_HELD = """
    JOIN unnest(v_held, v_tokens) AS held(id, token)
      ON held.id = i.execution_id AND held.token = i.token
"""

# A row that rides a SUCCEEDED checkpoint goes on only if that checkpoint was written.
_RIDER_WRITTEN = """
    (i.after_action IS NULL
     OR (i.execution_id, i.token) IN (SELECT * FROM unnest(v_done, v_done_tokens)))
"""

_FENCE = """
        e.status = 'RUNNING'
        AND e.lease_owner = i.owner
        AND e.fencing_token = i.token
        AND e.lease_expires_at > clock_timestamp()
"""

_BODY = f"""
DECLARE
    v_requests jsonb := '[]';
    v_locked jsonb := '[]';
    v_busy jsonb := '[]';
    v_started jsonb := '[]';
    v_succeeded jsonb := '[]';
    v_finished jsonb := '[]';
    v_free uuid[] := '{{}}';        -- finish requests this batch locked
    v_held uuid[] := '{{}}';        -- executions this batch locked under their fences
    v_tokens bigint[] := '{{}}';    -- and the token each was locked with
    v_leases timestamptz[] := '{{}}';
    v_done uuid[] := '{{}}';        -- executions whose SUCCEEDED row was written
    v_done_tokens bigint[] := '{{}}';
BEGIN
    -- 1. The finishes' requests, locked first and in id order, as every writer and the
    --    API lock them (request, then execution). One another session holds is skipped:
    --    its finish is busy, and the rest of the batch does not wait for it.
    IF p_finishes IS NOT NULL THEN
        SELECT coalesce(jsonb_agg(jsonb_build_array(
                   r.id, r.state, r.revision, r.flow_id, r.busy_execution_id)), '[]'),
               coalesce(array_agg(r.id), '{{}}')
        INTO v_requests, v_free
        FROM (
            SELECT r.id, r.state, r.revision, r.flow_id, r.busy_execution_id
            FROM request r
            WHERE r.id = ANY (ARRAY(SELECT jsonb_array_elements_text(p_request_ids)::uuid))
            ORDER BY r.id
            FOR UPDATE SKIP LOCKED
        ) r;
    END IF;

    -- 2. Every execution of the batch under its own fence, sorted then locked (so in
    --    id order), skipping rows another session holds, and a finish whose request
    --    step 1 could not lock. For a finish row, the actions already SUCCEEDED come
    --    back: why a finish was refused is read from here.
    WITH input AS (
        SELECT * FROM jsonb_to_recordset(p_locks)
            AS i(execution_id uuid, token bigint, owner text, finishing boolean,
                 request_id uuid)
    ), locked AS (
        SELECT e.id, e.fencing_token, e.flow_id, e.accepted_state, e.accepted_revision,
               e.lease_expires_at, i.finishing
        FROM input i JOIN execution e ON e.id = i.execution_id
        WHERE e.id = ANY (ARRAY(SELECT execution_id FROM input))
          AND {_FENCE}
          AND (NOT i.finishing OR i.request_id = ANY (v_free))
        ORDER BY e.id
        FOR UPDATE OF e SKIP LOCKED
    )
    SELECT coalesce(jsonb_agg(jsonb_build_array(
               l.id, l.fencing_token, l.flow_id, l.accepted_state, l.accepted_revision,
               CASE WHEN l.finishing THEN
                   coalesce((SELECT array_agg(a.action_id) FROM action_execution a
                             WHERE a.execution_id = l.id AND a.status = 'SUCCEEDED'), '{{}}')
               END)), '[]'),
           coalesce(array_agg(l.id), '{{}}'),
           coalesce(array_agg(l.fencing_token), '{{}}'),
           coalesce(array_agg(l.lease_expires_at), '{{}}')
    INTO v_locked, v_held, v_tokens, v_leases
    FROM locked l;

    -- Busy: not locked above, yet holding the fence as last committed, so only a lock
    -- kept it out (a row that fails the fence is refused, not busy).
    WITH input AS (
        SELECT * FROM jsonb_to_recordset(p_locks)
            AS i(execution_id uuid, token bigint, owner text)
    )
    SELECT coalesce(jsonb_agg(jsonb_build_array(i.execution_id, i.token)), '[]')
    INTO v_busy
    FROM input i JOIN execution e ON e.id = i.execution_id
    WHERE e.id = ANY (ARRAY(SELECT execution_id FROM input))
      AND {_FENCE}
      AND NOT (i.execution_id = ANY (v_held));

    -- 3. SUCCEEDED checkpoints first (riding ones among them): a step's success is
    --    durable before the next step's RUNNING, and a finish sees it. What
    --    checkpoints._SUCCEED does, with its line in the history.
    IF p_succeeds IS NOT NULL THEN
        WITH input AS (
            SELECT * FROM jsonb_to_recordset(p_succeeds)
                AS i(execution_id uuid, token bigint, action_id text, output jsonb,
                     observed jsonb)
        ), holder AS (
            SELECT i.* FROM input i {_HELD}
        ), succeeded AS (
            UPDATE action_execution AS a
            SET status = 'SUCCEEDED', output = h.output, finished_at = clock_timestamp(),
                observed = coalesce(h.observed, a.observed)
            FROM holder h
            WHERE a.execution_id = ANY (ARRAY(SELECT execution_id FROM holder))
              AND a.execution_id = h.execution_id AND a.action_id = h.action_id
              AND a.status = 'RUNNING' AND a.fencing_token = h.token
            RETURNING a.execution_id, a.action_id, a.attempt, a.fencing_token, a.started_at,
                      a.finished_at
        ), history AS (
            INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token,
                                        status, error_code, message, started_at, finished_at)
            SELECT execution_id, action_id, attempt, fencing_token, 'SUCCEEDED', NULL, NULL,
                   started_at, finished_at
            FROM succeeded
        )
        SELECT coalesce(jsonb_agg(jsonb_build_array(s.execution_id, s.fencing_token)), '[]'),
               coalesce(array_agg(s.execution_id), '{{}}'),
               coalesce(array_agg(s.fencing_token), '{{}}')
        INTO v_succeeded, v_done, v_done_tokens
        FROM succeeded s;
    END IF;

    -- 4. RUNNING checkpoints: what checkpoints._START does (the replaced attempt's line
    --    in the history, then the checkpoint). `written` is false for a row that holds
    --    its lease but may not start again (succeeded, another key, or an interrupted
    --    non-idempotent write): a ContractMismatch.
    IF p_starts IS NOT NULL THEN
        WITH input AS (
            SELECT * FROM jsonb_to_recordset(p_starts)
                AS i(execution_id uuid, token bigint, action_id text, attempt int,
                     input_hash text, external_key text, effect text, capability text,
                     adapter_version int, after_action text)
        ), holder AS (
            SELECT i.* FROM input i {_HELD} WHERE {_RIDER_WRITTEN}
        ), interrupted AS (
            INSERT INTO action_attempt (execution_id, action_id, attempt, fencing_token,
                                        status, error_code, message, started_at, finished_at)
            SELECT a.execution_id, a.action_id, a.attempt, a.fencing_token,
                   CASE WHEN a.effect = 'READ_ONLY' THEN 'FAILED' ELSE 'UNKNOWN' END,
                   'INTERRUPTED', NULL, a.started_at, NULL
            FROM action_execution a
            JOIN holder h ON a.execution_id = h.execution_id AND a.action_id = h.action_id
            WHERE a.execution_id = ANY (ARRAY(SELECT execution_id FROM holder))
              AND a.status = 'RUNNING' AND a.external_key = h.external_key
              AND a.effect <> 'NON_IDEMPOTENT_WRITE'
            ON CONFLICT DO NOTHING
        ), written AS (
            INSERT INTO action_execution AS a (
                execution_id, action_id, status, attempt, fencing_token, input_hash,
                external_key, effect, capability, adapter_version, output, error_code,
                started_at, finished_at, first_started_at)
            SELECT h.execution_id, h.action_id, 'RUNNING', h.attempt, h.token, h.input_hash,
                   h.external_key, h.effect, h.capability, h.adapter_version, NULL, NULL,
                   clock_timestamp(), NULL, clock_timestamp()
            FROM holder h
            ON CONFLICT (execution_id, action_id) DO UPDATE
            SET status = 'RUNNING', attempt = EXCLUDED.attempt,
                fencing_token = EXCLUDED.fencing_token, input_hash = EXCLUDED.input_hash,
                external_key = EXCLUDED.external_key, effect = EXCLUDED.effect,
                capability = EXCLUDED.capability, adapter_version = EXCLUDED.adapter_version,
                output = NULL, error_code = NULL, started_at = EXCLUDED.started_at,
                finished_at = NULL,
                first_started_at = coalesce(a.first_started_at, EXCLUDED.first_started_at)
            WHERE a.status <> 'SUCCEEDED'
              AND a.external_key = EXCLUDED.external_key
              AND NOT (a.effect = 'NON_IDEMPOTENT_WRITE' AND a.status IN ('RUNNING', 'UNKNOWN'))
            RETURNING a.execution_id, a.first_started_at
        )
        SELECT coalesce(jsonb_agg(jsonb_build_array(
                   h.execution_id, h.token, w.first_started_at, w.execution_id IS NOT NULL)),
               '[]')
        INTO v_started
        FROM holder h LEFT JOIN written w ON w.execution_id = h.execution_id;
    END IF;

    -- 5. Finishes: what outcomes._COMPLETE does once finish_execution's checks passed;
    --    here the checks are part of the statement (request unchanged since acceptance,
    --    held by this execution and pinned to its flow, every expected checkpoint
    --    SUCCEEDED), so a row that fails them writes nothing and its neighbours are
    --    written.
    IF p_finishes IS NOT NULL THEN
        WITH input AS (
            SELECT * FROM jsonb_to_recordset(p_finishes)
                AS i(execution_id uuid, token bigint, request_id uuid, state text,
                     data jsonb, detail jsonb, result jsonb, expected jsonb,
                     after_action text)
        ), holder AS (
            SELECT i.*, e.org_id, e.flow_id, e.transition_id, e.accepted_state,
                   e.accepted_revision
            FROM input i {_HELD} JOIN execution e ON e.id = i.execution_id
            WHERE e.id = ANY (v_held) AND {_RIDER_WRITTEN}
        ), moved AS (
            UPDATE request AS r
            SET data = h.data, state = h.state, revision = r.revision + 1,
                busy_execution_id = NULL, updated_at = clock_timestamp()
            FROM holder h
            WHERE r.id = ANY (ARRAY(SELECT request_id FROM holder))
              AND r.id = h.request_id AND r.busy_execution_id = h.execution_id
              AND r.flow_id = h.flow_id AND r.state = h.accepted_state
              AND r.revision = h.accepted_revision
              AND NOT EXISTS (
                  SELECT 1 FROM jsonb_array_elements_text(h.expected) AS wanted(action_id)
                  WHERE NOT EXISTS (SELECT 1 FROM action_execution a
                                    WHERE a.execution_id = h.execution_id
                                      AND a.action_id = wanted.action_id
                                      AND a.status = 'SUCCEEDED'))
            RETURNING h.execution_id, h.token, r.revision
        ), audited AS (
            INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)
            SELECT h.org_id, 'TRANSITION_COMPLETED', h.request_id, h.execution_id, p_actor,
                   h.detail || jsonb_build_object('revision', m.revision,
                                                  'transitionId', h.transition_id,
                                                  'fromState', h.accepted_state)
                   || coalesce((SELECT jsonb_build_object(
                                           'observed', jsonb_object_agg(a.action_id, a.observed))
                                FROM action_execution a
                                WHERE a.execution_id = h.execution_id
                                  AND a.observed IS NOT NULL
                                HAVING count(*) > 0), '{{}}'::jsonb)
            FROM moved m JOIN holder h ON h.execution_id = m.execution_id
        ), completed AS (
            UPDATE execution AS e
            SET status = 'SUCCEEDED', result = h.result, error_code = NULL,
                error_detail = NULL, lease_owner = NULL, lease_expires_at = NULL,
                wait_key = NULL, finished_at = clock_timestamp(),
                updated_at = clock_timestamp()
            FROM moved m JOIN holder h ON h.execution_id = m.execution_id
            WHERE e.id = ANY (ARRAY(SELECT execution_id FROM moved)) AND e.id = m.execution_id
            RETURNING e.id
        )
        -- A moved request without its completed execution would be half a finish: the
        -- division by zero aborts the whole batch instead (it cannot happen: the
        -- execution row is locked by this transaction and matched by id alone).
        SELECT coalesce(jsonb_agg(jsonb_build_array(
                   m.execution_id, m.token, m.revision, 1 / (c.id IS NOT NULL)::int)), '[]')
        INTO v_finished
        FROM moved m LEFT JOIN completed c ON c.id = m.execution_id;
    END IF;

    -- 6. Before COMMIT: every lease this batch wrote under still holds by the clock,
    --    as locked (a finished row's lease is gone now) and, for a row still RUNNING, as
    --    it stands. The locks kept reclaimers out, but a holder whose lease ran out while
    --    the batch worked must not be told its write is durable under a valid lease.
    IF EXISTS (SELECT 1 FROM unnest(v_leases) AS lease WHERE lease <= clock_timestamp())
       OR EXISTS (SELECT 1 FROM execution e
                  WHERE e.id = ANY (v_held) AND e.status = 'RUNNING'
                    AND e.lease_expires_at <= clock_timestamp()) THEN
        RAISE EXCEPTION 'a lease ran out while the batch was written'
            USING ERRCODE = '{LEASE_RAN_OUT_SQLSTATE}';
    END IF;

    RETURN jsonb_build_object('requests', v_requests, 'locked', v_locked, 'busy', v_busy,
                              'started', v_started, 'succeeded', v_succeeded,
                              'finished', v_finished);
END
"""


def _replace(body: str) -> None:
    # Same signature as 0010's: CREATE OR REPLACE keeps the grants and the settings.
    op.execute(
        text(
            f"""
            CREATE OR REPLACE FUNCTION {WRITE_BATCH_FUNCTION}(
                p_request_ids jsonb, p_locks jsonb, p_starts jsonb, p_succeeds jsonb,
                p_finishes jsonb, p_actor text)
            RETURNS jsonb
            LANGUAGE plpgsql
            SET search_path FROM CURRENT
            AS $function${body}$function$
            """
        )
    )


def upgrade() -> None:
    _replace(_BODY)


def downgrade() -> None:
    # 0010's body as 0010 wrote it (a migration file is not an importable module name).
    path = Path(__file__).with_name("0010_write_batch.py")
    spec = importlib.util.spec_from_file_location("write_batch_0010", path)
    assert spec is not None and spec.loader is not None
    previous = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(previous)
    _replace(previous._BODY)
