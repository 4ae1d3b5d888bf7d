"""write_batch(): the protocol writer's whole batch as one statement.

Revision ID: 0010
Revises: 0009

The protocol writer (worker/protocol_writer.py, queue/batches.py) writes the RUNNING
checkpoints, SUCCEEDED checkpoints and finishes of many executions in one
transaction. Sent as separate statements (BEGIN, two lock statements, one statement
per kind, COMMIT), a batch cost the worker a driver round of work per statement and
the server a protocol exchange per statement: on a small machine most of a batch's
time. This function runs the same statements, in the same order, inside one call,
so a batch is one statement in its own implicit transaction.

Each step is what it was as a statement of its own (queue/batches.py says why the
rows go in as JSON and the ids through arrays; the comments in the body say the rest):

1. lock the requests of the finish rows, in id order;
2. lock every execution of the batch under its own fence (owner, token, live lease by
   clock_timestamp()), in id order, reading what a finish's refusal needs;
3. RUNNING checkpoints (the replaced attempt's line in the history first);
4. SUCCEEDED checkpoints (with their history line);
5. finishes: request, audit row and execution in one statement, all or nothing per
   execution, each checked against its accepted request and expected checkpoints.

Every lock is taken before any write, requests first and then executions, so two
batches and the API never wait on each other in a cycle. Each step is a statement of
its own inside the function, so a later step sees what an earlier one wrote (a finish
sees the SUCCEEDED checkpoint written in step 4 of the same batch). The answer is one
JSON document of arrays, one per step; `[]` for a kind the batch does not hold.

SECURITY INVOKER (the default): it runs with the caller's rights, so the runtime role
can do through it exactly what it can do without it; EXECUTE stays with PUBLIC.
"""

from alembic import op
from sqlalchemy import text

from orquestador.db.schema import WRITE_BATCH_FUNCTION, WRITE_BATCH_SIGNATURE

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# The fence of one batch row: FENCE in queue/fencing.py, with the row's own owner and
# token. The id array keeps every generic plan on the primary key.
_ROW_FENCE = """
        e.id = ANY (ARRAY(SELECT execution_id FROM input))
        AND e.id = i.execution_id
        AND e.status = 'RUNNING'
        AND e.lease_owner = i.owner
        AND e.fencing_token = i.token
        AND e.lease_expires_at > clock_timestamp()
"""

