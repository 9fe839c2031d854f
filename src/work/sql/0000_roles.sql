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
-- Nobody holds the fence row: a transaction of the application role left idle (a client paused or
-- gone mid-transaction, or a hostile `BEGIN; ...; pg_sleep`) is ended by the server, which
-- releases its locks. Fenced calls themselves are one statement each; user transactions opened
-- with baton.fence_assert must not sit idle between statements for longer than this.
ALTER ROLE baton_app SET idle_in_transaction_session_timeout = '5s';
-- And no single statement of the application role runs (or waits for a lock) for long. These are
-- defaults a session could override: they bound a paused or buggy client, not a hostile holder of
-- the role's credentials (the trust boundary: the fence protects against stale nodes).
ALTER ROLE baton_app SET statement_timeout = '5s';
ALTER ROLE baton_app SET lock_timeout = '5s';
