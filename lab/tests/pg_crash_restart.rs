//! Pinned scenario from the nemesis (issue 11): PostgreSQL killed -9 mid-load must come back on
//! the same data dir and port, with every committed row. The first nemesis runs could not
//! restart it: the postmaster, double-forked by pg_ctl, lingered as an unreaped zombie, so
//! PostgreSQL's lock checks (`kill(pid, 0)` on the pid in `postmaster.pid` and in the socket's
//! lock file) took it for a running server and refused to start ("lock file ... already
//! exists"). `PgServer::kill9` now kills the postmaster and its children and removes the stale
//! lock files once every one of them is dead.

use baton_lab::fleet::servers::{free_ports, pid_alive, PgServer};

#[test]
fn postgres_killed_minus_nine_restarts_with_its_committed_rows() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pg");
    let port = free_ports(1).unwrap()[0];
    let pg = PgServer::start(&root, port).expect("start PostgreSQL");
    pg.psql(
        "baton",
        "CREATE TABLE t (x int); INSERT INTO t SELECT generate_series(1, 1000);",
    )
    .expect("write");
    for round in 0..3 {
        let killed = pg.kill9().expect("kill -9");
        assert!(killed.len() >= 2, "postmaster and children: {killed:?}");
        assert!(killed.iter().all(|p| !pid_alive(*p)), "{killed:?}");
        let again = PgServer::start(&root, port)
            .unwrap_or_else(|e| panic!("restart {round} after kill -9: {e}"));
        assert_eq!(again.port, port);
        let n = pg.psql("baton", "SELECT count(*) FROM t").expect("read");
        assert_eq!(n.trim(), "1000", "round {round}: committed rows lost");
        pg.psql(
            "baton",
            "INSERT INTO t SELECT -1; DELETE FROM t WHERE x = -1;",
        )
        .expect("writable after recovery");
    }
    pg.stop();
}
