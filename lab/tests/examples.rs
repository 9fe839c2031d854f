//! The library's `examples/` are run, not only compiled: each against a private PostgreSQL that
//! this test starts (the fenced resource, and the lease store where an example needs one).

use std::path::PathBuf;
use std::process::Command;

use baton_lab::fleet::servers::ScratchPg;

/// Builds the examples (a no-op after `cargo test --workspace --all-features` built them) and
/// returns where they are.
fn examples_dir() -> PathBuf {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let st = Command::new(env!("CARGO"))
        .current_dir(root)
        .args(["build", "-q", "--workspace", "--examples", "--all-features"])
        .status()
        .expect("run cargo build --examples");
    assert!(st.success(), "building the examples failed");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(root).join("target"));
    target.join("debug").join("examples")
}

type Pg = ScratchPg;

fn private_pg() -> Pg {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(ScratchPg::start())
        .expect("a private PostgreSQL, migrated")
}

fn run(name: &str, envs: &[(&str, String)]) -> String {
    let mut cmd = Command::new(examples_dir().join(name));
    cmd.env("RUST_LOG", "warn");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run example {name}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "example {name} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn custom_elector_passes_conformance_and_leads_a_node() {
    let pg = private_pg();
    let out = run(
        "custom_elector",
        &[("BATON_DATABASE_URL", pg.server.app_url())],
    );
    assert!(out.contains("conformance: all checks passed"), "{out}");
    assert!(out.contains("the fence accepted its claim"), "{out}");
}

#[test]
fn embedded_http_serves_the_handle_from_its_own_server() {
    let pg = private_pg();
    let lease_url = pg.server.lease_url();
    let out = run(
        "embedded_http",
        &[
            ("BATON_DATABASE_URL", pg.server.app_url()),
            ("BATON_LEASE_URL", lease_url),
        ],
    );
    assert!(out.contains("\"i_lead\":true"), "{out}");
    assert!(out.contains("\"leader\":\"web1\""), "{out}");
}

/// Runs a query (or, ending in `;`, a statement batch) on the private PostgreSQL as its superuser.
fn admin_sql(pg: &Pg, sql: &str) -> Vec<tokio_postgres::Row> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(&pg.server.admin_url(), tokio_postgres::NoTls)
            .await
            .expect("connect as admin");
        tokio::spawn(conn);
        if sql.trim_end().ends_with(';') {
            client.batch_execute(sql).await.expect(sql);
            return Vec::new();
        }
        client.query(sql, &[]).await.expect(sql)
    })
}

