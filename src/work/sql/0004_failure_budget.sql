-- The fleet-wide failure budget (issue 30). Runs as baton_owner after 0001_fence.sql, whose
-- fence_check and fence_domain it uses, and needs nothing else. Idempotent.
--
-- A term whose leader work failed (a program's exit, a job's error) is recorded by its own
-- leader, through the fence, before it releases the lease: only the current holder of the fence
-- domain may record, so a stale node cannot burn the budget. Before campaigning, and again when
-- it wins, every node asks whether its domain ('leadership', or 'leadership#S' for shard S) has
-- recorded `limit` failed terms within the window; if so, it does not campaign until the count
-- falls below the limit or an operator resets the budget. The limit and the window are the
-- node's own `[failure_budget]` config (a fleet shares one); the clock is the resource's, so
-- every node counts the same rows over the same span.

-- One row per failed term of a domain (a retried record of the same term counts once).
CREATE TABLE IF NOT EXISTS baton.failed_terms (
    domain    TEXT NOT NULL,
    token     BIGINT NOT NULL,
    holder    TEXT NOT NULL,
    detail    TEXT NOT NULL,
    failed_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (domain, token)
);
CREATE INDEX IF NOT EXISTS failed_terms_at ON baton.failed_terms (domain, failed_at);

-- Operator resets, kept as a log: failures at or before a domain's latest reset no longer count.
CREATE TABLE IF NOT EXISTS baton.failure_budget_resets (
    id       BIGSERIAL PRIMARY KEY,
    domain   TEXT NOT NULL,
    reset_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    -- The failed terms that counted since the previous reset (whatever their age).
    cleared  INTEGER NOT NULL,
    -- Who reset it (the login role).
    by_role  TEXT NOT NULL DEFAULT session_user
);
CREATE INDEX IF NOT EXISTS failure_budget_resets_domain ON baton.failure_budget_resets (domain, reset_at);

-- The budget's arguments, checked before anything is written: a limit of 1 to 10000 failed terms
-- and a window of 1 ms to 7 days (failed terms older than that are deleted).
CREATE OR REPLACE FUNCTION baton.check_budget_args(p_window_ms BIGINT, p_limit INTEGER) RETURNS VOID
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000
       OR p_window_ms IS NULL OR p_window_ms NOT BETWEEN 1 AND 604800000 THEN
        RAISE EXCEPTION 'baton failure budget: limit % must be 1 to 10000 and window % ms 1 to 604800000',
                        p_limit, p_window_ms USING ERRCODE = '22023';
    END IF;
END
$$;

-- A domain's budget now. Internal: the entry points below call it.
-- failed_terms: failed terms within the window and after the latest reset; exhausted: that many
-- reach the limit; reopens_in_ms (only when exhausted): until the limit-th newest of them leaves
-- the window, when the count falls below the limit; last_failure: the newest of them.
CREATE OR REPLACE FUNCTION baton.budget_state(p_domain TEXT, p_window_ms BIGINT, p_limit INTEGER,
                                              OUT failed_terms INTEGER, OUT exhausted BOOLEAN,
                                              OUT reopens_in_ms BIGINT, OUT last_failure TEXT)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now    TIMESTAMPTZ := clock_timestamp();
    v_window INTERVAL := make_interval(secs => p_window_ms / 1000.0);
    v_since  TIMESTAMPTZ;
    v_nth    TIMESTAMPTZ;
BEGIN
    PERFORM baton.check_budget_args(p_window_ms, p_limit);
    SELECT greatest(v_now - v_window, max(r.reset_at)) INTO v_since
      FROM baton.failure_budget_resets r WHERE r.domain = p_domain;
    SELECT count(*)::integer INTO failed_terms
      FROM baton.failed_terms f WHERE f.domain = p_domain AND f.failed_at > v_since;
    exhausted := failed_terms >= p_limit;
    IF exhausted THEN
        SELECT f.failed_at INTO v_nth FROM baton.failed_terms f
         WHERE f.domain = p_domain AND f.failed_at > v_since
         ORDER BY f.failed_at DESC OFFSET p_limit - 1 LIMIT 1;
        reopens_in_ms := greatest(0, ceil(extract(epoch FROM (v_nth + v_window - v_now)) * 1000))::bigint;
    END IF;
    SELECT format('term %s on %s: %s', f.token, f.holder, f.detail) INTO last_failure
      FROM baton.failed_terms f
     WHERE f.domain = p_domain AND f.failed_at > v_since
     ORDER BY f.failed_at DESC LIMIT 1;
