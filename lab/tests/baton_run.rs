//! `baton run -- CMD` against real servers: a private PostgreSQL (the fenced resource and, for
//! pg-lease, the lease store) and `baton run` processes on loopback (raft: the nodes themselves).
//!
//! What is shown: the program runs only on the leader; after a kill -9 of the leader's baton, the
//! new leader's program starts only after every process of the old one is gone (CLOCK_MONOTONIC
//! on this machine, and the resource's own clock); a program that ignores SIGTERM is SIGKILLed at
//! the stop timeout and a forking one leaves nothing behind; a watchdog demotion stops the program
//! before the lease deadline by the configured margin; a paused leader's late write is fenced.
//! Measured gaps are printed (`--nocapture`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton::backends::BackendKind;
use baton::clock::monotonic_ns;
use baton::config::{NodeConfig, PeerSpec, Secret};
use baton::work::child::live_member;
use baton_lab::fleet::client::NodeClient;
use baton_lab::fleet::redis_server::RedisServer;
use baton_lab::fleet::servers::{free_ports, log_tail, EtcdCluster, PgServer, ScratchPg};
use baton_lab::fleet::zk_server::ZkEnsemble;
use serde_json::Value;

mod common;

const BATON: &str = env!("CARGO_BIN_EXE_baton");
const FENCED_CHILD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/fenced_child.py");

/// A private PostgreSQL with the fence migrated, pg-lease provisioned and the program's table.
struct Pg {
    /// Held for its Drop: the server stops with the test.
    _scratch: ScratchPg,
    server: PgServer,
}

impl Pg {
    async fn start() -> Pg {
        let scratch = ScratchPg::start()
            .await
            .expect("a private PostgreSQL, migrated");
        let pg = Pg {
            server: scratch.server.clone(),
            _scratch: scratch,
        };
        pg.sql(
            "CREATE TABLE jobtable (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, token BIGINT,
                                    holder TEXT, n BIGINT, kind TEXT, at TIMESTAMPTZ DEFAULT clock_timestamp());
             GRANT INSERT, SELECT ON jobtable TO baton_app;",
        )
        .await;
        pg
    }

    /// Runs a query (or, ending in `;`, a batch) as the superuser.
    async fn sql(&self, sql: &str) -> Vec<tokio_postgres::Row> {
        let (client, conn) =
            tokio_postgres::connect(&self.server.admin_url(), tokio_postgres::NoTls)
                .await
                .expect("connect as admin");
        tokio::spawn(conn);
        if sql.trim_end().ends_with(';') {
            client.batch_execute(sql).await.expect(sql);
            return Vec::new();
        }
        client.query(sql, &[]).await.expect(sql)
    }

    /// Tokens of the program's table in commit order.
    async fn table_tokens(&self) -> Vec<i64> {
        let rows = self.sql("SELECT token FROM jobtable ORDER BY id").await;
        rows.iter().map(|r| r.get(0)).collect()
    }

    /// (last accepted write of `old`, first of `new`) by the resource's clock: the gap in ms.
    async fn resource_gap_ms(&self, old: i64, new: i64) -> f64 {
        let q = format!(
            "SELECT EXTRACT(EPOCH FROM (SELECT min(committed_at) FROM baton.fence_log WHERE token = {new})
                                      - (SELECT max(committed_at) FROM baton.fence_log WHERE token = {old}))::float8 * 1000"
        );
        self.sql(&q).await[0]
            .get::<_, Option<f64>>(0)
            .unwrap_or(f64::NAN)
    }
}

/// One `baton run` process, stopped (SIGCONT, SIGTERM, then SIGKILL) on drop.
struct RunNode {
    id: String,
    /// The election backend, for the figures printed.
    backend: &'static str,
    http: String,
    state_dir: PathBuf,
    log: PathBuf,
    proc: Option<Child>,
    /// After a kill -9 of this baton: when the test saw its program's group gone (its trace
    /// cannot say: the node died first).
    killed_gone_ns: Option<u64>,
}

impl RunNode {
    fn pid(&self) -> i32 {
        self.proc.as_ref().map(|p| p.id() as i32).unwrap_or(0)
    }

    /// The lines `actor` wrote in this node's actor trace.
    fn actor_steps(&self, actor: &str) -> Vec<Value> {
        let text =
            std::fs::read_to_string(self.state_dir.join("actor-trace.jsonl")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["actor"] == actor)
            .collect()
    }

    /// The child lines of this node's actor trace.
    fn child_steps(&self) -> Vec<Value> {
        self.actor_steps("child")
    }