/// A running example process, interrupted (Ctrl-C) and reaped on drop.
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0.id() as i32, libc::SIGCONT) };
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < until {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_fenced_job(pg: &Pg, dir: &std::path::Path, id: &str) -> Proc {
    let cfg = format!(
        r#"node_id = "{id}"
backend = "pg-lease"
lease_ttl_ms = 1000
renew_interval_ms = 300
retry_interval_ms = 100
work_stop_timeout_ms = 500
state_dir = "{state}"
[resource]
database_url = "{app}?application_name={id}"
[pg_lease]
database_url = "{lease}"
"#,
        state = dir.join(id).display(),
        app = pg.server.app_url(),
        lease = pg.server.lease_url(),
    );
    let path = dir.join(format!("{id}.toml"));
    std::fs::write(&path, cfg).unwrap();
    let log = std::fs::File::create(dir.join(format!("{id}.out"))).unwrap();
    let child = Command::new(examples_dir().join("fenced_job"))
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(log)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start fenced_job");
    Proc(child)
}

/// (holder, token) of the newest row in the user's own table.
fn newest_row(pg: &Pg) -> Option<(String, i64)> {
    admin_sql(
        pg,
        "SELECT holder, token FROM ledger ORDER BY id DESC LIMIT 1",
    )
    .first()
    .map(|r| (r.get(0), r.get(1)))
}

fn wait_for<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            std::time::Instant::now() < until,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Stops (SIGSTOP) every PostgreSQL backend of the node `app` (its `application_name`) while
/// none is inside a transaction, so no lock of the fence row is held by a stopped backend, and
/// returns their pids.
fn stop_idle_backends(pg: &Pg, app: &str) -> Vec<i32> {
    for _ in 0..100 {
        let pids: Vec<i32> = admin_sql(
            pg,
            &format!("SELECT pid FROM pg_stat_activity WHERE application_name = '{app}'"),
        )
        .iter()
        .map(|r| r.get(0))
        .collect();
        assert!(!pids.is_empty(), "{app} has no PostgreSQL backend");
        signal(&pids, libc::SIGSTOP);
        // A stopped backend's state is the one it last reported: "idle" is between transactions.
        let busy = admin_sql(
            pg,
            &format!(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE application_name = '{app}' AND state <> 'idle'"
            ),
        )[0]
        .get::<_, i64>(0);
        if busy == 0 {
            return pids;
        }
        signal(&pids, libc::SIGCONT);
        std::thread::sleep(std::time::Duration::from_millis(30));
    }
    panic!("{app}'s backends were never all idle at once");
}

/// Sends `sig` to each of `pids` (processes this test started, or their PostgreSQL backends).
fn signal(pids: &[i32], sig: i32) {
    for p in pids {
        // SAFETY: kill(2) has no memory effects; the pids are ours to signal.
        unsafe { libc::kill(*p, sig) };
    }
}

/// The README's library example, run for real: two processes of `fenced_job` on pg-lease. The
/// leader is paused (SIGSTOP) past its lease with its next write already sent; the other takes
/// over and writes under a newer token; the paused one, resumed, carries that write on:
/// PostgreSQL refuses it, records both tokens, and the user's table never shows an older token
/// after a newer one.
#[test]
fn fenced_job_a_paused_stale_leaders_write_is_refused() {
    let pg = private_pg();
    admin_sql(
        &pg,
        "CREATE TABLE ledger (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, token BIGINT, holder TEXT, n BIGINT);
         GRANT INSERT, SELECT ON ledger TO baton_app;",
    );
    let dir = tempfile::tempdir().unwrap();
    let mut procs = std::collections::HashMap::new();
    procs.insert("n1", start_fenced_job(&pg, dir.path(), "n1"));
    wait_for("n1's first row", 30, || newest_row(&pg));
    procs.insert("n2", start_fenced_job(&pg, dir.path(), "n2"));

    // A stale leader must be refused however its next write is timed. Resumed from a bare pause,
    // the node's overdue watchdog usually demotes it before its job's overdue sleep ends, and
    // then it writes nothing at all (1 pause in 3 wrote here, fewer under load). So the pause
    // catches the leader with its next write already sent: its PostgreSQL backends (named by
    // `application_name`) are stopped between two of its transactions, the job's next `begin`
    // waits on them, and only then is the node paused. Resumed after the takeover, that write
    // goes on and must be refused.
    let (stale, token) = wait_for("a row", 30, || newest_row(&pg));
    let backends = stop_idle_backends(&pg, &stale);
    // The job writes every 100 ms: its next write is now waiting on a stopped backend.
    std::thread::sleep(std::time::Duration::from_millis(400));
    let pid = procs[stale.as_str()].0.id() as i32;
    signal(&[pid], libc::SIGSTOP);
    // The other node's lease wins once the paused one's lease (1 s) runs out.
    let (_, newer) = wait_for("a newer term's row", 30, || {
        newest_row(&pg).filter(|(h, t)| *h != stale && *t > token)
    });
    // The backends first, so the write they hold is answered when the node wakes.
    signal(&backends, libc::SIGCONT);
    signal(&[pid], libc::SIGCONT);
    let rows = wait_for("the stale write's rejection", 10, || {
        let rows = admin_sql(
            &pg,
            &format!(
                "SELECT token, max_token FROM baton.fence_rejections
                  WHERE op = 'user' AND holder = '{stale}' AND token = {token}"
            ),
        );
        (!rows.is_empty()).then_some(rows)
    });
    let max_token: i64 = rows[0].get(1);
    assert!(
        max_token >= newer,
        "recorded max_token {max_token} < newer term {newer}"
    );
    let out = std::fs::read_to_string(dir.path().join(format!("{stale}.out"))).unwrap();
    assert!(
        out.contains(&format!("token {token} refused")),
        "{stale}'s output should show the refusal:\n{out}"
    );
    eprintln!("stale {stale} token {token} refused at max_token {max_token}");
    // The user's table, in commit order, never goes back to an older token, with the new term
    // writing on after the refusal.
    wait_for("the new term's rows", 30, || {
        let n: i64 = admin_sql(
            &pg,
            &format!("SELECT count(*) FROM ledger WHERE token = {newer}"),
        )[0]
        .get(0);
        (n >= 10).then_some(())
    });
    let tokens: Vec<i64> = admin_sql(&pg, "SELECT token FROM ledger ORDER BY id")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(tokens.len() > 10, "too few rows: {tokens:?}");
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "an older token after a newer one: {tokens:?}"
    );
}