END
$$;

-- A term's leader work failed: its leader records it, fenced (fence_check's rule: a stale token,
-- or the current token under another holder, is refused and recorded in fence_rejections as op
-- 'failed-term'; a newer token moves the fence, as any first write of a term does). Returns the
-- fence's verdict and, either way, the budget after the call.
CREATE OR REPLACE FUNCTION baton.record_failed_term(p_resource TEXT, p_token BIGINT, p_holder TEXT,
                                                    p_detail TEXT, p_window_ms BIGINT, p_limit INTEGER,
                                                    OUT accepted BOOLEAN, OUT max_token BIGINT,
                                                    OUT max_holder TEXT, OUT reason TEXT,
                                                    OUT failed_terms INTEGER, OUT exhausted BOOLEAN,
                                                    OUT reopens_in_ms BIGINT, OUT last_failure TEXT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_domain TEXT := baton.fence_domain(p_resource);
BEGIN
    PERFORM baton.check_budget_args(p_window_ms, p_limit);
    SELECT f.accepted, f.max_token, f.max_holder, f.reason INTO accepted, max_token, max_holder, reason
      FROM baton.fence_check(p_resource, p_token, p_holder, 'failed-term') f;
    IF accepted THEN
        INSERT INTO baton.failed_terms (domain, token, holder, detail)
        VALUES (v_domain, p_token, p_holder, left(coalesce(p_detail, ''), 2000))
            ON CONFLICT (domain, token) DO NOTHING;
        INSERT INTO baton.fence_log (resource, token, holder, op) VALUES (p_resource, p_token, p_holder, 'failed-term');
        -- Bounded: no window is longer than 7 days.
        DELETE FROM baton.failed_terms f WHERE f.domain = v_domain AND f.failed_at < clock_timestamp() - interval '7 days';
    END IF;
    SELECT b.failed_terms, b.exhausted, b.reopens_in_ms, b.last_failure
      INTO failed_terms, exhausted, reopens_in_ms, last_failure
      FROM baton.budget_state(v_domain, p_window_ms, p_limit) b;
END
$$;

-- What every node asks before campaigning: the budget of p_resource's domain. Read-only, no lock.
CREATE OR REPLACE FUNCTION baton.failure_budget(p_resource TEXT, p_window_ms BIGINT, p_limit INTEGER,
                                                OUT failed_terms INTEGER, OUT exhausted BOOLEAN,
                                                OUT reopens_in_ms BIGINT, OUT last_failure TEXT)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM baton.budget_state(baton.fence_domain(p_resource), p_window_ms, p_limit)
$$;

-- The operator's reset of p_resource's domain (`baton budget reset`, as a superuser; not granted
-- to the application role): the failed terms recorded so far no longer count, and the nodes
-- campaign again at their next look. Logged in failure_budget_resets.
CREATE OR REPLACE FUNCTION baton.failure_budget_reset(p_resource TEXT, OUT reset_domain TEXT,
                                                      OUT cleared_terms INTEGER)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    reset_domain := baton.fence_domain(p_resource);
    -- One reset at a time per domain, so each counts what the one before it left.
    PERFORM pg_advisory_xact_lock(hashtext('baton.failure_budget_reset'), hashtext(reset_domain));
    SELECT count(*)::integer INTO cleared_terms FROM baton.failed_terms f
     WHERE f.domain = reset_domain
       AND f.failed_at > coalesce((SELECT max(r.reset_at) FROM baton.failure_budget_resets r
                                    WHERE r.domain = reset_domain), '-infinity');
    INSERT INTO baton.failure_budget_resets (domain, cleared) VALUES (reset_domain, cleared_terms);
END
$$;

REVOKE EXECUTE ON FUNCTION baton.check_budget_args(BIGINT, INTEGER) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION baton.budget_state(TEXT, BIGINT, INTEGER) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION baton.record_failed_term(TEXT, BIGINT, TEXT, TEXT, BIGINT, INTEGER) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION baton.failure_budget(TEXT, BIGINT, INTEGER) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION baton.failure_budget_reset(TEXT) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION baton.record_failed_term(TEXT, BIGINT, TEXT, TEXT, BIGINT, INTEGER) TO baton_app;
GRANT EXECUTE ON FUNCTION baton.failure_budget(TEXT, BIGINT, INTEGER) TO baton_app;