    fn steps(&self, event: &str) -> Vec<Value> {
        self.child_steps()
            .into_iter()
            .filter(|v| v["event"] == event)
            .collect()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn kill9(&mut self) {
        // SAFETY: kill(2) on the process this test started.
        unsafe { libc::kill(self.pid(), libc::SIGKILL) };
        if let Some(mut p) = self.proc.take() {
            let _ = p.wait();
        }
    }
}

impl RunNode {
    /// SIGCONT and SIGTERM to this baton (a graceful shutdown), SIGKILL after 10 s; waits for
    /// it to exit.
    fn terminate(&mut self) {
        let Some(mut p) = self.proc.take() else {
            return;
        };
        // SAFETY: signals to the process this test started.
        unsafe {
            libc::kill(p.id() as i32, libc::SIGCONT);
            libc::kill(p.id() as i32, libc::SIGTERM);
        }
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(Some(_)) = p.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = p.kill();
        let _ = p.wait();
    }
}

impl Drop for RunNode {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// Timing for a fleet of `baton run` nodes.
#[derive(Clone, Copy)]
struct Timing {
    lease_ttl_ms: u64,
    renew_interval_ms: u64,
    retry_interval_ms: u64,
    stop_timeout_ms: u64,
    child_stop_margin_ms: u64,
    /// Raft only. Raft grants min(lease_ttl, election timeout min) (no new leader can be elected
    /// sooner), so the margin for the program's stop must fit inside the election timeout.
    election_timeout: &'static str,
}

const PG_LEASE: Timing = Timing {
    lease_ttl_ms: 3000,
    renew_interval_ms: 500,
    retry_interval_ms: 100,
    stop_timeout_ms: 1000,
    child_stop_margin_ms: 1300,
    election_timeout: "150-300",
};

/// The pause test: a stop timeout long enough that, on a loaded machine, the resumed program's
/// in-flight and final writes (three psql runs) reach the resource before any SIGKILL.
const PG_LEASE_SLOW_STOP: Timing = Timing {
    lease_ttl_ms: 6000,
    renew_interval_ms: 800,
    retry_interval_ms: 100,
    stop_timeout_ms: 3000,
    child_stop_margin_ms: 3300,
    election_timeout: "150-300",
};

const RAFT: Timing = Timing {
    lease_ttl_ms: 1500,
    renew_interval_ms: 100,
    retry_interval_ms: 50,
    stop_timeout_ms: 500,
    child_stop_margin_ms: 700,
    election_timeout: "1500-3000",
};

/// Node configs for `n` members of `backend`, written under `dir`.
fn configs(
    pg: &Pg,
    dir: &Path,
    backend: BackendKind,
    n: usize,
    t: Timing,
) -> Vec<(NodeConfig, PathBuf)> {
    configs_with(pg, dir, backend, n, t, &|_| {})
}

/// [`configs`], with `extra` applied to each (e.g. the election server's address).
fn configs_with(
    pg: &Pg,
    dir: &Path,
    backend: BackendKind,
    n: usize,
    t: Timing,
    extra: &dyn Fn(&mut NodeConfig),
) -> Vec<(NodeConfig, PathBuf)> {
    let ports = free_ports(n).unwrap();
    let peer_ports = free_ports(n).unwrap();
    let secret = Secret::new("test-cluster-secret-0123456789abcdef");
    (0..n)
        .map(|i| {
            let mut c = NodeConfig {
                node_id: format!("n{}", i + 1),
                backend,
                http_listen: format!("127.0.0.1:{}", ports[i]).parse().unwrap(),
                lease_ttl_ms: t.lease_ttl_ms,
                renew_interval_ms: t.renew_interval_ms,
                retry_interval_ms: t.retry_interval_ms,
                deadline_margin_ms: 20,
                state_dir: dir.join(format!("n{}", i + 1)),
                ..NodeConfig::default()
            };
            c.resource.database_url = pg.server.app_url();
            c.pg_lease.database_url = pg.server.lease_url();
            if backend == BackendKind::Raft {
                c.election_timeout_ms = t.election_timeout.into();
                c.raft.heartbeat_interval_ms = 50;
                c.raft.peers = (0..n)
                    .map(|j| PeerSpec {
                        id: format!("n{}", j + 1),
                        addr: format!("127.0.0.1:{}", ports[j]),
                        peer_addr: format!("127.0.0.1:{}", peer_ports[j]),
                    })
                    .collect();
                c.raft.peer_listen = Some(format!("127.0.0.1:{}", peer_ports[i]).parse().unwrap());
                c.raft.cluster_secret = Some(secret.clone());
            }
            extra(&mut c);
            std::fs::create_dir_all(&c.state_dir).unwrap();
            let path = dir.join(format!("n{}.toml", i + 1));
            baton_lab::fleet::write_private(&path, toml::to_string(&c).unwrap()).unwrap();
            (c, path)
        })
        .collect()
}

/// Starts `baton run --config CFG <flags> -- <command>`; its stdout and stderr go to a log file.
fn start(cfg: &(NodeConfig, PathBuf), t: Timing, flags: &[&str], command: &[&str]) -> RunNode {
    start_logging(cfg, t, flags, command, "warn")
}

/// [`start`], logging what `rust_log` selects.
fn start_logging(
    cfg: &(NodeConfig, PathBuf),
    t: Timing,
    flags: &[&str],
    command: &[&str],
    rust_log: &str,
) -> RunNode {
    let (c, path) = cfg;
    let log = c.state_dir.join("run.log");
    let out = std::fs::File::create(&log).unwrap();
    let proc = Command::new(BATON)
        .arg("run")
        .arg("--config")
        .arg(path)
        .args(["--stop-timeout", &format!("{}ms", t.stop_timeout_ms)])
        .args([
            "--child-stop-margin",
            &format!("{}ms", t.child_stop_margin_ms),
        ])
        .args(flags)
        .arg("--")
        .args(command)
        .env("RUST_LOG", rust_log)
        .env("FENCED_CHILD_INTERVAL_S", "0.1")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start baton run");
    RunNode {
        id: c.node_id.clone(),
        backend: c.backend.as_str(),
        http: c.http_listen.to_string(),
        state_dir: c.state_dir.clone(),
        log,
        proc: Some(proc),
        killed_gone_ns: None,
    }
}

async fn wait_for<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < until,
            "timed out after {secs} s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `key=value` from a trace line's detail.
fn detail(v: &Value, key: &str) -> Option<i64> {
    let d = v["detail"].as_str()?;
    d.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|x| x.parse::<f64>().ok())
        .map(|x| x as i64)
}

/// `key=value` from a trace line's detail, as a float.
fn detail_f64(v: &Value, key: &str) -> Option<f64> {
    v["detail"]
        .as_str()?
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
        .parse()
        .ok()
}

/// The promise of `baton run`: when its program was gone (`gone`, a `child-gone` step), the
/// lease could not yet have expired. Returns the time that was left (ms), printed per path.
fn assert_gone_before_lease_expiry(gone: &Value, path: &str) -> f64 {
    let lease_ms = detail_f64(gone, "before_lease_expiry_ms")
        .unwrap_or_else(|| panic!("{path}: child-gone without before_lease_expiry_ms: {gone}"));
    let watchdog_ms = detail_f64(gone, "before_watchdog_deadline_ms").unwrap_or_else(|| {
        panic!("{path}: child-gone without before_watchdog_deadline_ms: {gone}")
    });
    eprintln!(
        "lease margin, {path}: program gone {lease_ms:.1} ms before the lease could expire \
         ({watchdog_ms:.1} ms before the watchdog's deadline)"
    );
    assert!(
        lease_ms > 0.0,
        "{path}: the program outlived its lease by {:.1} ms: {gone}",
        -lease_ms
    );
    lease_ms
}

/// Gracefully stops the node whose program runs now (SIGTERM: demote, then exit) and checks
/// that program was gone before its lease could expire.
fn shutdown_leader(nodes: &mut [RunNode], backend: &str) {
    let (i, token, _, _) = running_child(nodes).expect("a running program to shut down");
    nodes[i].terminate();
    let gone = nodes[i]
        .steps("child-gone")
        .into_iter()
        .rfind(|v| v["token"].as_i64() == Some(token))
        .expect("child-gone traced on shutdown");
    assert_gone_before_lease_expiry(&gone, &format!("{backend} shutdown"));
}

fn mono(v: &Value) -> u64 {
    v["mono_ns"].as_u64().unwrap()
}

/// The newest program that runs now (a `child-started` not followed by `child-gone`, on a node
/// not killed): (index, token, pid, started mono ns).
fn running_child(nodes: &[RunNode]) -> Option<(usize, i64, i32, u64)> {
    let running = nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.killed_gone_ns.is_none());
    running
        .filter_map(|(i, n)| {
            let steps = n.child_steps();
            let last = steps
                .iter()
                .rev()
                .find(|v| v["event"] == "child-started" || v["event"] == "child-gone")?;
            (last["event"] == "child-started").then(|| {
                (
                    i,
                    last["token"].as_i64().unwrap(),
                    detail(last, "pid").unwrap() as i32,
                    mono(last),
                )
            })
        })
        .max_by_key(|(_, token, _, _)| *token)
}

