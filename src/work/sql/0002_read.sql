-- Reads through the fence (GET /read?mode=resource). Runs as baton_owner after 0001. Idempotent.
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
