-- The pure-SQL ceiling of the worker protocol: jobs with a fencing token, and checkpoints.
DROP TABLE IF EXISTS checkpoints;
DROP TABLE IF EXISTS jobs;
CREATE TABLE jobs (
  id          bigserial PRIMARY KEY,
  queue       text        NOT NULL DEFAULT 'default',
  status      text        NOT NULL DEFAULT 'pending',
  run_at      timestamptz NOT NULL DEFAULT now(),
  attempts    int         NOT NULL DEFAULT 0,
  token       bigint      NOT NULL DEFAULT 0,      -- fencing token
  lease_until timestamptz,
  payload     jsonb       NOT NULL DEFAULT '{}',
  result      jsonb,
  finished_at timestamptz
);
CREATE INDEX jobs_pending_idx ON jobs (run_at, id) WHERE status = 'pending';
CREATE TABLE checkpoints (
  job_id  bigint      NOT NULL,
  token   bigint      NOT NULL,
  seq     int         NOT NULL,
  phase   text        NOT NULL,
  at      timestamptz NOT NULL DEFAULT clock_timestamp(),
  data    jsonb,
  PRIMARY KEY (job_id, token, seq)
);
-- pre-fill; run_at spread in the past so ORDER BY run_at,id is meaningful
INSERT INTO jobs (run_at, payload)
SELECT now() - interval '1 hour' + (g * interval '1 ms'), jsonb_build_object('n', g)
FROM generate_series(1, :nrows) g;
VACUUM ANALYZE jobs;
VACUUM ANALYZE checkpoints;
