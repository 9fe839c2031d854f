-- No paused holder blocks the next term (issue 29). Runs as baton_owner after 0002, in the same
-- transaction (see `migrate`). Idempotent.
--
-- A fenced user transaction (`BEGIN; SELECT baton.fence_assert(...); ...; COMMIT`) keeps its
-- domain's fence row locked until it ends. A holder paused inside one (SIGSTOP, a GC pause, a
-- frozen VM) kept the lock until the server's idle_in_transaction_session_timeout (5 s, above a
-- 3 s lease) ended its session, and the next term's first write waited on it all that time;
-- woken before the timeout, the stale transaction's COMMIT landed after the new term had been
-- elected, ordered before the new term's writes only by the lock.
--
-- So a writer ends, instead of waiting for, the sessions that hold its domain's fence row under a
-- lower token: the holder's transaction rolls back and its COMMIT fails (the server ends the
-- session, SQLSTATE 57P01), and the ending is recorded in fence_rejections (reason 'preempted').
-- A holder with an equal or higher token, or one whose token is unknown, is waited for as before
-- (bounded by the roles' lock_timeout). Ending a session needs pg_signal_backend, which
-- 0000_roles.sql grants baton_owner; it never reaches a superuser's session.

-- The resource-side switch (on by default; only the owner can flip it). Off, a writer waits for
-- a lower-token holder until the server's timeouts end it: the behaviour before issue 29.
ALTER TABLE baton.settings ADD COLUMN IF NOT EXISTS preempt_lower_tokens BOOLEAN NOT NULL DEFAULT TRUE;

-- Where a session inside a fenced transaction says which token it asserted: two transaction-level
-- advisory locks, taken in shared mode, whose second key is one 32-bit half of the token. They
-- are visible to every session in pg_locks and end with the transaction, exactly as the fence
-- row's lock does; a row written for the purpose would be invisible until the holder committed.
-- The first keys ('bthi', 'btlo' in ASCII) are reserved for this; a user lock that happened to use
-- one could only make a holder look higher, never lower (see fence_holders).
CREATE OR REPLACE FUNCTION baton.token_key_hi() RETURNS INTEGER
LANGUAGE sql IMMUTABLE AS $$ SELECT 1651796073 $$;
CREATE OR REPLACE FUNCTION baton.token_key_lo() RETURNS INTEGER
LANGUAGE sql IMMUTABLE AS $$ SELECT 1651799151 $$;

-- Registers the calling transaction's token (fence_assert calls it under the fence row's lock).
-- Never waits: a key held exclusively by someone else leaves the holder unregistered, which only
-- means it is waited for rather than ended. Internal: not granted to the application role.
CREATE OR REPLACE FUNCTION baton.fence_register(p_token BIGINT) RETURNS BOOLEAN
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_try_advisory_xact_lock_shared(baton.token_key_hi(), (p_token >> 32)::integer)
       AND pg_try_advisory_xact_lock_shared(baton.token_key_lo(), p_token::bit(32)::integer)
$$;

-- The other sessions whose open transaction holds p_domain's fence row (the transaction named by
-- the row's xmax: only that domain's holders, never another shard's), each with the token it
-- registered: an upper bound of the tokens it asserted (the highest half of each kind), NULL when
-- it registered none (a superuser's session, or one of the one-statement entry points, which end
-- before any client pause can hold them open).
CREATE OR REPLACE FUNCTION baton.fence_holders(p_domain TEXT)
RETURNS TABLE (pid INTEGER, token BIGINT, login TEXT, superuser BOOLEAN)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH holder AS (
        SELECT x.pid
          FROM baton.fenced_resource r
          JOIN pg_locks x ON x.locktype = 'transactionid' AND x.transactionid = r.xmax
                         AND x.mode = 'ExclusiveLock' AND x.granted
         WHERE r.name = p_domain AND x.pid <> pg_backend_pid()
    ), registered AS (
        SELECT a.pid,
               max(a.objid::bigint) FILTER (WHERE a.classid = baton.token_key_hi()::oid) AS hi,
               max(a.objid::bigint) FILTER (WHERE a.classid = baton.token_key_lo()::oid) AS lo
          FROM pg_locks a
          JOIN holder h ON h.pid = a.pid
         WHERE a.locktype = 'advisory' AND a.objsubid = 2 AND a.granted
           AND a.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
         GROUP BY a.pid
    )
    SELECT h.pid, (g.hi << 32) | g.lo, s.usename::text, coalesce(o.rolsuper, TRUE)
      FROM holder h
      LEFT JOIN registered g ON g.pid = h.pid
      LEFT JOIN pg_stat_activity s ON s.pid = h.pid
      LEFT JOIN pg_roles o ON o.oid = s.usesysid
$$;

-- Ends every session holding p_domain's fence row under a token below p_token, and records each
-- in fence_rejections: resource is the domain, token and holder the ended session's (the holder
-- read from its per-node role, else its login role), max_token and max_holder the writer's.
-- Does nothing with fencing or preemption off. Returns how many it ended. The session is
-- signalled, not waited for: the caller's lock request then waits only for it to exit, which
-- releases its locks. The writer must be who it says (check_holder) before it ends anyone: a
-- refusal for that comes after the lock on some paths (seq_commit), and a record of the ending
-- would roll back with it. Internal: not granted to the application role.
CREATE OR REPLACE FUNCTION baton.fence_preempt(p_domain TEXT, p_token BIGINT, p_holder TEXT) RETURNS INTEGER
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v RECORD;
    v_ended INTEGER := 0;
BEGIN
    IF NOT (SELECT s.fencing AND s.preempt_lower_tokens FROM baton.settings s) THEN
        RETURN 0;
    END IF;
    PERFORM baton.check_holder(p_holder);
    FOR v IN SELECT * FROM baton.fence_holders(p_domain) h WHERE h.token < p_token AND NOT h.superuser LOOP
        IF pg_terminate_backend(v.pid) THEN
            v_ended := v_ended + 1;
            INSERT INTO baton.fence_rejections (resource, token, max_token, holder, max_holder, op, reason)
            VALUES (p_domain, v.token, p_token,
                    coalesce(substring(v.login from '^baton_node_(.+)$'), v.login, ''), p_holder,
                    'user', 'preempted');
            RAISE LOG 'baton fence preempted the session % (role %, token %) holding % for token % (holder %)',
                      v.pid, v.login, v.token, p_domain, p_token, p_holder;
        END IF;
    END LOOP;
    RETURN v_ended;
END
$$;

-- Locks p_domain's fence row for a writer with p_token and returns it, as fence_lock does, but
-- ends the lower-token holders (fence_preempt) rather than wait on them. Uncontended it is one
-- SELECT ... FOR UPDATE SKIP LOCKED. Contended, it ends who it may and then waits in fence_lock
-- for the rest (and for the ended sessions' exit). A lower-token session that takes the lock in
-- that instant is waited for, as before. Internal: the fenced entry points call it.
CREATE OR REPLACE FUNCTION baton.fence_lock_for(p_domain TEXT, p_token BIGINT, p_holder TEXT,
                                                OUT max_token BIGINT, OUT max_holder TEXT)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    SELECT r.max_token, r.holder INTO max_token, max_holder
      FROM baton.fenced_resource r WHERE r.name = p_domain FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM baton.fence_preempt(p_domain, p_token, p_holder);
    SELECT l.max_token, l.max_holder INTO max_token, max_holder FROM baton.fence_lock(p_domain) l;
END
$$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA baton FROM PUBLIC;
