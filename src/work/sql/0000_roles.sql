-- Cluster-level roles; run as a superuser before the schema migration.
-- baton_owner owns the schema and the SECURITY DEFINER functions and cannot log in.
-- baton_app is what nodes connect as: it may call the fenced functions and nothing else.
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'baton_owner') THEN
    CREATE ROLE baton_owner NOLOGIN;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'baton_app') THEN
    CREATE ROLE baton_app LOGIN;
  END IF;
END
$$;
-- A writer ends a lower-token session that holds its fence row open (0003_preempt.sql), which
-- takes pg_signal_backend; it never reaches a superuser's session.
GRANT pg_signal_backend TO baton_owner;
-- Their timeouts (nobody holds the fence row) are set by the migration in Rust, for baton_app and
-- for every per-node role alike: see ROLE_TIMEOUTS in src/work/fence.rs.
