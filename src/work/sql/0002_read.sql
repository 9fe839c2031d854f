-- Reads through the fence (GET /read?mode=resource, the fleet page's GET /ui/fleet). Runs as
-- baton_owner after 0001. Idempotent.
--
-- One statement, so one snapshot: the sequence's last committed seq, the work-set's published
-- cursor, and the fence row (the highest token the resource has accepted, and its holder). A
-- caller compares its own token with max_token: a reader whose token is below it has been fenced
-- out and must not answer as the leader. Read-only: it takes no lock and writes nothing, so a
-- read never delays a writer. Nothing here is visible before it committed, and everything that
-- committed before the statement began is: the read is linearizable.
DROP FUNCTION IF EXISTS baton.read_state(TEXT, TEXT);
CREATE FUNCTION baton.read_state(p_seq_resource TEXT, p_cursor_resource TEXT,
                                 OUT last_seq BIGINT, OUT cursor_position BIGINT,
                                 OUT max_token BIGINT, OUT max_holder TEXT)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT (SELECT s.last_seq FROM baton.sequence s WHERE s.name = p_seq_resource),
           (SELECT c.position FROM baton.workset_cursor c WHERE c.name = p_cursor_resource),
           r.max_token, r.holder
      FROM baton.fenced_resource r
     WHERE r.name = baton.fence_domain(p_seq_resource)
$$;

REVOKE EXECUTE ON FUNCTION baton.read_state(TEXT, TEXT) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION baton.read_state(TEXT, TEXT) TO baton_app;

-- The newest refused writes, newest first, at most p_limit (capped at 100): the fleet page's
-- "fence rejections" (GET /ui/fleet). Read-only and by the primary key, so it stays cheap however
-- long the resource has run; rejections are rare, the table small. The writes themselves stay
-- refused by the functions of 0001: this only lets a node show what they refused.
DROP FUNCTION IF EXISTS baton.recent_fence_rejections(INTEGER);
CREATE FUNCTION baton.recent_fence_rejections(p_limit INTEGER)
RETURNS TABLE (at_unix_ms BIGINT, resource TEXT, op TEXT, token BIGINT, holder TEXT,
               max_token BIGINT, max_holder TEXT, reason TEXT)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT (extract(epoch FROM r.at) * 1000)::BIGINT, r.resource, r.op, r.token, r.holder,
           r.max_token, r.max_holder, r.reason
      FROM baton.fence_rejections r
     ORDER BY r.id DESC
     LIMIT least(greatest(p_limit, 0), 100)
$$;

REVOKE EXECUTE ON FUNCTION baton.recent_fence_rejections(INTEGER) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION baton.recent_fence_rejections(INTEGER) TO baton_app;
