//! Test harness: a real local fleet (private PostgreSQL + 3-member etcd + N `baton node`
//! processes) started through the `baton` binary in a temp dir, and torn down on drop.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use baton_lab::fleet::client::NodeClient;
use baton_lab::fleet::{FleetNode, FleetState};
use tokio_postgres::NoTls;

pub const BATON: &str = env!("CARGO_BIN_EXE_baton");

pub struct Fleet {
    pub dir: tempfile::TempDir,
    pub client: NodeClient,
}

pub fn baton(args: &[&str]) -> String {
    let out = Command::new(BATON)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run baton");
    assert!(
        out.status.success(),
        "baton {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What is left of a deadline, but at least 200 ms: enough for one more look at the fleet.
fn time_left(until: Instant) -> Duration {
    until
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(200))
}

impl Fleet {
    /// `baton fleet up N --backend etcd` in a fresh temp dir, plus `extra` flags.
    pub fn up(nodes: usize, extra: &[&str]) -> Fleet {
        Fleet::up_with("etcd", nodes, extra)
    }

    /// `baton fleet up N --backend BACKEND` in a fresh temp dir, plus `extra` flags.
    pub fn up_with(backend: &str, nodes: usize, extra: &[&str]) -> Fleet {
        let dir = tempfile::Builder::new()
            .prefix("baton-test-")
            .tempdir()
            .expect("tempdir");
        let n = nodes.to_string();
        let dir_arg = dir.path().to_str().unwrap().to_owned();
        let mut args = vec![
            "fleet",
            "up",
            n.as_str(),
            "--backend",
            backend,
            "--dir",
            dir_arg.as_str(),
        ];
        args.extend_from_slice(extra);
        let mut fleet = Fleet {
            dir,
            client: NodeClient::new(Duration::from_secs(3)),
        };
        let out = Command::new(BATON)
            .args(&args)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run baton fleet up");
        if !out.status.success() {
            let _ = Command::new(BATON)
                .args(["fleet", "down", "--dir", fleet.path().to_str().unwrap()])
                .output();
            panic!(
                "fleet up failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        fleet.client = fleet.state().admin_client(Duration::from_secs(3));
        fleet
    }

    /// Like [`Fleet::up_with`], with `config` (a whole TOML text) as every node's base config,
    /// written into the fleet's own temp dir.
    pub fn up_with_config(backend: &str, nodes: usize, config: &str) -> Fleet {
        Fleet::up_with_config_and(backend, nodes, config, &[])
    }

    /// [`Fleet::up_with_config`] with more `fleet up` arguments (`--netns`).
    pub fn up_with_config_and(backend: &str, nodes: usize, config: &str, extra: &[&str]) -> Fleet {
        let cfg_dir = tempfile::tempdir().expect("tempdir");
        let path = cfg_dir.path().join(format!("{backend}.toml"));
        std::fs::write(&path, config).expect("write config");
        let mut args = vec!["--config", path.to_str().unwrap()];
        args.extend_from_slice(extra);
        Fleet::up_with(backend, nodes, &args)
    }

    /// A raft fleet on config/raft.toml at twice its timing. Tests run debug builds beside the
    /// rest of the suite on 2 cores, where a scheduling stall of 50-100 ms is common; with the
    /// default 150 ms grant that stall costs a term now and then, which is the lease doing its job
    /// but reads as a failed check in a test about something else. Safety holds at any timing;
    /// the shipped defaults keep their own test (`raft_fleet::one_leader_among_three_with_raft_as_
    /// the_default_backend`) and their false-failover rate is measured in release builds
    /// (`scripts/bench/perf.sh starve`).
    pub fn raft_at_twice_the_timing(nodes: usize) -> Fleet {
        Fleet::raft_at_twice_the_timing_and(nodes, &[])
    }

    /// [`Fleet::raft_at_twice_the_timing`] with more `fleet up` arguments (`--netns`).
    pub fn raft_at_twice_the_timing_and(nodes: usize, extra: &[&str]) -> Fleet {
        let config = config_with(
            "raft",
            &[
                ("election_timeout_ms", "\"300-500\""),
                ("lease_ttl_ms", "300"),
                ("renew_interval_ms", "80"),
                ("retry_interval_ms", "40"),
                ("heartbeat_interval_ms", "100"),
            ],
        );
        Fleet::up_with_config_and("raft", nodes, &config, extra)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn state(&self) -> FleetState {
        FleetState::load(self.path()).expect("fleet state")
    }

    pub fn node(&self, id: &str) -> FleetNode {
        self.state().node(id).expect("node").clone()
    }

    pub fn kill9(&self, id: &str) {
        baton(&["fleet", "kill", id, "--dir", self.path().to_str().unwrap()]);
    }

    pub fn start(&self, id: &str) {
        baton(&["fleet", "start", id, "--dir", self.path().to_str().unwrap()]);
    }

    /// The node that says it leads, once every live node agrees on it; `(id, addr, token)`.
    pub async fn leader(&self, within: Duration) -> (String, String, i64) {
        let until = Instant::now() + within;
        loop {
            let rows = baton_lab::fleet::status(&self.state()).await;
            let leaders: Vec<_> = rows
                .iter()
                .filter(|r| r.role.as_deref() == Some("leader"))
                .collect();
            if leaders.len() == 1 {
                let l = leaders[0];
                let agreed = rows
                    .iter()
                    .filter(|r| r.alive)
                    .all(|r| r.leader.as_deref() == Some(l.id.as_str()));
                if agreed {
                    return (
                        l.id.clone(),
                        l.http_addr.clone(),
                        l.token.expect("leader has a token"),
                    );
                }
            }
            assert!(
                Instant::now() < until,
                "no agreed leader within {within:?}: {rows:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `POST path` at the leader `addr`, retried for up to 10 s while it answers `503`
    /// ([`post_when_ready`]).
    pub async fn post_at_leader(&self, addr: &str, path: &str) -> baton_lab::fleet::client::Reply {
        post_when_ready(&self.client, addr, path, Duration::from_secs(10)).await
    }

    /// Like [`Fleet::leader`], but only once the same leader has held the same term for `hold`:
    /// for tests whose subject is a settled fleet, not its first second (a raft leader elected
    /// while its peers are still starting can miss its first renewal on a loaded machine and
    /// hand over, which is the lease doing its job, not a second leader).
    pub async fn settled_leader(&self, within: Duration, hold: Duration) -> (String, String, i64) {
        let until = Instant::now() + within;
        let mut seen = self.leader(within).await;
        loop {
            tokio::time::sleep(hold).await;
            let now = self.leader(time_left(until)).await;
            if (now.0.as_str(), now.2) == (seen.0.as_str(), seen.2) {
                return now;
            }
            if Instant::now() >= until {
                panic!(
                    "leadership did not settle within {within:?}: last {seen:?} then {now:?}\n{}",
                    self.log_tails(40)
                );
            }
            seen = now;
        }
    }

    /// Like [`Fleet::leader`] but for a leader other than `not`, with a higher token than `above`.
    pub async fn new_leader(
        &self,
        not: &str,
        above: i64,
        within: Duration,
    ) -> (String, String, i64) {
        let until = Instant::now() + within;
        loop {
            let (id, addr, token) = self.leader(time_left(until)).await;
            if id != not && token > above {
                return (id, addr, token);
            }
            if Instant::now() >= until {
                let rows = baton_lab::fleet::status(&self.state()).await;
                panic!(
                    "no new leader (other than {not}, token > {above}) within {within:?}: \
                     {rows:?}\n{}",
                    self.log_tails(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last `lines` lines of every node's log, for a failure message.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for n in &self.state().nodes {
            let tail = baton_lab::fleet::servers::log_tail(&n.log, lines);
            out.push_str(&format!("--- {} ({}) ---\n{tail}\n", n.id, n.log.display()));
        }
        out
    }

    /// Superuser connection to the fenced resource.
    pub async fn admin_db(&self) -> tokio_postgres::Client {
        connect(&self.state().postgres.admin_url()).await
    }

    /// Connection as the shared application role (a fleet's resource refuses it: only per-node
    /// roles write there).
    pub async fn app_db(&self) -> tokio_postgres::Client {
        connect(&self.state().postgres.app_url()).await
    }

    /// Connection as node `id`'s own role: its credentials, which write only as holder `id`.
    pub async fn node_db(&self, id: &str) -> tokio_postgres::Client {
        let role = baton::work::fence::node_role(id);
        connect(&self.state().postgres.url_as(&role, "127.0.0.1")).await
    }
}

/// A node on pg-lease with `pg` as both its lease store and its fenced resource, and none of the
/// built-in works: for library tests of closure jobs (its state dir created beside `pg`).
pub fn job_node_config(
    pg: &baton_lab::fleet::servers::ScratchPg,
    node_id: &str,
) -> baton::config::NodeConfig {
    let mut cfg = baton::config::NodeConfig {
        node_id: node_id.into(),
        state_dir: pg.dir.path().join(node_id),
        ..baton::config::NodeConfig::for_backend(baton::backends::BackendKind::PgLease)
    };
    cfg.sequencer.enabled = false;
    cfg.scheduler.enabled = false;
    cfg.resource.database_url = pg.server.app_url();
    cfg.pg_lease.database_url = pg.server.lease_url();
    std::fs::create_dir_all(&cfg.state_dir).unwrap();
    cfg
}

pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to the private PostgreSQL");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_trace_tails(40);
        }
        let _ = Command::new(BATON)
            .args(["fleet", "down", "--dir", self.path().to_str().unwrap()])
            .output();
    }
}

impl Fleet {
    /// The lease time left that a healthy leader reports is the deadline its watchdog enforces:
    /// within (0, TTL] on every read, also after renewals moved it (reads ~130 ms apart, across
    /// several renew intervals). It once read 0 on every read of a healthy raft leader, because
    /// the status copy of the deadline was set at election and never moved by renewals.
    pub async fn assert_lease_left_within_ttl(&self, leader_addr: &str) {
        let ttl_ms = baton::config::NodeConfig::from_file(&self.state().nodes[0].config)
            .expect("node config")
            .lease_ttl_ms;
        for _ in 0..8 {
            let reply = self
                .client
                .get(leader_addr, "/status")
                .await
                .expect("/status");
            let status: serde_json::Value = serde_json::from_slice(&reply.body).expect("json");
            assert_eq!(status["role"], "leader", "{status}");
            let left = status["lease_ttl_remaining_ms"]
                .as_u64()
                .unwrap_or_else(|| panic!("a leader reports its lease time left: {status}"));
            assert!(
                left > 0 && left <= ttl_ms,
                "lease_ttl_remaining_ms {left} outside (0, {ttl_ms}]: {status}"
            );
            tokio::time::sleep(Duration::from_millis(130)).await;
        }
    }
}

impl Fleet {
    /// The last `n` actor-trace steps of every node, for a failed test's output (the fleet's
    /// temp dir is gone afterwards).
    fn print_trace_tails(&self, n: usize) {
        let Ok(state) = FleetState::load(self.path()) else {
            return;
        };
        for node in &state.nodes {
            let trace = node.log.with_file_name("actor-trace.jsonl");
            let text = std::fs::read_to_string(&trace).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!(
                "--- {} actor trace, last {n} steps ({}):",
                node.id,
                trace.display()
            );
            for l in &lines[lines.len().saturating_sub(n)..] {
                eprintln!("{l}");
            }
            // A node that never reached its first step (exited, or stuck connecting) says why
            // only in its log.
            let log = baton_lab::fleet::servers::log_tail(&node.log, n);
            eprintln!("--- {} log, last {n} lines:\n{log}", node.id);
        }
    }
}

/// `POST path` at a leader `addr`, retried for up to `within` while it answers `503`: a term
/// shows in `/status` as soon as it is won, and its work starts a moment later; the
/// `503 not_ready` in between asks the client to retry.
pub async fn post_when_ready(
    client: &NodeClient,
    addr: &str,
    path: &str,
    within: Duration,
) -> baton_lab::fleet::client::Reply {
    let until = Instant::now() + within;
    loop {
        let r = client.post(addr, path).await.expect("POST to the leader");
        if r.status != 503 || Instant::now() >= until {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `(token, seq)` a `200` answer to `POST /next` issued.
pub fn issued(r: &baton_lab::fleet::client::Reply) -> (i64, i64) {
    let v = r.json();
    (v["token"].as_i64().unwrap(), v["seq"].as_i64().unwrap())
}

/// One `POST /next` against whoever leads, following 409s; `(token, seq)` or why not.
pub async fn next_anywhere(
    client: &NodeClient,
    nodes: &[FleetNode],
    hint: &mut Option<String>,
) -> Result<(i64, i64), String> {
    let mut addrs: Vec<String> = hint.iter().cloned().collect();
    addrs.extend(nodes.iter().map(|n| n.http_addr.clone()));
    for addr in addrs {
        match client.post(&addr, "/next").await {
            Ok(r) if r.status == 200 => {
                *hint = Some(addr);
                return Ok(issued(&r));
            }
            Ok(r) if r.status == 409 => {
                if let Some(l) = r.leader_header {
                    *hint = Some(l);
                }
            }
            _ => {}
        }
    }
    *hint = None;
    Err("no node answered 200".into())
}

pub fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// The ledger view, in commit order: no `next` range overlaps or steps back, tokens never
/// decrease; and every ID a client was given is in the ledger exactly once, under its token.
pub async fn assert_ledger_monotonic(db: &tokio_postgres::Client, got: &[(i64, i64)]) {
    let bad: i64 = db
        .query_one(
            "SELECT count(*) FROM (SELECT token, seq_lo, lag(seq_hi) OVER w AS prev_hi, lag(token) OVER w AS prev_token
               FROM baton.fence_log WHERE op = 'next' WINDOW w AS (ORDER BY pos)) x
             WHERE seq_lo <= prev_hi OR token < prev_token",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(bad, 0, "the ledger has non-increasing steps");
    for (token, seq) in got {
        let n: i64 = db
            .query_one(
                "SELECT count(*) FROM baton.fence_log WHERE op = 'next' AND token = $1 AND $2 BETWEEN seq_lo AND seq_hi",
                &[token, seq],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            n, 1,
            "acknowledged ({token}, {seq}) is not in the ledger exactly once"
        );
    }
}

/// A sequential `POST /next` client following redirects: every answer it got, in order.
pub struct NextLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<(i64, i64)>>,
}

impl NextLoad {
    pub fn start(fleet: &Fleet) -> NextLoad {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (client, nodes, flag) = (fleet.client.clone(), fleet.state().nodes, stop.clone());
        let task = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut hint = None;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                match next_anywhere(&client, &nodes, &mut hint).await {
                    Ok(ts) => got.push(ts),
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
            got
        });
        NextLoad { stop, task }
    }

    pub async fn finish(self) -> Vec<(i64, i64)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// A shipped config (`config/NAME.toml`) with some keys set to other values (`key`, TOML value):
/// the file's line that sets `key` (in whichever table) is replaced; a key the file lacks goes
/// first, as a top-level key.
pub fn config_with(name: &str, set: &[(&str, &str)]) -> String {
    let base = std::fs::read_to_string(repo_path(&format!("config/{name}.toml"))).unwrap();
    let mut missing: Vec<String> = Vec::new();
    let mut lines: Vec<String> = base.lines().map(str::to_owned).collect();
    for (key, value) in set {
        let at = lines.iter().position(|l| {
            l.split_once('=')
                .is_some_and(|(k, _)| k.trim() == *key && !l.starts_with('#'))
        });
        match at {
            Some(i) => lines[i] = format!("{key} = {value}"),
            None => missing.push(format!("{key} = {value}")),
        }
    }
    missing.extend(lines);
    missing.join("\n") + "\n"
}

/// A process stopped with SIGSTOP (a PostgreSQL backend: its kernel still acknowledges the
/// bytes, it answers nothing), sent SIGCONT when dropped, so a failing test never leaves one
/// stopped (its server could not shut down).
pub struct Stopped(i32);

impl Stopped {
    pub fn stop(pid: i32) -> Stopped {
        // SAFETY: kill(2) with a pid the test found; no memory is touched.
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGSTOP) },
            0,
            "SIGSTOP {pid}"
        );
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// Removes terminal colour codes (the node logs with ANSI colours).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A loopback address nobody listens on right now (whoever is handed it binds it).
pub fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// `n` in-process raft members' configs as a user would write them: `NodeConfig::default()`
/// plus the node id, a state dir (each in its own temp dir, returned to be kept alive), the
/// advertised address, every member as a peer and the cluster `secret`.
pub fn raft_member_configs(
    n: usize,
    secret: &str,
) -> (Vec<tempfile::TempDir>, Vec<baton::config::NodeConfig>) {
    let peers: Vec<baton::config::PeerSpec> = (0..n)
        .map(|i| baton::config::PeerSpec {
            id: format!("n{}", i + 1),
            addr: free_addr(),
            peer_addr: free_addr(),
        })
        .collect();
    peers
        .iter()
        .map(|p| {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = baton::config::NodeConfig {
                node_id: p.id.clone(),
                state_dir: dir.path().to_owned(),
                advertise_addr: Some(p.addr.clone()),
                ..baton::config::NodeConfig::default()
            };
            cfg.raft.peers = peers.clone();
            cfg.raft.cluster_secret = Some(baton::config::Secret::new(secret));
            (dir, cfg)
        })
        .unzip()
}

/// The first term claimed after ledger position `after_pos` at a token ≥ `min_token` that then
/// served (a `next` under the same token and holder): its token and holder. A claim alone is not
/// enough: the old leader may write on under its own term for a moment.
pub async fn serving_claim(
    db: &tokio_postgres::Client,
    after_pos: i64,
    min_token: i64,
) -> Option<(i64, String)> {
    let rows = db
        .query(
            "SELECT c.token, c.holder FROM baton.fence_log c
              WHERE c.op = 'claim' AND c.pos > $1 AND c.token >= $2
                AND EXISTS (SELECT 1 FROM baton.fence_log n WHERE n.op = 'next' AND n.pos > c.pos
                               AND n.token = c.token AND n.holder = c.holder)
              ORDER BY c.pos LIMIT 1",
            &[&after_pos, &min_token],
        )
        .await
        .unwrap();
    rows.first()
        .map(|r| (r.get::<_, i64>(0), r.get::<_, String>(1)))
}

/// The raft leader, from the members' persisted votes (the newest committed one).
pub fn raft_leader(fleet: &Fleet) -> String {
    let mut best: Option<(u64, u64)> = None;
    for n in &fleet.state().nodes {
        let path = Path::new(&n.config)
            .parent()
            .unwrap()
            .join("raft")
            .join("vote.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let (term, who) = (
            v["leader_id"]["term"].as_u64().unwrap(),
            v["leader_id"]["voted_for"].as_u64().unwrap(),
        );
        if v["committed"] == true && best.is_none_or(|(t, _)| term > t) {
            best = Some((term, who));
        }
    }
    format!("n{}", best.expect("no committed raft vote on any member").1)
}

/// A private CA (rcgen, at test time) and a server certificate it issued for 127.0.0.1 and
/// `localhost`, as PEM files under `dir/name` (the key 0600).
pub fn test_ca(dir: &std::path::Path, name: &str) -> baton_lab::fleet::servers::ServerTls {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        SanType,
    };
    let dir = dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("baton test CA {name}"));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::IpAddr::V4(
            std::net::Ipv4Addr::LOCALHOST,
        )));
    params
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    let cert = params.signed_by(&key, &issuer).unwrap();
    let write = |file: &str, text: String| {
        let path = dir.join(file);
        std::fs::write(&path, text).unwrap();
        path
    };
    let tls = baton_lab::fleet::servers::ServerTls {
        cert_file: write("server.crt", cert.pem()),
        key_file: write("server.key", key.serialize_pem()),
        ca_file: write("ca.pem", ca_cert.pem()),
    };
    let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
    std::fs::set_permissions(&tls.key_file, private).unwrap();
    tls
}
