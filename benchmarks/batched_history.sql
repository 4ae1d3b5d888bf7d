-- Finished history beside the due work of baseline_setup.sql, so that the planner sees
-- tables the size a running system has (plans chosen on empty tables would scan them):
-- :nhistory executions ended SUCCEEDED, each with its SUCCEEDED checkpoint.
--   psql -v nhistory=100000 -f batched_history.sql
WITH r AS (
    INSERT INTO request (org_id, owner_id, flow_id, state, revision, data, created_by)
    SELECT 'bench', 'bench', f.id, 'done', 3, '{}'::jsonb, 'bench'
    FROM flow f, generate_series(1, :nhistory)
    RETURNING id, flow_id
), e AS (
    INSERT INTO execution (request_id, org_id, flow_id, transition_id, accepted_revision,
                           accepted_state, actor_snapshot, status, attempts, fencing_token,
                           started_at, finished_at)
    SELECT id, 'bench', flow_id, 'go', 2, 'new', '{"sub": "bench"}'::jsonb, 'SUCCEEDED', 1, 1,
           now(), now()
    FROM r
    RETURNING id
)
INSERT INTO action_execution (execution_id, action_id, status, attempt, fencing_token,
                              input_hash, external_key, effect, capability, adapter_version,
                              output, started_at, finished_at)
SELECT id, 'a0', 'SUCCEEDED', 1, 1, repeat('0', 64), id::text, 'IDEMPOTENT_WRITE',
       'bench.noop', 1, '{"ok": true}'::jsonb, now(), now()
FROM e;

VACUUM ANALYZE request;
VACUUM ANALYZE execution;
VACUUM ANALYZE action_execution;
