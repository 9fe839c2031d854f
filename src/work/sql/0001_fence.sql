-- The fenced resource (docs/fence.md). Runs as baton_owner. Idempotent.
CREATE SCHEMA IF NOT EXISTS baton;
REVOKE ALL ON SCHEMA baton FROM PUBLIC;

-- One row per protected resource: the highest token accepted, and by whom.
CREATE TABLE IF NOT EXISTS baton.fenced_resource (
    name       TEXT PRIMARY KEY,
    max_token  BIGINT NOT NULL,
    holder     TEXT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- One row per accepted write, in the writing transaction: commit order and the resource's clock.
CREATE TABLE IF NOT EXISTS baton.fence_log (
    pos          BIGSERIAL PRIMARY KEY,
    resource     TEXT NOT NULL,
    token        BIGINT NOT NULL,
    holder       TEXT NOT NULL,
    op           TEXT NOT NULL,
    seq_lo       BIGINT,
    seq_hi       BIGINT,
    committed_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS fence_log_token ON baton.fence_log (resource, token);

-- One row per refused write.
CREATE TABLE IF NOT EXISTS baton.fence_rejections (
    id         BIGSERIAL PRIMARY KEY,
    resource   TEXT NOT NULL,
    token      BIGINT NOT NULL,
    max_token  BIGINT NOT NULL,
    holder     TEXT NOT NULL,
    max_holder TEXT NOT NULL,
    op         TEXT NOT NULL,
    reason     TEXT NOT NULL,
    at         TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- Resource-side switch. Only the owner can flip it (`baton migrate --fencing off`): a client that
-- could opt out of the fence would make the fence decoration.
CREATE TABLE IF NOT EXISTS baton.settings (
    id       BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),
    fencing  BOOLEAN NOT NULL DEFAULT TRUE
);
-- The most one seq_commit may move the sequence past its last committed value: a batch plus the
-- IDs burned by earlier ambiguous commits. A call asking for more (a bug, or a holder of the
-- application role's credentials trying to use the sequence up) is refused; the leader then
-- gives up its term, and the next term claims afresh from the committed value.
ALTER TABLE baton.settings ADD COLUMN IF NOT EXISTS max_seq_advance BIGINT NOT NULL DEFAULT 16777216
    CHECK (max_seq_advance > 0);
-- When set, only per-node roles (`baton_node_<holder>`, see check_holder) may write: a session of
-- the shared application role is refused. `baton fleet` sets it for its fleets.
ALTER TABLE baton.settings ADD COLUMN IF NOT EXISTS require_node_roles BOOLEAN NOT NULL DEFAULT FALSE;
INSERT INTO baton.settings (id) VALUES (TRUE) ON CONFLICT DO NOTHING;

-- The sequencer's durable state.
CREATE TABLE IF NOT EXISTS baton.sequence (
    name        TEXT PRIMARY KEY,
    last_seq    BIGINT NOT NULL DEFAULT 0,
    owner_token BIGINT NOT NULL DEFAULT 0
);

-- The scheduler: its ticks, its work-set, the durable cursor over it, and the runs (keyed so a
-- duplicate run is a no-op: defence in depth behind the fence).
CREATE TABLE IF NOT EXISTS baton.ticks (
    id       BIGSERIAL PRIMARY KEY,
    resource TEXT NOT NULL,
    token    BIGINT NOT NULL,
    holder   TEXT NOT NULL,
    at       TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS baton.jobs (
    job_id       BIGINT PRIMARY KEY,
    scheduled_at TIMESTAMPTZ NOT NULL,
    payload      TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS baton.job_runs (
    job_id       BIGINT NOT NULL,
    scheduled_at TIMESTAMPTZ NOT NULL,
    token        BIGINT NOT NULL,
    holder       TEXT NOT NULL,
    ran_at       TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, scheduled_at)
);
CREATE TABLE IF NOT EXISTS baton.workset_cursor (
    name        TEXT PRIMARY KEY,
    position    BIGINT NOT NULL DEFAULT 0,
    owner_token BIGINT NOT NULL DEFAULT 0
);

-- One fence for all of a shard's protected resources (the row 'leadership' for shard 0, the
-- only shard of an unsharded fleet; 'leadership#S' for shard S): the first accepted write of a
-- new term, on any of the shard's resources, fences the old term out of all of them at once, so
-- two leaders' effects never interleave even across resources. A shard's resources carry its
-- number as a '#S' suffix (src/shard.rs), which is how a resource finds its fence row; shards
-- never share one, so a stale leader of shard 3 is refused on shard 3 and touches nothing else.
-- `p_resource` names what was written, in fence_log and fence_rejections.
CREATE OR REPLACE FUNCTION baton.fence_domain() RETURNS TEXT
LANGUAGE sql IMMUTABLE AS $$ SELECT 'leadership'::text $$;
CREATE OR REPLACE FUNCTION baton.fence_domain(p_resource TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT 'leadership' || coalesce(substring(p_resource from '#[1-9][0-9]{0,9}$'), '')
$$;

-- The fence row exists from migration on; this only re-creates it if someone deleted it.
INSERT INTO baton.fenced_resource (name, max_token, holder) VALUES (baton.fence_domain(), 0, '')
    ON CONFLICT (name) DO NOTHING;

-- Locks the fence row for the rest of the calling transaction and returns it. Every writer
-- takes this lock first, so concurrent writers serialize and the check and the write are atomic.
-- Writers reach it through fence_lock_for (0003), which first ends a lower-token holder.
-- The common case is one indexed SELECT ... FOR UPDATE: the sequencer's group commits call this
-- thousands of times a second, so the (speculative) insert only runs when the row is missing.
-- A shard's row is created by its first write (the same path).
DROP FUNCTION IF EXISTS baton.fence_lock();
CREATE OR REPLACE FUNCTION baton.fence_lock(p_domain TEXT, OUT max_token BIGINT, OUT max_holder TEXT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    SELECT r.max_token, r.holder INTO max_token, max_holder
        FROM baton.fenced_resource r WHERE r.name = p_domain FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO baton.fenced_resource (name, max_token, holder) VALUES (p_domain, 0, '')
            ON CONFLICT (name) DO NOTHING;
        SELECT r.max_token, r.holder INTO max_token, max_holder
            FROM baton.fenced_resource r WHERE r.name = p_domain FOR UPDATE;
    END IF;
END
$$;

-- The rule, written once, under the fence row's lock.
-- accept iff fencing is off, or token > max_token, or token = max_token and the holder matches.
-- The holder is who authenticated, not what the caller says: a session of the per-node role
-- `baton_node_<id>` may write only as holder <id>. (session_user is the login role even inside a
-- SECURITY DEFINER function.) A session of the shared application role may name any holder
-- unless the resource requires per-node roles. Called only from the fenced functions, so it
-- runs as their owner and may read the settings.
CREATE OR REPLACE FUNCTION baton.check_holder(p_holder TEXT) RETURNS VOID
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_login TEXT := session_user::text;
BEGIN
    IF v_login LIKE 'baton\_node\_%' THEN
        IF p_holder IS DISTINCT FROM substr(v_login, 12) THEN
            RAISE EXCEPTION 'baton fence: role % writes only as holder %, not %', v_login, substr(v_login, 12), p_holder
                USING ERRCODE = '42501';
        END IF;
    ELSIF (SELECT s.require_node_roles FROM baton.settings s) THEN
        RAISE EXCEPTION 'baton fence: this resource requires a per-node role (baton_node_<id>), not %', v_login
            USING ERRCODE = '42501';
    END IF;
END
$$;

-- Arguments every fenced entry point shares: a token is positive (every backend's token source
-- starts at 1; a negative one is a wrapped conversion, never a term), names are bounded, and the
-- holder is the authenticated one.
CREATE OR REPLACE FUNCTION baton.check_args(p_resource TEXT, p_token BIGINT, p_holder TEXT) RETURNS VOID
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_token IS NULL OR p_token <= 0 THEN
        RAISE EXCEPTION 'baton fence: token % is not a positive term', p_token USING ERRCODE = '22023';
    END IF;
    IF p_resource IS NULL OR length(p_resource) NOT BETWEEN 1 AND 200
       OR p_holder IS NULL OR length(p_holder) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'baton fence: resource and holder must be 1 to 200 characters' USING ERRCODE = '22023';
    END IF;
    PERFORM baton.check_holder(p_holder);
END
$$;

-- The rule, applied under the fence row's lock, which the caller already holds (its max_token
-- and max_holder are what that lock returned). Internal: only the fenced functions call it, so
-- the application role cannot reach it. Every entry point decides through here, except the hot
-- seq_commit, which restates it (see there).
CREATE OR REPLACE FUNCTION baton.fence_apply(p_resource TEXT, p_token BIGINT, p_holder TEXT, p_op TEXT,
                                             p_fencing BOOLEAN, p_max_token BIGINT, p_max_holder TEXT,
                                             OUT accepted BOOLEAN, OUT reason TEXT)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    accepted := (NOT p_fencing)
             OR p_token > p_max_token
             OR (p_token = p_max_token AND p_holder = p_max_holder);
    IF accepted THEN
        -- Only a new term (or, with fencing off, a different writer) changes the row; the same
        -- holder writing again under its token leaves it alone (no dead tuple per commit).
        IF p_token > p_max_token OR (p_token = p_max_token AND p_holder <> p_max_holder) THEN
            UPDATE baton.fenced_resource SET max_token = p_token, holder = p_holder, updated_at = clock_timestamp()
             WHERE name = baton.fence_domain(p_resource);
        END IF;
    ELSE
        reason := CASE WHEN p_token < p_max_token THEN 'stale-token' ELSE 'holder-mismatch' END;
        INSERT INTO baton.fence_rejections (resource, token, max_token, holder, max_holder, op, reason)
        VALUES (p_resource, p_token, p_max_token, p_holder, p_max_holder, p_op, reason);
        RAISE LOG 'baton fence rejected % on % (%): token % holder % vs max_token % holder %',
                  p_op, p_resource, reason, p_token, p_holder, p_max_token, p_max_holder;
    END IF;
END
$$;

DROP FUNCTION IF EXISTS baton.fence_check(TEXT, BIGINT, TEXT, TEXT);
CREATE FUNCTION baton.fence_check(p_resource TEXT, p_token BIGINT, p_holder TEXT, p_op TEXT,
                                  OUT accepted BOOLEAN, OUT max_token BIGINT, OUT max_holder TEXT,
                                  OUT reason TEXT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_fencing BOOLEAN;
BEGIN
    PERFORM baton.check_args(p_resource, p_token, p_holder);
    SELECT s.fencing INTO v_fencing FROM baton.settings s;
    SELECT l.max_token, l.max_holder INTO max_token, max_holder
      FROM baton.fence_lock_for(baton.fence_domain(p_resource), p_token, p_holder) l;
    SELECT a.accepted, a.reason INTO accepted, reason
      FROM baton.fence_apply(p_resource, p_token, p_holder, p_op, v_fencing, max_token, max_holder) a;
END
$$;

CREATE OR REPLACE FUNCTION baton.fencing_enabled() RETURNS BOOLEAN
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT fencing FROM baton.settings
$$;

-- Sequencer: a new leader claims the sequence and learns where it stands.
CREATE OR REPLACE FUNCTION baton.seq_claim(p_resource TEXT, p_token BIGINT, p_holder TEXT,
                                           OUT accepted BOOLEAN, OUT max_token BIGINT, OUT max_holder TEXT,
                                           OUT last_seq BIGINT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    SELECT f.accepted, f.max_token, f.max_holder INTO accepted, max_token, max_holder
      FROM baton.fence_check(p_resource, p_token, p_holder, 'claim') f;
    IF NOT accepted THEN
        RETURN;
    END IF;
    INSERT INTO baton.sequence (name) VALUES (p_resource) ON CONFLICT (name) DO NOTHING;
    UPDATE baton.sequence s SET owner_token = p_token WHERE s.name = p_resource RETURNING s.last_seq INTO last_seq;
    INSERT INTO baton.fence_log (resource, token, holder, op, seq_hi) VALUES (p_resource, p_token, p_holder, 'claim', last_seq);
END
$$;

-- Sequencer: one group commit of the IDs [p_seq_lo, p_seq_hi] the leader allocated in memory.
-- With fencing on, a range that does not move forward is refused as well (defence in depth);
-- with fencing off the resource stores whatever it is sent, which is exactly the bug it shows.
--
-- The hottest entry point (one call per group commit), so it is written flat: the argument and
-- holder checks of check_args/check_holder and the rule of fence_apply are restated here rather
-- than called, the settings and the fence row are read in one statement, and the sequence row,
-- locked once, is updated in place. Each nested call costs a function-call frame, a
-- search_path switch and its own SPI statements: measured with pgbench on a scratch PostgreSQL
-- 15 (scripts/bench/seq-commit-cost.sh), the flat body takes ~0.12 ms a call against ~0.16 ms
-- for the layered one, the difference being about 40 us of PostgreSQL CPU per group commit
-- (experiments/notebook, §11.3). fence_surface pins every refusal this function makes (arguments, holder,
-- stale token, holder mismatch, range), so the restated rules cannot drift unnoticed.
DROP FUNCTION IF EXISTS baton.seq_commit(TEXT, BIGINT, TEXT, BIGINT, BIGINT);
CREATE FUNCTION baton.seq_commit(p_resource TEXT, p_token BIGINT, p_holder TEXT,
                                 p_seq_lo BIGINT, p_seq_hi BIGINT,
                                 OUT accepted BOOLEAN, OUT max_token BIGINT, OUT max_holder TEXT,
                                 OUT reason TEXT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_last BIGINT;
    v_fencing BOOLEAN;
    v_max_advance BIGINT;
    v_require_node_roles BOOLEAN;
    v_login TEXT := session_user::text;
BEGIN
    -- check_args, restated.
    IF p_token IS NULL OR p_token <= 0 THEN
        RAISE EXCEPTION 'baton fence: token % is not a positive term', p_token USING ERRCODE = '22023';
    END IF;
    IF p_resource IS NULL OR length(p_resource) NOT BETWEEN 1 AND 200
       OR p_holder IS NULL OR length(p_holder) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'baton fence: resource and holder must be 1 to 200 characters' USING ERRCODE = '22023';
    END IF;
    IF p_seq_lo IS NULL OR p_seq_hi IS NULL OR p_seq_lo < 1 OR p_seq_lo > p_seq_hi THEN
        RAISE EXCEPTION 'bad range [%, %]', p_seq_lo, p_seq_hi USING ERRCODE = '22023';
    END IF;
    -- fence_lock and the settings in one statement. Lock order everywhere: fenced_resource, then
    -- sequence (seq_claim does the same).
    SELECT r.max_token, r.holder, s.fencing, s.max_seq_advance, s.require_node_roles
      INTO max_token, max_holder, v_fencing, v_max_advance, v_require_node_roles
      FROM baton.fenced_resource r CROSS JOIN baton.settings s
     WHERE r.name = baton.fence_domain(p_resource)
       FOR UPDATE OF r SKIP LOCKED;
    IF NOT FOUND THEN
        -- Another session holds the fence row (or an owner deleted it, or the settings row): the
        -- slow path, which ends a lower-token holder rather than wait on it and re-creates a
        -- missing fence row, as every other entry point does (fence_lock_for, 0003).
        SELECT l.max_token, l.max_holder INTO max_token, max_holder
          FROM baton.fence_lock_for(baton.fence_domain(p_resource), p_token, p_holder) l;
        SELECT s.fencing, s.max_seq_advance, s.require_node_roles
          INTO v_fencing, v_max_advance, v_require_node_roles FROM baton.settings s;
    END IF;
    -- check_holder, restated (it needs require_node_roles, read just above).
    IF v_login LIKE 'baton\_node\_%' THEN
        IF p_holder IS DISTINCT FROM substr(v_login, 12) THEN
            RAISE EXCEPTION 'baton fence: role % writes only as holder %, not %', v_login, substr(v_login, 12), p_holder
                USING ERRCODE = '42501';
        END IF;
    ELSIF v_require_node_roles THEN
        RAISE EXCEPTION 'baton fence: this resource requires a per-node role (baton_node_<id>), not %', v_login
            USING ERRCODE = '42501';
    END IF;
    SELECT s.last_seq INTO v_last FROM baton.sequence s WHERE s.name = p_resource FOR UPDATE;
    -- The range checks come before the fence, so a refused range never moves the fence either.
    -- A stale token is named as such whatever the range; otherwise the range's own fault; then
    -- the holder (fence_apply's rule, restated).
    accepted := (NOT v_fencing)
             OR p_token > max_token
             OR (p_token = max_token AND p_holder = max_holder);
    IF v_fencing THEN
        reason := CASE
            WHEN p_token < max_token THEN 'stale-token'
            WHEN p_seq_lo <= coalesce(v_last, 0) THEN 'seq-not-forward'
            WHEN p_seq_hi - coalesce(v_last, 0) > v_max_advance THEN 'seq-advance-too-large'
            WHEN NOT accepted THEN 'holder-mismatch'
        END;
    END IF;
    IF reason IS NOT NULL THEN
        accepted := FALSE;
        INSERT INTO baton.fence_rejections (resource, token, max_token, holder, max_holder, op, reason)
        VALUES (p_resource, p_token, max_token, p_holder, max_holder, 'next', reason);
        RAISE LOG 'baton fence rejected next on % (%): token % holder % vs max_token % holder %, range [%, %], last seq %',
                  p_resource, reason, p_token, p_holder, max_token, max_holder, p_seq_lo, p_seq_hi, v_last;
        RETURN;
    END IF;
    -- Only a new term (or, with fencing off, a different writer) changes the fence row; the same
    -- holder writing again under its token leaves it alone (no dead tuple per commit).
    IF p_token > max_token OR (p_token = max_token AND p_holder <> max_holder) THEN
        UPDATE baton.fenced_resource SET max_token = p_token, holder = p_holder, updated_at = clock_timestamp()
         WHERE name = baton.fence_domain(p_resource);
    END IF;
    IF v_last IS NULL THEN
        -- Only with fencing off can a commit come before any claim created the row.
        INSERT INTO baton.sequence (name, last_seq, owner_token) VALUES (p_resource, p_seq_hi, p_token)
            ON CONFLICT (name) DO UPDATE SET last_seq = EXCLUDED.last_seq, owner_token = EXCLUDED.owner_token;
    ELSE
        UPDATE baton.sequence SET last_seq = p_seq_hi, owner_token = p_token WHERE name = p_resource;
    END IF;
    INSERT INTO baton.fence_log (resource, token, holder, op, seq_lo, seq_hi)
    VALUES (p_resource, p_token, p_holder, 'next', p_seq_lo, p_seq_hi);
END
$$;

-- One fenced ID per round trip, allocated inside the database: what a sequencer without a leader
-- (or without group commit) does. `baton bench next` measures it side by side as the baseline.
CREATE OR REPLACE FUNCTION baton.seq_next(p_resource TEXT, p_token BIGINT, p_holder TEXT,
                                          OUT accepted BOOLEAN, OUT max_token BIGINT, OUT max_holder TEXT,
                                          OUT seq BIGINT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    SELECT f.accepted, f.max_token, f.max_holder INTO accepted, max_token, max_holder
      FROM baton.fence_check(p_resource, p_token, p_holder, 'next') f;
    IF NOT accepted THEN
        RETURN;
    END IF;
    INSERT INTO baton.sequence (name, last_seq, owner_token) VALUES (p_resource, 1, p_token)
        ON CONFLICT (name) DO UPDATE SET last_seq = baton.sequence.last_seq + 1, owner_token = p_token
        RETURNING baton.sequence.last_seq INTO seq;
    INSERT INTO baton.fence_log (resource, token, holder, op, seq_lo, seq_hi)
    VALUES (p_resource, p_token, p_holder, 'next', seq, seq);
END
$$;

-- Scheduler: a new leader claims the work-set cursor.
CREATE OR REPLACE FUNCTION baton.cursor_claim(p_resource TEXT, p_token BIGINT, p_holder TEXT,
                                              OUT accepted BOOLEAN, OUT max_token BIGINT, OUT max_holder TEXT,
                                              OUT cursor_position BIGINT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    SELECT f.accepted, f.max_token, f.max_holder INTO accepted, max_token, max_holder
      FROM baton.fence_check(p_resource, p_token, p_holder, 'claim') f;
    IF NOT accepted THEN
        RETURN;
    END IF;
    INSERT INTO baton.workset_cursor (name) VALUES (p_resource) ON CONFLICT (name) DO NOTHING;
    UPDATE baton.workset_cursor c SET owner_token = p_token WHERE c.name = p_resource RETURNING c.position INTO cursor_position;
    INSERT INTO baton.fence_log (resource, token, holder, op, seq_hi) VALUES (p_resource, p_token, p_holder, 'claim', cursor_position);
END
$$;

-- Scheduler: one tick. Records the tick and runs the next jobs after p_from (job runs are keyed by
-- (job_id, scheduled_at), so a replay after a lost checkpoint is a no-op). Returns the new
-- in-memory position; the cursor itself is published by cursor_checkpoint.
CREATE OR REPLACE FUNCTION baton.sched_tick(p_resource TEXT, p_token BIGINT, p_holder TEXT,
                                            p_from BIGINT, p_limit INTEGER,
                                            OUT accepted BOOLEAN, OUT max_token BIGINT, OUT max_holder TEXT,
                                            OUT new_position BIGINT, OUT jobs_run BIGINT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    SELECT f.accepted, f.max_token, f.max_holder INTO accepted, max_token, max_holder
      FROM baton.fence_check(p_resource, p_token, p_holder, 'tick') f;
    IF NOT accepted THEN
        RETURN;
    END IF;
    INSERT INTO baton.ticks (resource, token, holder) VALUES (p_resource, p_token, p_holder);
    WITH due AS (
        SELECT j.job_id, j.scheduled_at FROM baton.jobs j
         WHERE j.job_id > p_from ORDER BY j.job_id LIMIT greatest(p_limit, 0)
    ), ran AS (
        INSERT INTO baton.job_runs (job_id, scheduled_at, token, holder)
        SELECT d.job_id, d.scheduled_at, p_token, p_holder FROM due d
        ON CONFLICT DO NOTHING
    )
    SELECT coalesce(max(d.job_id), p_from), count(*) INTO new_position, jobs_run FROM due d;
    INSERT INTO baton.fence_log (resource, token, holder, op, seq_lo, seq_hi)
    VALUES (p_resource, p_token, p_holder, 'tick', p_from, new_position);
END
$$;

-- Scheduler: publish the cursor. One row, whatever the size of the work-set: O(1).
CREATE OR REPLACE FUNCTION baton.cursor_checkpoint(p_resource TEXT, p_token BIGINT, p_holder TEXT, p_position BIGINT,
                                                   OUT accepted BOOLEAN, OUT max_token BIGINT, OUT max_holder TEXT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    SELECT f.accepted, f.max_token, f.max_holder INTO accepted, max_token, max_holder
      FROM baton.fence_check(p_resource, p_token, p_holder, 'checkpoint') f;
    IF NOT accepted THEN
        RETURN;
    END IF;
    UPDATE baton.workset_cursor c SET position = p_position, owner_token = p_token WHERE c.name = p_resource;
    INSERT INTO baton.fence_log (resource, token, holder, op, seq_hi) VALUES (p_resource, p_token, p_holder, 'checkpoint', p_position);
END
$$;

-- Writes to the user's own tables (docs/library.md), from any language: call this inside your own
-- transaction, before (or among) your statements:
--     BEGIN;
--     SELECT baton.fence_assert('orders', $token, $holder);
--     INSERT INTO orders ...;
--     COMMIT;
-- It takes the fence row's lock for the rest of the transaction (so a newer term's first write
-- comes entirely before this commit, or after it) and checks the rule. A newer term's first write
-- does not wait for a transaction left open (its client paused): it ends the session, the
-- transaction rolls back and its COMMIT fails (0003_preempt.sql). A stale token raises
-- SQLSTATE BF409, which aborts the whole transaction: none of its statements land. Because the
-- abort also rolls back anything written here, the rejection is recorded by a second call after
-- ROLLBACK, `baton.fence_record_rejection` (baton's Rust client does this for you); the server
-- log has a line for it either way. A write made outside such a transaction is not protected.
CREATE OR REPLACE FUNCTION baton.fence_assert(p_resource TEXT, p_token BIGINT, p_holder TEXT)
RETURNS BIGINT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v RECORD;
BEGIN
    SELECT * INTO v FROM baton.fence_check(p_resource, p_token, p_holder, 'user') f;
    IF NOT v.accepted THEN
        RAISE EXCEPTION 'baton fence: token % (holder %) refused on % (%): resource is at token % held by %',
                        p_token, p_holder, p_resource, v.reason, v.max_token, v.max_holder
            USING ERRCODE = 'BF409',
                  DETAIL = format('max_token=%s max_holder=%s', v.max_token, v.max_holder),
                  HINT = 'ROLLBACK, then SELECT * FROM baton.fence_record_rejection(resource, token, holder) to record it';
    END IF;
    -- The transaction now holds the fence row until its client commits: a newer term finds this
    -- token and ends the transaction rather than wait on it (0003). (A refusal needs no such
    -- record: the error aborts the transaction, which releases the lock at once.)
    PERFORM baton.fence_register(p_token);
    INSERT INTO baton.fence_log (resource, token, holder, op) VALUES (p_resource, p_token, p_holder, 'user');
    RETURN p_token;
END
$$;

-- Records a refused user write after its transaction rolled back. It re-checks under the fence
-- row's lock and records only a write the fence refuses now: tokens only move forward, so a
-- token refused inside the aborted transaction is still refused here, and a caller cannot plant a
-- rejection for a token the fence would accept. Returns whether a row was recorded.
CREATE OR REPLACE FUNCTION baton.fence_record_rejection(p_resource TEXT, p_token BIGINT, p_holder TEXT,
                                                        OUT recorded BOOLEAN, OUT max_token BIGINT, OUT max_holder TEXT)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_fencing BOOLEAN;
BEGIN
    PERFORM baton.check_holder(p_holder);
    SELECT s.fencing INTO v_fencing FROM baton.settings s;
    SELECT l.max_token, l.max_holder INTO max_token, max_holder
      FROM baton.fence_lock_for(baton.fence_domain(p_resource), p_token, p_holder) l;
    recorded := v_fencing AND p_token IS NOT NULL AND p_holder IS NOT NULL
                AND (p_token < max_token OR (p_token = max_token AND p_holder <> max_holder));
    IF recorded THEN
        INSERT INTO baton.fence_rejections (resource, token, max_token, holder, max_holder, op, reason)
        VALUES (left(coalesce(p_resource, ''), 200), p_token, max_token, left(p_holder, 200), max_holder, 'user',
                CASE WHEN p_token < max_token THEN 'stale-token' ELSE 'holder-mismatch' END);
    END IF;
END
$$;

-- The application role may call the entry points, and nothing else: no table privileges at all.
REVOKE ALL ON ALL TABLES IN SCHEMA baton FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA baton FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA baton FROM PUBLIC;
GRANT USAGE ON SCHEMA baton TO baton_app;
GRANT EXECUTE ON FUNCTION baton.fencing_enabled() TO baton_app;
GRANT EXECUTE ON FUNCTION baton.seq_claim(TEXT, BIGINT, TEXT) TO baton_app;
GRANT EXECUTE ON FUNCTION baton.seq_commit(TEXT, BIGINT, TEXT, BIGINT, BIGINT) TO baton_app;
GRANT EXECUTE ON FUNCTION baton.seq_next(TEXT, BIGINT, TEXT) TO baton_app;
GRANT EXECUTE ON FUNCTION baton.cursor_claim(TEXT, BIGINT, TEXT) TO baton_app;
GRANT EXECUTE ON FUNCTION baton.sched_tick(TEXT, BIGINT, TEXT, BIGINT, INTEGER) TO baton_app;
GRANT EXECUTE ON FUNCTION baton.cursor_checkpoint(TEXT, BIGINT, TEXT, BIGINT) TO baton_app;
GRANT EXECUTE ON FUNCTION baton.fence_assert(TEXT, BIGINT, TEXT) TO baton_app;
GRANT EXECUTE ON FUNCTION baton.fence_record_rejection(TEXT, BIGINT, TEXT) TO baton_app;
