#!/usr/bin/env python3
"""A leader program in another language, fencing its own writes: run it under `baton run`.

    baton run --config node.toml -- python3 examples/fenced_child.py

While its node leads, it appends a row to its own table every 200 ms, each in one transaction
that first asserts the term's token at the resource:

    BEGIN;
    SELECT baton.fence_assert('jobtable', $BATON_TOKEN, $BATON_HOLDER);
    INSERT INTO jobtable (token, holder, n, kind) VALUES (...);
    COMMIT;

A stale token (this program's node was paused past its lease and another node has written since)
raises SQLSTATE BF409: the whole transaction is rolled back, and the program records the refusal
with `baton.fence_record_rejection` in a fresh transaction. On SIGTERM (demotion) it finishes the
write in flight, writes one last `final` row (its checkpoint) and exits 0; that last write is
fenced like any other.

It talks to PostgreSQL through `psql` (SQL on stdin, the password in PGPASSWORD, never in argv),
so it needs nothing beyond Python 3 and the PostgreSQL client. Once, as the database owner:

    CREATE TABLE jobtable (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, token BIGINT,
                           holder TEXT, n BIGINT, kind TEXT, at TIMESTAMPTZ DEFAULT clock_timestamp());
    GRANT INSERT, SELECT ON jobtable TO baton_app;
"""
import os
import signal
import subprocess
import sys
import time
from urllib.parse import unquote, urlparse

RESOURCE = "jobtable"
INTERVAL_S = float(os.environ.get("FENCED_CHILD_INTERVAL_S", "0.2"))
FENCE_REFUSED = "BF409"

stopping = False


def on_term(_sig, _frame):
    global stopping
    stopping = True


def psql_env(url):
    """libpq settings from BATON_DATABASE_URL, so the password never shows in the process list."""
    u = urlparse(url)
    env = dict(os.environ)
    env.update(
        PGHOST=u.hostname or "127.0.0.1",
        PGPORT=str(u.port or 5432),
        PGUSER=unquote(u.username or ""),
        PGPASSWORD=unquote(u.password or ""),
        PGDATABASE=u.path.lstrip("/") or "postgres",
    )
    return env


def psql(env, sql, **variables):
    """Runs `sql` (psql variables interpolated, quoted by psql itself); returns (rc, out, err)."""
    args = ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose"]
    for k, v in variables.items():
        args += ["-v", f"{k}={v}"]
    p = subprocess.run(args, input=sql, env=env, capture_output=True, text=True)
    return p.returncode, p.stdout.strip(), p.stderr.strip()


WRITE = """BEGIN;
SELECT baton.fence_assert(:'resource', :token, :'holder');
INSERT INTO jobtable (token, holder, n, kind) VALUES (:token, :'holder', :n, :'kind');
COMMIT;
"""

RECORD = "SELECT recorded, max_token FROM baton.fence_record_rejection(:'resource', :token, :'holder');\n"


def write(env, token, holder, n, kind):
    """One fenced write. True if it committed."""
    rc, _, err = psql(env, WRITE, resource=RESOURCE, token=token, holder=holder, n=n, kind=kind)
    if rc == 0:
        print(f"wrote n={n} kind={kind} under token {token}", flush=True)
        return True
    if FENCE_REFUSED in err:
        # The refused transaction is gone with its psql session (rolled back); record it anew.
        _, out, _ = psql(env, RECORD, resource=RESOURCE, token=token, holder=holder)
        print(f"token {token} refused by the fence (recorded|max_token: {out})", flush=True)
    else:
        print(f"write n={n} failed (rc={rc}): {err.splitlines()[-1] if err else ''}", flush=True)
    return False


def main():
    # An integer, or refuse to start: it is interpolated into SQL unquoted.
    token, holder = int(os.environ["BATON_TOKEN"]), os.environ["BATON_HOLDER"]
    env = psql_env(os.environ["BATON_DATABASE_URL"])
    signal.signal(signal.SIGTERM, on_term)
    print(f"started under token {token} as {holder} (pid {os.getpid()})", flush=True)
    n = 0
    while not stopping:
        write(env, token, holder, n, "tick")
        n += 1
        deadline = time.monotonic() + INTERVAL_S
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.01)
    write(env, token, holder, n, "final")
    print(f"stopping (token {token})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
