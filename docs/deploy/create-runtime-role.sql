-- The runtime role: it logs in and gets DML grants from `orquestador migrate`, nothing else.
--
-- Run it as a role allowed to create roles (a superuser, say), on any database of the
-- server; it is idempotent: it creates the role, or sets the password of an existing one.
--
--   psql -v password='choose-one' -f create-runtime-role.sql
--   psql -v password='choose-one' -v role=orquestador_runtime -f create-runtime-role.sql
--
-- The role name defaults to orquestador_runtime; give the same name to the product in
-- RUNTIME_DATABASE_ROLE (or as the user of DATABASE_URL).
\set ON_ERROR_STOP on

\if :{?role}
\else
  \set role orquestador_runtime
\endif

\if :{?password}
\else
  DO $$ BEGIN
    RAISE EXCEPTION 'no password: run psql -v password=... -f create-runtime-role.sql';
  END $$;
\endif

SELECT format('CREATE ROLE %I LOGIN', :'role')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role')
\gexec

SELECT format('ALTER ROLE %I WITH LOGIN PASSWORD %L', :'role', :'password')
\gexec
