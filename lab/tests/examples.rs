//! The library's `examples/` are run, not only compiled: each against a private PostgreSQL that
//! this test starts (the fenced resource, and the lease store where an example needs one).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use baton_lab::fleet::servers::ScratchPg;
use common::strip_ansi;

/// Builds the examples (a no-op after `cargo test --workspace --all-features` built them) and
/// returns where they are. Once per test binary: the tests that start several example processes
/// call it for each, and each build, even with nothing to do, costs seconds.
fn examples_dir() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_examples).clone()
}

fn build_examples() -> PathBuf {
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

/// Starts `fenced_job` as node `id` with the config at `config`; its stdout goes to `dir/ID.out`.
/// Starts `fenced_job` as node `id` with the config at `config`; its stdout goes to `dir/ID.out`,
/// its log (WARN and up) to `dir/ID.err`.
fn spawn_fenced_job(config: &std::path::Path, dir: &std::path::Path, id: &str) -> Proc {
    let log = std::fs::File::create(dir.join(format!("{id}.out"))).unwrap();
    let err = std::fs::File::create(dir.join(format!("{id}.err"))).unwrap();
    let child = Command::new(examples_dir().join("fenced_job"))
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(log)
        .stderr(err)
        .spawn()
        .expect("start fenced_job");
    Proc(child)
}

fn start_fenced_job(pg: &Pg, dir: &std::path::Path, id: &str) -> Proc {
    let cfg = format!(
        r#"node_id = "{id}"
backend = "pg-lease"
lease_ttl_ms = 1000
renew_interval_ms = 250
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
    spawn_fenced_job(&path, dir, id)
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

/// Configs for `n` `fenced_job` nodes on `backend`, each writing as its own database role (so the
/// fence records who held it) named by `application_name`, written under `dir`. pg-lease at the
/// issue's timing (TTL 3 s). raft with `election_timeout_ms = "600-1000"`: no follower may win
/// before the maximum (1 s) has passed since it last heard the leader, so that is raft's takeover
/// time, and `lease_ttl_ms` is set to it (raft grants the leader min(TTL, 600 ms) to act on).
async fn fenced_job_configs(
    pg: &Pg,
    dir: &std::path::Path,
    backend: baton::backends::BackendKind,
    n: usize,
) -> Vec<(String, std::path::PathBuf)> {
    use baton::backends::BackendKind;
    let ports = baton_lab::fleet::servers::free_ports(n).unwrap();
    let peer_ports = baton_lab::fleet::servers::free_ports(n).unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        let id = format!("n{}", i + 1);
        let mut c = baton::config::NodeConfig {
            node_id: id.clone(),
            http_listen: format!("127.0.0.1:{}", ports[i]).parse().unwrap(),
            state_dir: dir.join(&id),
            work_stop_timeout_ms: 500,
            ..baton::config::NodeConfig::for_backend(backend)
        };
        let role_url = pg.server.node_role_url(&id).await.unwrap();
        c.resource.database_url = format!("{role_url}?application_name={id}");
        match backend {
            BackendKind::PgLease => {
                c.retry_interval_ms = 100;
                c.pg_lease.database_url = pg.server.lease_url();
            }
            BackendKind::Raft => {
                // Raft grants min(lease, election timeout min): 700 ms leaves the 3 renewals
                // + 5 ms the timing validation asks for (600 ms did not).
                c.election_timeout_ms = "700-1000".into();
                c.lease_ttl_ms = 1000;
                c.renew_interval_ms = 200;
                c.retry_interval_ms = 50;
                c.deadline_margin_ms = 50;
                c.raft.heartbeat_interval_ms = 50;
                c.raft.peers = (0..n)
                    .map(|j| baton::config::PeerSpec {
                        id: format!("n{}", j + 1),
                        addr: format!("127.0.0.1:{}", ports[j]),
                        peer_addr: format!("127.0.0.1:{}", peer_ports[j]),
                    })
                    .collect();
                c.raft.peer_listen = Some(format!("127.0.0.1:{}", peer_ports[i]).parse().unwrap());
                c.raft.cluster_secret = Some(baton::config::Secret::new(
                    "test-cluster-secret-0123456789abcdef",
                ));
            }
            other => panic!("no fenced_job config for {other:?}"),
        }
        std::fs::create_dir_all(&c.state_dir).unwrap();
        let path = dir.join(format!("{id}.toml"));
        baton_lab::fleet::write_private(&path, toml::to_string(&c).unwrap()).unwrap();
        out.push((id, path));
    }
    out
}

/// What one pause inside a fenced transaction showed.
struct PausedHolder {
    /// The first row of a newer term in the user's table, after the pause began (ms).
    first_new_write_ms: f64,
    /// The first election of a newer term (the nodes' actor traces), after the pause began (ms):
    /// the term that then wrote, or one before it that could not.
    first_elected_ms: f64,
    /// The lease (TTL) the bound is measured against (ms).
    ttl_ms: u64,
    /// `(token, max_token)` of the `preempted` record of the paused holder, if any.
    preempted: Option<(i64, i64)>,
    /// The paused holder and its token.
    stale: String,
    token: i64,
    /// The paused holder's log (WARN and up) and actor trace, after it resumed.
    stale_log: String,
    stale_trace: String,
}

/// `n` `fenced_job` nodes on `backend`; the leader is paused (SIGSTOP) inside one of its fenced
/// transactions, after `fence_assert` and while its INSERT runs (a trigger makes that INSERT, and
/// only the paused holder's, last 500 ms, so the pause lands there every time). A newer term
/// takes over and writes; the paused process is resumed only after that, and its COMMIT must
/// fail: the count of its term's rows does not move. With `preempt` false the resource's
/// switch is off: the behaviour before issue 29.
async fn pause_inside_a_fenced_transaction(
    backend: baton::backends::BackendKind,
    n: usize,
    preempt: bool,
) -> PausedHolder {
    let pg = ScratchPg::start().await.expect("a private PostgreSQL");
    let db = connect(&pg.server.admin_url()).await;
    db.batch_execute(
        "CREATE TABLE ledger (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, token BIGINT,
                              holder TEXT, n BIGINT, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp());
         CREATE TABLE slow_holder (holder TEXT);
         CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.holder IN (SELECT s.holder FROM slow_holder s) THEN PERFORM pg_sleep(0.5); END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER slow BEFORE INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION slow_insert();
         GRANT INSERT, SELECT ON ledger TO baton_app;
         GRANT SELECT ON slow_holder TO baton_app;",
    )
    .await
    .unwrap();
    db.execute(
        "UPDATE baton.settings SET preempt_lower_tokens = $1",
        &[&preempt],
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let configs = fenced_job_configs(&pg, dir.path(), backend, n).await;
    let ttl_ms = baton::config::NodeConfig::from_file(&configs[0].1)
        .unwrap()
        .lease_ttl_ms;
    // Built before the clock matters, off the runtime's threads.
    tokio::task::spawn_blocking(examples_dir).await.unwrap();
    let procs: std::collections::HashMap<String, Proc> = configs
        .iter()
        .map(|(id, path)| (id.clone(), spawn_fenced_job(path, dir.path(), id)))
        .collect();
    let newest = || async {
        db.query_opt(
            "SELECT holder, token FROM ledger ORDER BY id DESC LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
    };
    // The leader's next INSERT is slowed, and it is paused while that INSERT runs. A leader that
    // lost its term meanwhile (a loaded machine) writes no more: the newest row's holder is
    // picked again.
    let in_insert = "SELECT pid FROM pg_stat_activity
                      WHERE application_name = $1 AND state = 'active' AND query LIKE 'INSERT INTO ledger%'";
    let until = Instant::now() + Duration::from_secs(60);
    let (stale, backend_pid) = 'caught: loop {
        assert!(
            Instant::now() < until,
            "no leader ran a slowed INSERT within 60 s"
        );
        let Some((holder, _)) = newest().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        db.execute("DELETE FROM slow_holder", &[]).await.unwrap();
        db.execute("INSERT INTO slow_holder VALUES ($1)", &[&holder])
            .await
            .unwrap();
        let seen_until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < seen_until {
            if let Some(r) = db.query_opt(in_insert, &[&holder]).await.unwrap() {
                break 'caught (holder, r.get::<_, i32>(0));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let pid = procs[&stale].0.id() as i32;
    signal(&[pid], libc::SIGSTOP);
    let paused_at = std::time::SystemTime::now();
    // Inside its fenced transaction: its session holds the fence row, under the token it
    // registered (what a newer term compares its own with).
    let token: i64 = db
        .query_opt(
            "SELECT token FROM baton.fence_holders('leadership') WHERE pid = $1",
            &[&backend_pid],
        )
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{stale}'s paused session does not hold the fence row"))
        .get(0);
    // Its INSERT ends; its COMMIT cannot be sent: the backend waits idle inside the transaction
    // (or, with preemption, may already be gone).
    let idle_in_tx = "SELECT state FROM pg_stat_activity WHERE pid = $1";
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let state: Option<String> = db
            .query_opt(idle_in_tx, &[&backend_pid])
            .await
            .unwrap()
            .and_then(|r| r.get(0));
        match state.as_deref() {
            Some("idle in transaction") | None => break,
            Some("active") => {}
            Some(other) => panic!("{stale}'s backend is {other}, not inside its transaction"),
        }
        assert!(Instant::now() < until, "{stale}'s INSERT did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let committed = "SELECT count(*) FROM ledger WHERE token = $1";
    let before: i64 = db.query_one(committed, &[&token]).await.unwrap().get(0);
    // A newer term's first row.
    let first_new = "SELECT token, extract(epoch FROM at)::float8 FROM ledger
                      WHERE token > $1 ORDER BY id LIMIT 1";
    let until = Instant::now() + Duration::from_secs(30);
    let (newer, at_s): (i64, f64) = loop {
        if let Some(r) = db.query_opt(first_new, &[&token]).await.unwrap() {
            break (r.get(0), r.get(1));
        }
        assert!(Instant::now() < until, "no newer term wrote within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let paused_s = paused_at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let first_new_write_ms = (at_s - paused_s) * 1000.0;
    let first_elected_ms =
        first_election_above(dir.path(), &configs, token) as f64 - paused_s * 1000.0;
    // Resumed: the COMMIT it was about to send goes out, and fails; or the node, finding its term
    // over, stops its work first and the transaction is dropped. Nothing of it lands either way.
    signal(&[pid], libc::SIGCONT);
    let out_path = dir.path().join(format!("{stale}.out"));
    let until = Instant::now() + Duration::from_secs(5);
    let commit_error = loop {
        let out = std::fs::read_to_string(&out_path).unwrap();
        let last = out.lines().last().unwrap_or_default();
        if !last.starts_with("wrote ") {
            break last.to_owned();
        }
        if Instant::now() >= until {
            break "none: its work was stopped before it committed".to_owned();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let after: i64 = db.query_one(committed, &[&token]).await.unwrap().get(0);
    assert_eq!(
        after, before,
        "the paused transaction of token {token} committed after term {newer} wrote"
    );
    // What the resumed node said of its lost work: given until its demotion has run its course
    // (the trace's `demoted` of that term).
    let stale_trace_path = dir.path().join(&stale).join("actor-trace.jsonl");
    let demoted = format!("\"event\":\"demoted\",\"token\":{token}");
    let until = Instant::now() + Duration::from_secs(15);
    while !std::fs::read_to_string(&stale_trace_path)
        .unwrap_or_default()
        .contains(&demoted)
        && Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stale_log =
        strip_ansi(&std::fs::read_to_string(dir.path().join(format!("{stale}.err"))).unwrap());
    let stale_trace = std::fs::read_to_string(&stale_trace_path).unwrap_or_default();
    let preempted = db
        .query_opt(
            "SELECT token, max_token FROM baton.fence_rejections
              WHERE reason = 'preempted' AND holder = $1",
            &[&stale],
        )
        .await
        .unwrap()
        .map(|r| (r.get(0), r.get(1)));
    drop(procs);
    let paused = PausedHolder {
        first_new_write_ms,
        first_elected_ms,
        ttl_ms,
        preempted,
        stale: stale.clone(),
        token,
        stale_log,
        stale_trace,
    };
    eprintln!(
        "{}, preemption {}: {stale} paused inside its transaction under token {token}, TTL \
         {ttl_ms} ms; term {newer}'s {}; the stale COMMIT: {commit_error}; preempted record \
         {preempted:?}",
        backend.as_str(),
        if preempt { "on" } else { "off" },
        paused.figures(),
    );
    paused
}

/// The wall-clock ms of the first election of a term above `token` by any node of `configs`
/// (their actor traces).
fn first_election_above(
    dir: &std::path::Path,
    configs: &[(String, std::path::PathBuf)],
    token: i64,
) -> i64 {
    configs
        .iter()
        .flat_map(|(id, _)| {
            let trace = dir.join(id).join("actor-trace.jsonl");
            std::fs::read_to_string(trace)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|v| v["event"] == "elected" && v["token"].as_i64() > Some(token))
                .filter_map(|v| v["wall_ms"].as_i64())
                .collect::<Vec<_>>()
        })
        .min()
        .unwrap_or_else(|| panic!("no node traced its election with token {token}"))
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the private PostgreSQL");
    tokio::spawn(conn);
    client
}

impl PausedHolder {
    /// The issue's bound on the next leader's first write: TTL + 500 ms after the pause began.
    /// Where the backend itself elected nobody by then (raft: a split vote costs a second round,
    /// ~1 s here), 500 ms after the first election instead: what the fence adds is measured
    /// from there, and no resource can make an election come sooner.
    fn bound_ms(&self) -> f64 {
        (self.ttl_ms as f64).max(self.first_elected_ms) + 500.0
    }

    fn figures(&self) -> String {
        format!(
            "first write {:.0} ms after the pause began, a newer term elected after {:.0} ms, \
             bound {:.0} ms",
            self.first_new_write_ms,
            self.first_elected_ms,
            self.bound_ms()
        )
    }
}

/// Issue 43: the resumed node says out loud that its term was taken and its work lost: a WARN
/// naming the token, the holder and why (the demotion: lease deadline or lost lease; the lost
/// commit: preempted or its connection ended), never only INFO trace lines. Its trace says what
/// happened: no `kill` of a work that had stopped by itself.
fn assert_said_out_loud(p: &PausedHolder) {
    let (token, holder) = (format!("token={}", p.token), format!("holder={}", p.stale));
    let warns: Vec<&str> = p
        .stale_log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(&token) && l.contains(&holder))
        .collect();
    let said = |why: &[&str]| warns.iter().any(|l| why.iter().any(|w| l.contains(w)));
    assert!(
        said(&["reason=lease-deadline", "reason=lease-lost"]),
        "{}: no WARN with {token} {holder} for the demotion:\n{}",
        p.stale,
        p.stale_log
    );
    assert!(
        said(&[
            "reason=preempted",
            "reason=connection-ended",
            "terminating connection",
            "connection closed",
        ]),
        "{}: no WARN with {token} {holder} for the lost commit:\n{}",
        p.stale,
        p.stale_log
    );
    let kills: Vec<&str> = p
        .stale_trace
        .lines()
        .filter(|l| {
            l.contains("\"event\":\"kill\"") && l.contains(&format!("\"token\":{}", p.token))
        })
        .collect();
    assert!(
        kills.is_empty(),
        "{}: a work was killed after its checkpoint: {kills:?}",
        p.stale
    );
}

/// The paused transaction ended by the newer term in time, and recorded.
fn assert_preempted_in_time(p: &PausedHolder) {
    assert!(
        p.first_new_write_ms <= p.bound_ms(),
        "the next leader waited: {}",
        p.figures()
    );
    let (token, max_token) = p.preempted.expect("the ending is recorded");
    assert!(
        token < max_token,
        "a lower token was ended: {token} < {max_token}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_in_its_fenced_transaction_is_ended_in_time_pg_lease() {
    let p = pause_inside_a_fenced_transaction(baton::backends::BackendKind::PgLease, 2, true).await;
    assert_preempted_in_time(&p);
    assert_said_out_loud(&p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_in_its_fenced_transaction_is_ended_in_time_raft() {
    let p = pause_inside_a_fenced_transaction(baton::backends::BackendKind::Raft, 3, true).await;
    assert_preempted_in_time(&p);
    assert_said_out_loud(&p);
}

/// The same pause with the resource's preemption switched off (the behaviour before issue 29):
/// the newer term, elected in time, waits for the server's idle-in-transaction timeout (5 s) to
/// end the paused session (pg-lease's first new term even gives up, its claim past the 2 s
/// statement timeout), past the bound. What shows the two tests above can fail.
fn assert_waited_past_the_bound(p: &PausedHolder) {
    assert!(
        p.first_new_write_ms > p.bound_ms(),
        "without preemption the next leader did not wait: {}",
        p.figures()
    );
    assert_eq!(p.preempted, None, "nothing was preempted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_in_its_fenced_transaction_without_preemption_is_waited_for_pg_lease() {
    let p =
        pause_inside_a_fenced_transaction(baton::backends::BackendKind::PgLease, 2, false).await;
    assert_waited_past_the_bound(&p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_in_its_fenced_transaction_without_preemption_is_waited_for_raft() {
    let p = pause_inside_a_fenced_transaction(baton::backends::BackendKind::Raft, 3, false).await;
    assert_waited_past_the_bound(&p);
}