/// Waits for a running program on any node with a token above `above`, and for its first row.
/// On a loaded machine a term can end before its program writes (the watchdog demotes first):
/// then the wait goes on for the next term's program, never accepting a term without a row.
async fn wait_leader_child(pg: &Pg, nodes: &[RunNode], above: i64) -> (usize, i64, i32, u64) {
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        let found = loop {
            if let Some(f) = running_child(nodes).filter(|(_, t, _, _)| *t > above) {
                break f;
            }
            if Instant::now() > until {
                let logs: Vec<String> = nodes
                    .iter()
                    .map(|n| format!("== {}\n{}", n.id, log_tail(&n.log, 30)))
                    .collect();
                panic!(
                    "no program with a token above {above} within 90 s:\n{}",
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let token = found.1;
        loop {
            if pg.table_tokens().await.contains(&token) {
                return found;
            }
            // Still this program? Otherwise its term ended before it wrote: wait for the next.
            if running_child(nodes).map(|(_, t, p, _)| (t, p)) != Some((token, found.2)) {
                break;
            }
            assert!(Instant::now() < until, "no row under token {token}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Every program ever started ran on a leader: no two nodes' programs overlapped in time
/// (CLOCK_MONOTONIC is machine-wide), and tokens went up.
fn assert_no_overlap(nodes: &[RunNode]) {
    let mut spans: Vec<(u64, u64, i64, String)> = Vec::new();
    for n in nodes {
        let steps = n.child_steps();
        let mut open: Option<(u64, i64)> = None;
        for v in &steps {
            match v["event"].as_str() {
                Some("child-started") => open = Some((mono(v), v["token"].as_i64().unwrap())),
                Some("child-gone") => {
                    if let Some((s, t)) = open.take() {
                        spans.push((s, mono(v), t, n.id.clone()));
                    }
                }
                _ => {}
            }
        }
        if let Some((s, t)) = open {
            spans.push((s, n.killed_gone_ns.unwrap_or(u64::MAX), t, n.id.clone()));
        }
    }
    spans.sort();
    for w in spans.windows(2) {
        assert!(
            w[0].1 <= w[1].0 || w[0].3 == w[1].3,
            "programs overlapped: {:?} and {:?}",
            w[0],
            w[1]
        );
    }
}

/// The program's table never shows an older token after a newer one.
async fn assert_table_monotonic(pg: &Pg) {
    let tokens = pg.table_tokens().await;
    assert!(tokens.len() >= 2, "too few rows: {tokens:?}");
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "an older token after a newer one: {tokens:?}"
    );
}

async fn metric(client: &NodeClient, node: &RunNode, name: &str) -> Option<f64> {
    let r = client.get(&node.http, "/metrics").await.ok()?;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Kills the leader's baton with SIGKILL; returns (old token, ms until its whole group was gone,
/// ms from then to the new program's start, ms between the two terms' writes at the resource).
async fn kill9_handover(pg: &Pg, nodes: &mut [RunNode]) -> (i64, f64, f64, f64) {
    let (i, token, pgid, _) = wait_leader_child(pg, nodes, 0).await;
    let t_kill = monotonic_ns();
    nodes[i].kill9();
    let t_gone = wait_for("the old program's group to be gone", 10, || {
        (!live_member(pgid)).then(monotonic_ns)
    })
    .await;
    nodes[i].killed_gone_ns = Some(t_gone);
    let (_, new_token, _, t_start) = wait_leader_child(pg, nodes, token).await;
    assert!(
        t_start > t_gone,
        "the new program started before the old group was gone"
    );
    let resource_ms = pg.resource_gap_ms(token, new_token).await;
    assert!(
        resource_ms > 0.0,
        "resource clock: new term wrote before the old one's last write"
    );
    (
        token,
        (t_gone - t_kill) as f64 / 1e6,
        (t_start - t_gone) as f64 / 1e6,
        resource_ms,
    )
}

/// Graceful step-down of the leader: returns the gap (ms, CLOCK_MONOTONIC) between the old
/// program's `child-gone` and the new program's `child-started`, and at the resource.
async fn stepdown_handover(pg: &Pg, nodes: &[RunNode], client: &NodeClient) -> (f64, f64) {
    let (i, token, pgid, _) = wait_leader_child(pg, nodes, 0).await;
    let r = client
        .post(&nodes[i].http, "/stepdown")
        .await
        .expect("POST /stepdown");
    assert_eq!(
        r.status.as_u16(),
        200,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    // Step-down answers after release, so the group must already be gone.
    assert!(
        !live_member(pgid),
        "stepdown answered while the program's group lived"
    );
    let gone = nodes[i]
        .steps("child-gone")
        .last()
        .cloned()
        .expect("child-gone traced");
    assert_eq!(gone["token"].as_i64(), Some(token));
    assert_gone_before_lease_expiry(&gone, &format!("{} step-down", nodes[i].backend));
    let (_, new_token, _, t_start) = wait_leader_child(pg, nodes, token).await;
    assert!(
        t_start > mono(&gone),
        "new program started before the old one was gone"
    );
    let resource_ms = pg.resource_gap_ms(token, new_token).await;
    ((t_start - mono(&gone)) as f64 / 1e6, resource_ms)
}

fn python_child() -> Vec<&'static str> {
    vec!["python3", FENCED_CHILD]
}

/// The README's `baton run` line on a lease backend's own timing (3 s lease renewed every 800 ms)
/// with a 1 s stop timeout: the margin does not fit in that lease, so `baton run` derives one
/// that does and says so, and the program runs; told a lease with `--lease-ttl` that cannot hold
/// the margin, it refuses to start and names the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_run_derives_a_lease_that_fits_its_stop_margin_unless_told_one() {
    let pg = Pg::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = NodeConfig {
        node_id: "n1".into(),
        state_dir: dir.path().join("n1"),
        http_listen: format!("127.0.0.1:{}", free_ports(1).unwrap()[0])
            .parse()
            .unwrap(),
        ..NodeConfig::for_backend(BackendKind::PgLease)
    };
    c.resource.database_url = pg.server.app_url();
    c.pg_lease.database_url = pg.server.lease_url();
    std::fs::create_dir_all(&c.state_dir).unwrap();
    let path = dir.path().join("n1.toml");
    baton_lab::fleet::write_private(&path, toml::to_string(&c).unwrap()).unwrap();
    let cfg = (c, path);
    let t = Timing {
        stop_timeout_ms: 1000,
        child_stop_margin_ms: 1300,
        ..PG_LEASE
    };

    let told = Command::new(BATON)
        .args(["run", "--config"])
        .arg(&cfg.1)
        .args([
            "--lease-ttl",
            "3s",
            "--stop-timeout",
            "1s",
            "--child-stop-margin",
            "1300ms",
        ])
        .args(["--", "true"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&told.stderr).into_owned();
    assert!(
        !told.status.success(),
        "a lease that cannot hold the margin was accepted"
    );
    assert!(said.contains("lease_ttl_ms to at least"), "{said}");

    let mut node = start_logging(&cfg, t, &[], &python_child(), "info");
    let derived = wait_for("the derived lease logged", 30, || {
        let log = node.log_text();
        log.contains("lease derived from the stop margin")
            .then_some(log)
    })
    .await;
    assert!(derived.contains("was_ms=3000"), "{derived}");
    wait_for("the program running under a token", 60, || {
        (!node.steps("child-started").is_empty()).then_some(())
    })
    .await;
    node.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_lease_program_runs_only_on_the_leader_and_hands_over_after_it_is_gone() {
    let pg = Pg::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfgs = configs(&pg, dir.path(), BackendKind::PgLease, 2, PG_LEASE);
    let mut nodes: Vec<RunNode> = cfgs
        .iter()
        .map(|c| start(c, PG_LEASE, &[], &python_child()))
        .collect();
    let client = NodeClient::new(Duration::from_secs(3));

    let (i, token, pid, _) = wait_leader_child(&pg, &nodes, 0).await;
    // Only the leader has ever started it, and its /metrics names the pid.
    let other = 1 - i;
    assert!(
        nodes[other].steps("child-started").is_empty(),
        "a follower started the program"
    );
    assert_eq!(
        metric(&client, &nodes[i], "baton_child_pid").await,
        Some(f64::from(pid))
    );
    assert_eq!(
        metric(&client, &nodes[other], "baton_child_pid")
            .await
            .unwrap_or(0.0),
        0.0
    );

    let (step_gap_ms, step_res_ms) = stepdown_handover(&pg, &nodes, &client).await;
    let (_, dead_ms, kill_gap_ms, kill_res_ms) = kill9_handover(&pg, &mut nodes).await;
    eprintln!(
        "pg-lease: token {token}; step-down gap {step_gap_ms:.1} ms (resource {step_res_ms:.1} ms); \
         kill -9: old group gone {dead_ms:.1} ms after the kill, new program {kill_gap_ms:.1} ms later \
         (resource {kill_res_ms:.1} ms)"
    );
    assert!(dead_ms < 1000.0, "PDEATHSIG + sentinel took {dead_ms} ms");
    shutdown_leader(&mut nodes, "pg-lease");
    assert_no_overlap(&nodes);
    assert_table_monotonic(&pg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_program_hands_over_after_it_is_gone_on_stepdown_and_kill9() {
    handover_on(BackendKind::Raft, 3, RAFT).await;
}

/// A private election server for the backends that need one (etcd, Redis, ZooKeeper), stopped
/// with the test.
enum ElectionServer {
    /// raft and pg-lease: the nodes themselves, or the private PostgreSQL.
    None,
    Etcd(EtcdCluster),
    Redis(RedisServer),
    Zk(ZkEnsemble),
}

impl ElectionServer {
    async fn start(backend: BackendKind, root: PathBuf, ttl: Duration) -> ElectionServer {
        tokio::task::spawn_blocking(move || match backend {
            BackendKind::Etcd => ElectionServer::Etcd(
                EtcdCluster::start(&root, 1, 100, 1000).expect("a private etcd"),
            ),
            BackendKind::Redis => {
                let port = free_ports(1).unwrap()[0];
                ElectionServer::Redis(RedisServer::start(&root, port).expect("a private Redis"))
            }
            BackendKind::Zk => ElectionServer::Zk(
                ZkEnsemble::start(&root, 1, ZkEnsemble::tick_for_ttl(ttl))
                    .expect("a private ZooKeeper"),
            ),
            _ => ElectionServer::None,
        })
        .await
        .unwrap()
    }

    fn configure(&self, c: &mut NodeConfig) {
        match self {
            ElectionServer::Etcd(e) => c.etcd.endpoints = e.endpoints(),
            ElectionServer::Redis(r) => c.redis.url = r.url(),
            ElectionServer::Zk(z) => c.zk.connect = z.connect_string(),
            ElectionServer::None => {}
        }
    }
}

impl Drop for ElectionServer {
    fn drop(&mut self) {
        match self {
            ElectionServer::Etcd(e) => e.stop(),
            ElectionServer::Redis(r) => r.stop(),
            ElectionServer::Zk(z) => z.stop(),
            ElectionServer::None => {}
        }
    }
}

/// The handover order on a backend with its own server: the program runs only on the leader,
/// and after a step-down and after a kill -9 the new program starts only once the old group
/// is gone; the program's table never shows an older token after a newer one.
async fn handover_on(backend: BackendKind, n: usize, timing: Timing) {
    let pg = Pg::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ttl = Duration::from_millis(timing.lease_ttl_ms);
    let server = ElectionServer::start(backend, dir.path().join("election"), ttl).await;
    let cfgs = configs_with(&pg, dir.path(), backend, n, timing, &|c| {
        server.configure(c)
    });
    let mut nodes: Vec<RunNode> = cfgs
        .iter()
        .map(|c| start(c, timing, &[], &python_child()))
        .collect();
    let client = NodeClient::new(Duration::from_secs(3));
    // Only the leader runs it: any program another node started belongs to an earlier term
    // (one that ended before it wrote; `assert_no_overlap` below checks they never overlapped).
    let (i, token, _, _) = wait_leader_child(&pg, &nodes, 0).await;
    for (j, other) in nodes.iter().enumerate().filter(|(j, _)| *j != i) {
        for step in other.steps("child-started") {
            assert!(
                step["token"].as_i64().unwrap() < token,
                "{backend:?}: node {j} started the program under the leader's term {token}: {step}"
            );
        }
    }
    let (step_gap_ms, step_res_ms) = stepdown_handover(&pg, &nodes, &client).await;
    let (_, dead_ms, kill_gap_ms, kill_res_ms) = kill9_handover(&pg, &mut nodes).await;
    eprintln!(
        "{}: step-down gap {step_gap_ms:.1} ms (resource {step_res_ms:.1} ms); kill -9: old group \
         gone {dead_ms:.1} ms after the kill, new program {kill_gap_ms:.1} ms later (resource {kill_res_ms:.1} ms)",
        backend.as_str()
    );
    assert!(dead_ms < 1000.0, "PDEATHSIG + sentinel took {dead_ms} ms");
    shutdown_leader(&mut nodes, backend.as_str());
    assert_no_overlap(&nodes);
    assert_table_monotonic(&pg).await;
    drop(nodes);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_program_hands_over_after_it_is_gone() {
    handover_on(BackendKind::Etcd, 2, PG_LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_program_hands_over_after_it_is_gone() {
    handover_on(BackendKind::Redis, 2, PG_LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_program_hands_over_after_it_is_gone() {
    handover_on(BackendKind::Zk, 2, PG_LEASE).await;
}

/// A program that ignores SIGTERM and forks: on step-down it is SIGKILLed at the stop timeout,
/// and no process of its group is left when the step-down answers (the lease is released only
/// then). With `--on-exit demote`, a program that exits on its own gives up the term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stubborn_forking_program_is_killed_at_the_bound_and_leaves_nothing() {
    let pg = Pg::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfgs = configs(&pg, dir.path(), BackendKind::PgLease, 1, PG_LEASE);
    let script = "trap '' TERM; sleep 1000 & sleep 1000 & (sleep 1000 & wait) & wait";
    let nodes = vec![start(&cfgs[0], PG_LEASE, &[], &["sh", "-c", script])];
    let client = NodeClient::new(Duration::from_secs(5));
    let (_, token, pgid, _) = wait_for("the program", 60, || running_child(&nodes)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(live_member(pgid));
    let r = client
        .post(&nodes[0].http, "/stepdown")
        .await
        .expect("POST /stepdown");
    assert_eq!(
        r.status.as_u16(),
        200,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert!(
        !live_member(pgid),
        "a process of group {pgid} outlived the step-down"
    );
    let term = nodes[0]
        .steps("child-term-sent")
        .last()
        .cloned()
        .expect("SIGTERM traced");
    let kill = nodes[0]
        .steps("child-kill-sent")
        .last()
        .cloned()
        .expect("SIGKILL traced");
    let gone = nodes[0]
        .steps("child-gone")
        .last()
        .cloned()
        .expect("gone traced");
    assert_eq!(gone["token"].as_i64(), Some(token));
    let term_to_kill_ms = (mono(&kill) - mono(&term)) as f64 / 1e6;
    let kill_to_gone_ms = (mono(&gone) - mono(&kill)) as f64 / 1e6;
    eprintln!("stubborn program: SIGKILL {term_to_kill_ms:.1} ms after SIGTERM, group gone {kill_to_gone_ms:.1} ms later");
    assert!(term_to_kill_ms >= PG_LEASE.stop_timeout_ms as f64);
    assert!(term_to_kill_ms < PG_LEASE.stop_timeout_ms as f64 + 200.0);
}

/// `--on-exit restart`: a program that exits is restarted in the same term (same token), with
/// the restart counted; `--on-exit demote`: it gives up the term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exiting_program_is_restarted_or_demotes_by_policy() {
    let pg = Pg::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfgs = configs(&pg, dir.path(), BackendKind::PgLease, 2, PG_LEASE);
    let client = NodeClient::new(Duration::from_secs(3));
    let restart = start(
        &cfgs[0],
        PG_LEASE,
        &["--restart-backoff", "100ms", "--restart-max", "100"],
        &["sh", "-c", "echo run $BATON_TOKEN; sleep 0.3; exit 3"],
    );
    let nodes = vec![restart];
    wait_for("three starts", 60, || {
        (nodes[0].steps("child-started").len() >= 3).then_some(())
    })
    .await;
    let starts = nodes[0].steps("child-started");
    assert!(
        starts.iter().all(|v| v["token"] == starts[0]["token"]),
        "restarts changed the token"
    );
    assert!(nodes[0]
        .steps("child-exited")
        .iter()
        .any(|v| v["detail"].as_str().unwrap().contains("exit=3")));
    // The restarts back off exponentially from --restart-backoff (stretched by up to 20%).
    let waits: Vec<i64> = nodes[0]
        .steps("restart-scheduled")
        .iter()
        .filter_map(|v| detail(v, "backoff_ms"))
        .collect();
    assert!(waits.len() >= 2, "{waits:?}");
    for (k, w) in waits.iter().take(3).enumerate() {
        let want = 100i64 << k;
        assert!(
            (want..want * 6 / 5 + 1).contains(w),
            "restart {k}: waited {w} ms, not ~{want}: {waits:?}"
        );
    }
    // One restart counter, and it agrees with the trace: every start after the first in this
    // term was a restart (the counter moves just before the restart's start is traced).
    let starts_before = nodes[0].steps("child-started").len() as f64;
    let restarts = metric(&client, &nodes[0], "baton_work_restarts_total")
        .await
        .expect("baton_work_restarts_total");
    let starts_after = nodes[0].steps("child-started").len() as f64;
    assert!(
        (starts_before - 1.0..=starts_after).contains(&restarts),
        "baton_work_restarts_total = {restarts}, starts traced {starts_before}..{starts_after}"
    );
    assert_eq!(
        metric(&client, &nodes[0], "baton_child_restarts_total").await,
        None
    );
    // `baton run` runs no sequencer: POST /next says so, instead of 503 "retry" forever.
    let r = client
        .post(&nodes[0].http, "/next")
        .await
        .expect("POST /next");
    let body = String::from_utf8_lossy(&r.body);
    assert_eq!(r.status.as_u16(), 404, "{body}");
    assert!(body.contains("no_sequencer"), "{body}");
    // Its log is a file: plain text, no colour codes.
    assert!(
        nodes[0].log_text().contains("WARN") && !nodes[0].log_text().contains('\u{1b}'),
        "a WARN line, without ANSI codes:\n{}",
        nodes[0].log_text()
    );
    assert!(
        nodes[0]
            .log_text()
            .contains(&format!("run {}", starts[0]["token"])),
        "stdout passes through"
    );
    drop(nodes);

    let demote = start(
        &cfgs[1],
        PG_LEASE,
        &["--on-exit", "demote"],
        &["sh", "-c", "sleep 0.3; exit 4"],
    );
    let nodes = [demote];
    wait_for("two terms", 60, || {
        let s = nodes[0].steps("child-started");
        (s.len() >= 2 && s[0]["token"] != s[1]["token"]).then_some(())
    })
    .await;
}

/// A leader cut from its raft peers keeps believing it leads until its watchdog's deadline,
/// which `--child-stop-margin` moves earlier: the program (ignoring SIGTERM, so it is SIGKILLed
/// at the stop timeout) is gone before the deadline the node would otherwise have used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_stops_the_program_before_the_lease_deadline_by_the_margin() {
    let pg = Pg::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfgs = configs(&pg, dir.path(), BackendKind::Raft, 3, RAFT);
    let script = "trap '' TERM; sleep 1000 & wait";
    let nodes: Vec<RunNode> = cfgs
        .iter()
        .map(|c| start(c, RAFT, &[], &["sh", "-c", script]))
        .collect();
    let (i, token, pgid, _) = wait_for("the program", 60, || running_child(&nodes)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let isolate = baton::backends::raft::faults::isolate_peers_path(&cfgs[i].0.state_dir);
    std::fs::create_dir_all(isolate.parent().unwrap()).unwrap();
    std::fs::write(&isolate, b"").unwrap();
    let gone = wait_for("the program gone", 30, || {
        nodes[i]
            .steps("child-gone")
            .into_iter()
            .find(|v| v["token"].as_i64() == Some(token))
    })
    .await;
    assert!(!live_member(pgid));
    let _ = std::fs::remove_file(&isolate);
    // The watchdog fired at its deadline, which the margin moved earlier than the lease's
    // expiry: the program is gone after the one, and before the other.
    let before_lease_ms = assert_gone_before_lease_expiry(&gone, "raft watchdog");
    let after_watchdog_ms = -detail_f64(&gone, "before_watchdog_deadline_ms").unwrap();
    eprintln!(
        "watchdog: program gone {after_watchdog_ms:.0} ms after the watchdog deadline, \
         {before_lease_ms:.0} ms before the lease could expire (margin {} ms, stop timeout {} ms)",
        RAFT.child_stop_margin_ms, RAFT.stop_timeout_ms
    );
    assert!(
        after_watchdog_ms >= 0.0,
        "demoted before the watchdog's deadline?"
    );
    // Issue 43: the demotion is said at WARN, with the token, the holder and why.
    assert_warned(&nodes[i], token, &["reason=lease-deadline"]);
}

/// `node` logged a WARN naming term `token`, itself as the holder, and one of `why`.
fn assert_warned(node: &RunNode, token: i64, why: &[&str]) {
    let log = node.log_text();
    let (t, h) = (format!("token={token}"), format!("holder={}", node.id));
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains(&t)
            && l.contains(&h)
            && why.iter().any(|w| l.contains(w))),
        "{}: no WARN with {t} {h} and one of {why:?}:\n{log}",
        node.id
    );
}

/// The canonical split brain: the leader's whole "machine" (baton and its program's group) is
/// paused past its lease; the other node takes over and writes; on resume, the old program's
/// writes (the one in flight and its final checkpoint row, sent before baton's SIGTERM could stop
/// it) carry the old token and are refused and recorded by PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_leaders_program_is_stopped_and_its_late_write_fenced() {
    let pg = Pg::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfgs = configs(&pg, dir.path(), BackendKind::PgLease, 2, PG_LEASE_SLOW_STOP);
    let nodes: Vec<RunNode> = cfgs
        .iter()
        .map(|c| start(c, PG_LEASE_SLOW_STOP, &[], &python_child()))
        .collect();
    let (i, token, pgid, _) = wait_leader_child(&pg, &nodes, 0).await;
    // SAFETY: signals to processes this test started (baton) and their group (its program).
    unsafe {
        libc::kill(nodes[i].pid(), libc::SIGSTOP);
        libc::kill(-pgid, libc::SIGSTOP);
    }
    let (_, newer, _, _) = wait_leader_child(&pg, &nodes, token).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // SAFETY: as above. The program first: it races its own node's SIGTERM, as it would.
    unsafe {
        libc::kill(-pgid, libc::SIGCONT);
        libc::kill(nodes[i].pid(), libc::SIGCONT);
    }
    let gone = wait_for("the stale program gone", 30, || {
        nodes[i]
            .steps("child-gone")
            .into_iter()
            .find(|v| v["token"].as_i64() == Some(token))
    })
    .await;
    // Paused past its lease, the program cannot have been gone in time: that is the case the
    // fence is for, and the trace says so with a negative figure.
    let late_ms = -detail_f64(&gone, "before_lease_expiry_ms").expect("lease expiry traced");
    eprintln!(
        "lease margin, pg-lease pause: program gone {late_ms:.1} ms after the lease could expire"
    );
    assert!(
        late_ms > 0.0,
        "a paused node's program cannot beat its lease: {gone}"
    );
    let q = format!(
        "SELECT max_token FROM baton.fence_rejections WHERE op = 'user' AND token = {token} AND holder = '{}'",
        nodes[i].id
    );
    let rows = pg.sql(&q).await;
    assert!(
        !rows.is_empty(),
        "the stale write was not recorded:\n{}",
        nodes[i].log_text()
    );
    let max_token: i64 = rows[0].get(0);
    assert!(max_token >= newer);
    assert!(nodes[i]
        .log_text()
        .contains(&format!("token {token} refused by the fence")));
    // Issue 43: the resumed node says at WARN that its term was taken (the watchdog's deadline
    // passed while it was paused, or the backend says the lease is gone), and its trace says
    // what happened: the program stopped at its SIGTERM, no `kill` of a work that had stopped.
    assert_warned(
        &nodes[i],
        token,
        &["reason=lease-deadline", "reason=lease-lost"],
    );
    let kills: Vec<Value> = nodes[i]
        .steps("kill")
        .into_iter()
        .filter(|v| v["token"].as_i64() == Some(token))
        .collect();
    assert!(kills.is_empty(), "killed after its checkpoint: {kills:?}");
    eprintln!(
        "paused: stale token {token} refused at max_token {max_token} ({} rejection(s))",
        rows.len()
    );
    assert_table_monotonic(&pg).await;
}

/// Starts of `node`'s program (`child-started`), CLOCK_MONOTONIC ns, and their tokens.
fn starts(node: &RunNode) -> Vec<(u64, i64)> {
    node.steps("child-started")
        .iter()
        .map(|v| (mono(v), v["token"].as_i64().unwrap()))
        .collect()
}

/// A program that fails at once, with `--on-exit demote`, on a node alone: every term fails,
/// and the node waits `base x 2^(k-1)` (capped, stretched by up to 20%) before its next
/// campaign, logging each failure at WARN with the program's exit and counting it. Then the
/// same program for the same while with the backoff off and with the defaults: the terms
/// burned, before and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_terms_back_off_exponentially_and_say_why() {
    let pg = Pg::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (base_ms, max_ms) = (300u64, 1200u64);
    let cfgs = configs_with(&pg, dir.path(), BackendKind::PgLease, 3, PG_LEASE, &|c| {
        // One node's patience alone: the fleet's budget would stop these nodes after 5 terms.
        c.failure_budget.failed_terms = 0;
        match c.node_id.as_str() {
            "n1" => (c.term_backoff.base_ms, c.term_backoff.max_ms) = (base_ms, max_ms),
            "n2" => c.term_backoff.base_ms = 0, // off: the behaviour before the backoff
            _ => {}                             // n3: the defaults
        }
    });
    let failing = ["sh", "-c", "sleep 0.05; exit 3"];
    let client = NodeClient::new(Duration::from_secs(3));
    let nodes = vec![start(
        &cfgs[0],
        PG_LEASE,
        &["--on-exit", "demote"],
        &failing,
    )];
    wait_for("six terms", 60, || {
        (starts(&nodes[0]).len() >= 6).then_some(())
    })
    .await;
    let s = starts(&nodes[0]);
    assert!(
        s.windows(2).all(|w| w[0].1 < w[1].1),
        "a new term each time: {s:?}"
    );
    for (k, w) in s.windows(2).enumerate() {
        let gap_ms = (w[1].0 - w[0].0) as f64 / 1e6;
        let pause_ms = (base_ms << k).min(max_ms) as f64;
        eprintln!(
            "failed term {}: next start {gap_ms:.0} ms later (pause {pause_ms} ms + up to 20%)",
            k + 1
        );
        assert!(
            gap_ms >= pause_ms,
            "term {}: campaigned again after {gap_ms} ms, before its {pause_ms} ms pause",
            k + 1
        );
        // The cap holds: the pause, its jitter, and one election and start on a loaded machine.
        assert!(
            gap_ms < pause_ms * 1.2 + 2500.0,
            "term {}: {gap_ms} ms",
            k + 1
        );
    }
    let failed = metric(&client, &nodes[0], "baton_failed_terms_total").await;
    assert!(
        failed.is_some_and(|n| n >= 5.0),
        "baton_failed_terms_total = {failed:?}"
    );
    let log = nodes[0].log_text();
    let warns: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("leader work failed and ended the term"))
        .collect();
    assert!(warns.len() >= 5, "{log}");
    assert!(
        warns.iter().all(|l| l.contains("exit=3")),
        "the WARN names the program's exit:\n{log}"
    );
    drop(nodes);

    // Terms burned in the same time, without the backoff and with its defaults (1 s, doubling).
    let mut burned = Vec::new();
    for cfg in &cfgs[1..] {
        let node = start(cfg, PG_LEASE, &["--on-exit", "demote"], &failing);
        wait_for("the first term", 60, || {
            (!starts(&node).is_empty()).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(8)).await;
        burned.push(starts(&node).len());
    }
    eprintln!(
        "failing program, one node, 8 s: {} terms with the backoff off, {} with the defaults ({:.0} vs {:.0} per minute)",
        burned[0],
        burned[1],
        burned[0] as f64 * 7.5,
        burned[1] as f64 * 7.5
    );
    assert!(
        burned[1] <= 5,
        "defaults: 1 + 2 + 4 s of pauses fit in 8 s, not {}",
        burned[1]
    );
    assert!(
        burned[0] > 2 * burned[1],
        "off: {} terms, defaults: {}",
        burned[0],
        burned[1]
    );
}

/// Every program start of the fleet (`child-started`: CLOCK_MONOTONIC ns, token), in time order.
fn fleet_starts(nodes: &[RunNode]) -> Vec<(u64, i64)> {
    let mut all: Vec<(u64, i64)> = nodes.iter().flat_map(starts).collect();
    all.sort();
    all
}

/// Every term the fleet won (the supervisor's `elected`), CLOCK_MONOTONIC ns: the tokens burned,
/// with or without a program run.
fn fleet_terms(nodes: &[RunNode]) -> Vec<u64> {
    let mut all: Vec<u64> = nodes
        .iter()
        .flat_map(|n| n.actor_steps("supervisor"))
        .filter(|v| v["event"] == "elected")
        .map(|v| mono(&v))
        .collect();
    all.sort();
    all
}

/// Starts `cfgs` running `failing` (`--on-exit demote`), waits `span` from the first program
/// start; returns the nodes and (program runs, terms won) within that span.
async fn burn(cfgs: &[(NodeConfig, PathBuf)], span: Duration) -> (Vec<RunNode>, usize, usize) {
    let failing = ["sh", "-c", "exit 3"];
    let nodes: Vec<RunNode> = cfgs
        .iter()
        .map(|c| start(c, PG_LEASE, &["--on-exit", "demote"], &failing))
        .collect();
    let first = wait_for("the first program start", 60, || {
        fleet_starts(&nodes).first().map(|s| s.0)
    })
    .await;
    let end = first + span.as_nanos() as u64;
    tokio::time::sleep(Duration::from_nanos(end.saturating_sub(monotonic_ns()))).await;
    let runs = fleet_starts(&nodes).iter().filter(|s| s.0 <= end).count();
    let terms = fleet_terms(&nodes)
        .iter()
        .filter(|&&t| t + 1_000_000_000 >= first && t <= end)
        .count();
    (nodes, runs, terms)
}

/// The fleet-wide failure budget, with `baton run`: three pg-lease nodes whose program exits 3
/// at once. With the budget's defaults (5 failed terms in 10 minutes) the fleet runs the program
/// 5 times, then no node campaigns for it: each node's `/status` and
/// `baton_failure_budget_exhausted` say so, each logs one WARN with the program's exit, and the
/// resource counts 5 failed terms. `baton budget reset` lets the fleet campaign again. Then the
/// same fleet with the budget off for the same 30 s: the terms burned before and after (printed,
/// FINDINGS 12.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_whose_program_keeps_failing_stops_at_its_failure_budget() {
    let pg = Pg::start().await;
    let dir = tempfile::tempdir().unwrap();
    let span = Duration::from_secs(30);
    let fleet = |name: &str, set: &dyn Fn(&mut NodeConfig)| {
        configs_with(
            &pg,
            &dir.path().join(name),
            BackendKind::PgLease,
            3,
            PG_LEASE,
            set,
        )
    };
    // The defaults, but a reset is seen within a second.
    let on = fleet("on", &|c| c.failure_budget.recheck_ms = 1000);
    let limit = on[0].0.failure_budget.failed_terms as usize;
    assert_eq!(limit, 5, "the default");
    let client = NodeClient::new(Duration::from_secs(3));
    let (nodes, runs_on, terms_on) = burn(&on, span).await;
    let all = fleet_starts(&nodes);
    assert_eq!(
        runs_on, limit,
        "program runs in {span:?} with a budget of {limit}: {all:?}"
    );
    assert_eq!(all.len(), limit, "runs after the span: {all:?}");
    assert!(all.windows(2).all(|w| w[0].1 < w[1].1), "{all:?}");
    let spent_after_s = (all[limit - 1].0 - all[0].0) as f64 / 1e9;
    let recorded = pg.sql("SELECT count(*) FROM baton.failed_terms").await[0].get::<_, i64>(0);
    assert_eq!(recorded, limit as i64, "failed terms in the resource");
    for n in &nodes {
        let r = client.get(&n.http, "/status").await.expect("GET /status");
        let st: Value = serde_json::from_slice(&r.body).unwrap();
        let b = &st["failure_budget"];
        assert_eq!(b["exhausted"], true, "{}: {st}", n.id);
        // Issue 43: not "candidate": the budget keeps it from campaigning.
        assert_eq!(st["role"], "budget_blocked", "{}: {st}", n.id);
        assert_eq!(b["failed_terms"], limit, "{}: {st}", n.id);
        assert_eq!(b["window_ms"], 600_000, "{}: {st}", n.id);
        let left = b["reopens_in_ms"].as_u64().unwrap_or(0);
        assert!(left > 0 && left <= 600_000, "{}: {st}", n.id);
        assert!(
            b["last_failure"]
                .as_str()
                .is_some_and(|l| l.contains("exit=3")),
            "{}: {st}",
            n.id
        );
        assert_eq!(
            metric(&client, n, "baton_failure_budget_exhausted").await,
            Some(1.0),
            "{}",
            n.id
        );
        let log = n.log_text();
        let warns: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("failure budget is spent"))
            .collect();
        assert_eq!(warns.len(), 1, "{}: one WARN per exhaustion:\n{log}", n.id);
        assert!(warns[0].contains("exit=3"), "{}: {}", n.id, warns[0]);
    }

    // The operator's reset: the fleet campaigns again (and runs the program again).
    let out = common::baton(&["budget", "reset", "--admin-url", &pg.server.admin_url()]);
    assert!(out.contains(&format!("{limit} failed term(s)")), "{out}");
    wait_for("a program start after the reset", 30, || {
        (fleet_starts(&nodes).len() > limit).then_some(())
    })
    .await;
    drop(nodes);

    // Before: the same fleet, the budget off.
    let off = fleet("off", &|c| c.failure_budget.failed_terms = 0);
    let (nodes, runs_off, terms_off) = burn(&off, span).await;
    drop(nodes);
    let per_minute = 60.0 / span.as_secs_f64();
    eprintln!(
        "failing program (exit 3 at once), 3 pg-lease nodes, default [term_backoff], {}s from the first run: \
         budget off: {runs_off} runs, {terms_off} terms won ({:.0} / {:.0} a minute); \
         budget on (5 in 10 min): {runs_on} runs, {terms_on} terms won ({:.0} / {:.0} a minute; \
         the last run {spent_after_s:.1} s after the first, then none)",
        span.as_secs(),
        runs_off as f64 * per_minute,
        terms_off as f64 * per_minute,
        runs_on as f64 * per_minute,
        terms_on as f64 * per_minute,
    );
    assert!(
        runs_off > 2 * limit,
        "without the budget the fleet keeps burning terms: {runs_off} runs"
    );
}

/// A node's `/status`, `None` when it does not answer.
async fn status(client: &NodeClient, node: &RunNode) -> Option<Value> {
    let r = client.get(&node.http, "/status").await.ok()?;
    serde_json::from_slice(&r.body).ok()
}

/// The page at `url` as headless Chromium renders it after a few of its polls (`GET /ui`).
fn dump_dom(url: &str) -> String {
    const CHROMIUM: &str = "/usr/bin/chromium";
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: run scripts/ensure-deps.sh"
    );
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(CHROMIUM)
        .args(["--headless", "--disable-gpu", "--no-sandbox"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(["--dump-dom", "--virtual-time-budget=3000"])
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("run chromium");
    assert!(out.status.success(), "chromium --dump-dom {url} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Issue 43: a program that always fails, under the shipped defaults (`baton run`'s default
/// `--on-exit restart` policy, the default `[term_backoff]` and `[failure_budget]`: 5 failed
/// terms in 10 minutes), on three raft nodes: the fleet spends its budget in under 30 s from the
/// program's first start, and every node says so: one WARN each with the program's exit,
/// `/status` role `budget_blocked`, and the fleet page (`/ui`) shows the spent budget and every
/// member blocked. Before: 5 in-term restarts from 1 s (1+2+4+8+16 s) made each failed term
/// ~34 s, 3.5 minutes in all; and only the nodes whose campaigns won said it (a raft follower's
/// campaign waits until its node leads the raft group, and read nothing meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_program_spends_the_budget_in_under_30s_and_every_node_says_so() {
    let pg = Pg::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfgs = configs(&pg, dir.path(), BackendKind::Raft, 3, RAFT);
    let shipped = NodeConfig::default();
    let limit = shipped.failure_budget.failed_terms as usize;
    assert_eq!(limit, 5, "the default budget");
    for (c, _) in &cfgs {
        assert_eq!(
            (c.failure_budget.failed_terms, c.failure_budget.window_ms),
            (5, 600_000)
        );
        assert_eq!(
            c.failure_budget.recheck_ms,
            shipped.failure_budget.recheck_ms
        );
        assert_eq!(c.term_backoff.base_ms, shipped.term_backoff.base_ms);
    }
    let client = NodeClient::new(Duration::from_secs(3));
    let nodes: Vec<RunNode> = cfgs
        .iter()
        .map(|c| start(c, RAFT, &[], &["sh", "-c", "exit 3"]))
        .collect();
    let first = wait_for("the first program start", 60, || {
        fleet_starts(&nodes).first().map(|s| s.0)
    })
    .await;
    let warned = |n: &RunNode| {
        n.log_text()
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("failure budget is spent"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    // Up to 5 minutes, so that a slow fleet is measured rather than cut off.
    let until = Instant::now() + Duration::from_secs(300);
    let mut spent_at = None;
    let said_at = loop {
        if spent_at.is_none() {
            let n = pg.sql("SELECT count(*) FROM baton.failed_terms").await[0].get::<_, i64>(0);
            if n >= limit as i64 {
                spent_at = Some(monotonic_ns());
            }
        }
        let mut not_said = Vec::new();
        for n in &nodes {
            let spent = status(&client, n)
                .await
                .is_some_and(|st| st["failure_budget"]["exhausted"] == true);
            if !spent || warned(n).is_empty() {
                not_said.push(n.id.clone());
            }
        }
        if not_said.is_empty() {
            break monotonic_ns();
        }
        let secs = |at: u64| (at - first) as f64 / 1e9;
        assert!(
            Instant::now() < until,
            "300 s after the program's first start, {not_said:?} had not said the budget is spent \
             (the resource counted {limit} failed terms {})",
            spent_at.map_or("never".into(), |at| format!("{:.1} s after it", secs(at)))
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let secs = |at: u64| (at - first) as f64 / 1e9;
    let spent_s = spent_at.map_or(f64::NAN, secs);
    let said_s = secs(said_at);
    let runs = fleet_starts(&nodes).len();
    eprintln!(
        "always-failing program, 3 raft nodes, shipped defaults: budget ({limit} failed terms) \
         spent {spent_s:.1} s after the first start ({runs} program runs), said by every node \
         {said_s:.1} s after it"
    );
    assert!(
        said_s < 30.0,
        "the budget was spent and said on every node {said_s:.1} s after the program's first \
         start (spent after {spent_s:.1} s), not under 30 s"
    );
    let recorded = pg.sql("SELECT count(*) FROM baton.failed_terms").await[0].get::<_, i64>(0);
    assert_eq!(recorded, limit as i64, "failed terms in the resource");
    for n in &nodes {
        let warns = warned(n);
        assert_eq!(
            warns.len(),
            1,
            "{}: one WARN per exhaustion: {warns:?}",
            n.id
        );
        assert!(warns[0].contains("exit=3"), "{}: {}", n.id, warns[0]);
        let st = status(&client, n).await.expect("GET /status");
        assert_eq!(st["role"], "budget_blocked", "{}: {st}", n.id);
        assert_eq!(st["fence_token"], Value::Null, "{}: {st}", n.id);
    }
    // The fleet page says it: the spent budget, and every member blocked.
    let dom = dump_dom(&format!("http://{}/ui", nodes[0].http));
    assert!(dom.contains("data-budget=\"spent\""), "{dom}");
    assert!(dom.contains("failure budget spent"), "{dom}");
    for n in &nodes {
        let row = dom
            .match_indices(&format!("data-member=\"{}\"", n.id))
            .map(|(i, _)| &dom[dom[..i].rfind('<').unwrap()..i + dom[i..].find('>').unwrap()])
            .next()
            .unwrap_or_else(|| panic!("no row of {}: {dom}", n.id));
        assert!(row.contains("data-role=\"budget_blocked\""), "{row}");
    }
}

/// `baton run` with the deploy unit's stop timing (`--stop-timeout 5s --child-stop-margin
/// 5250ms`) on raft: a lease and election timeout long enough to hold them.
const RAFT_DEPLOY_STOP: Timing = Timing {
    lease_ttl_ms: 8000,
    renew_interval_ms: 200,
    retry_interval_ms: 100,
    stop_timeout_ms: 5000,
    child_stop_margin_ms: 5250,
    election_timeout: "8000-16000",
};

/// Issue 43: the whole fleet stopped at once (SIGTERM to all three `baton run` nodes, as a
/// `systemctl stop` on every host would), the deploy unit's `--stop-timeout 5s`: every node
/// exits within that stop timeout, and the leader's log says what it waits for. Before: the
/// leader's release handed raft leadership to a follower that was stopping too and waited for
/// its election (twice the election timeout's maximum), until the node's own shutdown bound
/// (3 x the work stop timeout + 2 s = 20 s), with no log line in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_whole_fleet_at_once_ends_every_node_within_its_stop_timeout() {
    let pg = Pg::start().await;
    let dir = tempfile::tempdir().unwrap();
    let t = RAFT_DEPLOY_STOP;
    let cfgs = configs(&pg, dir.path(), BackendKind::Raft, 3, t);
    let mut nodes: Vec<RunNode> = cfgs
        .iter()
        .map(|c| {
            start_logging(
                c,
                t,
                &[],
                &["sh", "-c", "exec sleep 1000"],
                "info,openraft=warn",
            )
        })
        .collect();
    let (leader, token, pgid, _) = wait_for("the program", 90, || running_child(&nodes)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = Instant::now();
    for n in &nodes {
        // SAFETY: a signal to a process this test started.
        unsafe { libc::kill(n.pid(), libc::SIGTERM) };
    }
    let mut exited: Vec<Option<Duration>> = vec![None; nodes.len()];
    while exited.iter().any(Option::is_none) && sent.elapsed() < Duration::from_secs(40) {
        for (i, n) in nodes.iter_mut().enumerate() {
            if exited[i].is_none() {
                if let Some(Ok(Some(_))) = n.proc.as_mut().map(|p| p.try_wait()) {
                    exited[i] = Some(sent.elapsed());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs: Vec<String> = exited
        .iter()
        .map(|e| {
            e.map_or("still running after 40 s".into(), |d| {
                format!("{:.2} s", d.as_secs_f64())
            })
        })
        .collect();
    eprintln!(
        "whole fleet stopped at once (stop timeout {} ms): leader {} exited after {}, all: {secs:?}",
        t.stop_timeout_ms, nodes[leader].id, secs[leader]
    );
    assert!(!live_member(pgid), "the leader's program outlived its node");
    let log = nodes[leader].log_text();
    for (i, e) in exited.iter().enumerate() {
        assert!(
            e.is_some_and(|d| d < Duration::from_millis(t.stop_timeout_ms)),
            "{} (leader: {}) exited after {}, not within its {} ms stop timeout:\n{}",
            nodes[i].id,
            i == leader,
            secs[i],
            t.stop_timeout_ms,
            nodes[i].log_text()
        );
    }
    // What it waited for, said as it waited: the demotion with its bound, the release with
    // its bound.
    for said in ["shutting down:", "releasing the lease"] {
        assert!(
            log.lines()
                .any(|l| l.contains(said) && l.contains("bound_ms=")),
            "{}: no line saying {said:?} with its bound:\n{log}",
            nodes[leader].id
        );
    }
    assert!(
        log.lines()
            .any(|l| l.contains("demoting") && l.contains(&format!("token={token}"))),
        "{log}"
    );
}