_BODY = f"""
DECLARE
    v_requests jsonb := '[]';
    v_locked jsonb := '[]';
    v_started jsonb := '[]';
    v_succeeded jsonb := '[]';
    v_finished jsonb := '[]';
BEGIN
    -- 1. The finishes' requests, locked first and in id order, as every writer and the
    --    API lock them (request, then execution). What a refusal needs comes back.
    IF p_finishes IS NOT NULL THEN
        SELECT coalesce(jsonb_agg(jsonb_build_array(
                   r.id, r.state, r.revision, r.flow_id, r.busy_execution_id)), '[]')
        INTO v_requests
        FROM (
            SELECT r.id, r.state, r.revision, r.flow_id, r.busy_execution_id
            FROM request r
            WHERE r.id = ANY (ARRAY(SELECT jsonb_array_elements_text(p_request_ids)::uuid))
            ORDER BY r.id
            FOR UPDATE
        ) r;
    END IF;

    -- 2. Every execution of the batch, sorted then locked (so in id order), each under
    --    its own fence. For a finish row, the actions already SUCCEEDED come back: why
    --    a finish was refused is read from here (the others compute nothing).
    WITH input AS (
        SELECT * FROM jsonb_to_recordset(p_locks)
            AS i(execution_id uuid, token bigint, owner text, finishing boolean)
    )
    SELECT coalesce(jsonb_agg(jsonb_build_array(
               l.id, l.fencing_token, l.flow_id, l.accepted_state, l.accepted_revision,
               l.succeeded)), '[]')
    INTO v_locked
    FROM (
        SELECT e.id, e.fencing_token, e.flow_id, e.accepted_state, e.accepted_revision,
               CASE WHEN i.finishing THEN
                   coalesce((SELECT array_agg(a.action_id) FROM action_execution a
                             WHERE a.execution_id = e.id AND a.status = 'SUCCEEDED'), '{{}}')
               END AS succeeded
        FROM input i JOIN execution e ON e.id = i.execution_id
        WHERE {_ROW_FENCE}
        ORDER BY e.id
        FOR UPDATE OF e
    ) l;

    -- 3. Per row, what checkpoints._START does: the replaced attempt's line in the
    --    history, then the RUNNING checkpoint, under the same conditions. `written` is
    --    false for a row that holds its lease but may not start again (succeeded,
    --    another key, or an interrupted non-idempotent write): a ContractMismatch.
    IF p_starts IS NOT NULL THEN
        WITH input AS (
            SELECT * FROM jsonb_to_recordset(p_starts)
                AS i(execution_id uuid, token bigint, owner text, action_id text, attempt int,
                     input_hash text, external_key text, effect text, capability text,
                     adapter_version int)
        ), holder AS (
            SELECT i.* FROM input i JOIN execution e ON e.id = i.execution_id
            WHERE {_ROW_FENCE}
            ORDER BY e.id
            FOR UPDATE OF e
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

    -- 4. Per row, what checkpoints._SUCCEED does (a row without an observation keeps
    --    the stored one), with its line in the history. Riding rows are among them, so
    --    step 5 sees them.
    IF p_succeeds IS NOT NULL THEN
        WITH input AS (
            SELECT * FROM jsonb_to_recordset(p_succeeds)
                AS i(execution_id uuid, token bigint, owner text, action_id text,
                     output jsonb, observed jsonb)
        ), holder AS (
            SELECT i.* FROM input i JOIN execution e ON e.id = i.execution_id
            WHERE {_ROW_FENCE}
            ORDER BY e.id
            FOR UPDATE OF e
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
        SELECT coalesce(jsonb_agg(jsonb_build_array(
                   h.execution_id, h.token, s.execution_id IS NOT NULL)), '[]')
        INTO v_succeeded
        FROM holder h LEFT JOIN succeeded s ON s.execution_id = h.execution_id;
    END IF;

    -- 5. Per row, what outcomes._COMPLETE does once finish_execution's checks passed;
    --    here the checks are part of the statement (request unchanged since acceptance
    --    and held by this execution, every expected checkpoint SUCCEEDED), so a row that
    --    fails them writes nothing and its neighbours are written.
    IF p_finishes IS NOT NULL THEN
        WITH input AS (
            SELECT * FROM jsonb_to_recordset(p_finishes)
                AS i(execution_id uuid, token bigint, owner text, request_id uuid,
                     state text, data jsonb, detail jsonb, result jsonb, expected jsonb)
        ), holder AS (
            SELECT i.*, e.org_id, e.flow_id, e.transition_id, e.accepted_state,
                   e.accepted_revision
            FROM input i JOIN execution e ON e.id = i.execution_id
            WHERE {_ROW_FENCE}
            ORDER BY e.id
            FOR UPDATE OF e
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
            RETURNING h.execution_id, r.revision
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
                   m.execution_id, m.revision, 1 / (c.id IS NOT NULL)::int)), '[]')
        INTO v_finished
        FROM moved m LEFT JOIN completed c ON c.id = m.execution_id;
    END IF;

    RETURN jsonb_build_object('requests', v_requests, 'locked', v_locked,
                              'started', v_started, 'succeeded', v_succeeded,
                              'finished', v_finished);
END
"""


def upgrade() -> None:
    # search_path is pinned to the migration's own, as for the purge function.
    op.execute(
        text(
            f"""
            CREATE FUNCTION {WRITE_BATCH_FUNCTION}(
                p_request_ids jsonb, p_locks jsonb, p_starts jsonb, p_succeeds jsonb,
                p_finishes jsonb, p_actor text)
            RETURNS jsonb
            LANGUAGE plpgsql
            SET search_path FROM CURRENT
            AS $function${_BODY}$function$
            """
        )
    )


def downgrade() -> None:
    op.execute(text(f"DROP FUNCTION {WRITE_BATCH_SIGNATURE}"))
