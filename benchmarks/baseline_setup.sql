-- Accepted executions as the API leaves them, on the product's migrated schema:
-- one published flow, :nrows requests each held by its PENDING execution.
--   psql -v nrows=60000 -v definition='{...}' -f baseline_setup.sql
-- Empties the tables it fills first, so it can be run again between runs.
TRUNCATE audit_event, action_execution, execution, request, flow CASCADE;

INSERT INTO flow (org_id, key, version, trigger, definition, data_schema, created_by)
VALUES ('bench', 'bench', 1, 'manual', CAST(:'definition' AS jsonb), '{"type": "object"}',
        'bench');

WITH r AS (
    INSERT INTO request (org_id, owner_id, flow_id, state, revision, data, created_by)
    SELECT 'bench', 'bench', f.id, 'new', 2, '{}'::jsonb, 'bench'
    FROM flow f, generate_series(1, :nrows)
    RETURNING id, flow_id
)
INSERT INTO execution (request_id, org_id, flow_id, transition_id, accepted_revision,
                       accepted_state, actor_snapshot)
SELECT id, 'bench', flow_id, 'go', 2, 'new', '{"sub": "bench"}'::jsonb FROM r;

UPDATE request r SET busy_execution_id = e.id
FROM execution e WHERE e.request_id = r.id;

VACUUM ANALYZE flow;
VACUUM ANALYZE request;
VACUUM ANALYZE execution;
VACUUM ANALYZE action_execution;
VACUUM ANALYZE audit_event;
