//! Issue 15: hostile clients against a real raft fleet (`baton fleet up`, real `baton node`
//! processes on loopback). A slow-connection flood against the leader must not take its
//! descriptors, its clients or its leadership; malformed and oversized requests get a precise 4xx
//! or a bounded close and change nothing; `/stepdown` needs the fleet's admin token; a leader
//! that cannot accept steps down.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream as StdTcpStream;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_lab::fleet::client::NodeClient;
use bytes::Bytes;
use common::{repo_path, Fleet, BATON};
use hyper::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SETTLE: Duration = Duration::from_secs(30);
/// Descriptors each node gets, as in the incident (soft = hard: the node cannot raise it).
const NODE_NOFILE: u64 = 1024;
const ATTACKERS: usize = 3000;
const ATTACK: Duration = Duration::from_secs(20);
/// Short client bounds for the malformed-request cases, so a timeout close is seen quickly.
const SHORT_TIMEOUT_MS: u64 = 1500;

/// One fleet at a time on a 2-core machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn set_nofile(soft: u64, hard: u64) -> std::io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads the struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// This test process needs more than 3,000 sockets: soft limit up to the hard one.
fn raise_own_nofile(need: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    if lim.rlim_cur < need {
        set_nofile(lim.rlim_max, lim.rlim_max).expect("raise RLIMIT_NOFILE");
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    assert!(
        lim.rlim_cur >= need,
        "the test needs {need} descriptors; the hard limit is {}",
        lim.rlim_max
    );
}

/// `config/raft.toml` plus `extra` TOML, written into the test's temp dir.
fn base_config(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let mut text = std::fs::read_to_string(repo_path("config/raft.toml")).unwrap();
    text.push('\n');
    text.push_str(extra);
    let path = dir.join("base.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A 3-node raft fleet whose nodes run with RLIMIT_NOFILE `nofile` (inherited through
/// `baton fleet up`, which spawns them), on `config/raft.toml` + `extra`.
fn raft_fleet(nofile: Option<u64>, extra: &str) -> Fleet {
    let dir = tempfile::Builder::new()
        .prefix("baton-test-")
        .tempdir()
        .unwrap();
    let config = base_config(dir.path(), extra);
    let mut fleet = Fleet {
        dir,
        client: NodeClient::new(Duration::from_secs(3)),
    };
    let mut cmd = Command::new(BATON);
    cmd.args(["fleet", "up", "3", "--backend", "raft", "--dir"])
        .arg(fleet.path())
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "warn");
    if let Some(n) = nofile {
        // SAFETY: setrlimit is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(move || set_nofile(n, n));
        }
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "fleet up: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    fleet.client = fleet.state().admin_client(Duration::from_secs(3));
    fleet
}

/// The leader once it has held the same term for a while: a fleet that just started on a busy
/// 2-core machine may still hand leadership over once (150 ms raft leases).
async fn stable_leader(fleet: &Fleet) -> (String, String, i64) {
    let until = Instant::now() + SETTLE;
    let mut last = fleet.leader(SETTLE).await;
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = fleet.leader(SETTLE).await;
        if now == last {
            return now;
        }
        assert!(
            Instant::now() < until,
            "leadership kept moving: {last:?} -> {now:?}"
        );
        last = now;
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn pid_of(fleet: &Fleet, id: &str) -> u32 {
    fleet.node(id).pid
}

/// How one attacker misbehaves.
#[derive(Clone, Copy, Debug)]
enum Slow {
    /// Half a request head, then nothing.
    PartialHead,
    /// A chunked body whose chunks never come.
    StalledChunked,
    /// Content-Length 100, 10 bytes sent.
    ShortBody,
}

impl Slow {
    fn of(i: usize) -> Slow {
        match i % 3 {
            0 => Slow::PartialHead,
            1 => Slow::StalledChunked,
            _ => Slow::ShortBody,
        }
    }

    fn opening(self) -> &'static [u8] {
        match self {
            Slow::PartialHead => b"POST /next HTTP/1.1\r\nHost: leader\r\nX-Slow: ",
            Slow::StalledChunked => b"POST /next HTTP/1.1\r\nHost: leader\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n",
            Slow::ShortBody => b"POST /next HTTP/1.1\r\nHost: leader\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"n\":1,   ",
        }
    }
}

#[derive(Default)]
struct AttackStats {
    connected: AtomicU64,
    refused_503: AtomicU64,
    closed_by_server: AtomicU64,
    connect_failed: AtomicU64,
    open_now: AtomicU64,
}

/// One attacker: connect, misbehave, hold the socket until the server lets go, come back.
async fn attacker(addr: String, kind: Slow, stop: Arc<AtomicBool>, stats: Arc<AttackStats>) {
    // Spread the 3,000 first connects over a second.
    tokio::time::sleep(Duration::from_millis(rand::random::<u64>() % 1000)).await;
    while !stop.load(Ordering::Relaxed) {
        let Ok(Ok(mut s)) =
            tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(&addr)).await
        else {
            stats.connect_failed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        stats.connected.fetch_add(1, Ordering::Relaxed);
        stats.open_now.fetch_add(1, Ordering::Relaxed);
        let _ = s.write_all(kind.opening()).await;
        let mut buf = Vec::new();
        let held = async {
            let mut chunk = [0u8; 512];
            loop {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        };
        let stopped = async {
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let server_closed = tokio::select! {
            _ = held => true,
            _ = stopped => false,
        };
        stats.open_now.fetch_sub(1, Ordering::Relaxed);
        if server_closed {
            if buf.starts_with(b"HTTP/1.1 503") {
                stats.refused_503.fetch_add(1, Ordering::Relaxed);
            } else {
                stats.closed_by_server.fetch_add(1, Ordering::Relaxed);
            }
            // Come back, but not so fast that loopback runs out of ephemeral ports.
            let pause = 5000 + rand::random::<u64>() % 5000;
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }
}

/// A well-behaved client: sequential `POST /next` to the leader on a keep-alive connection.
/// Returns (attempts, successes, tokens seen, failures by kind).
async fn well_behaved(
    client: NodeClient,
    addr: String,
    stop: Arc<AtomicBool>,
) -> (
    u64,
    u64,
    std::collections::BTreeSet<i64>,
    std::collections::BTreeMap<String, u64>,
) {
    let (mut attempts, mut ok) = (0u64, 0u64);
    let mut tokens = std::collections::BTreeSet::new();
    let mut failures = std::collections::BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        attempts += 1;
        let why = match client.post(&addr, "/next").await {
            Ok(r) if r.status == 200 => {
                ok += 1;
                tokens.insert(r.json()["token"].as_i64().unwrap_or(-1));
                continue;
            }
            Ok(r) => format!("{} {}", r.status, r.json()["error"]),
            Err(e) => e.to_string().chars().take(80).collect(),
        };
        *failures.entry(why).or_insert(0) += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (attempts, ok, tokens, failures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_connection_flood_keeps_the_leader_serving_and_leading() {
    let _g = SERIAL.lock().await;
    raise_own_nofile(ATTACKERS as u64 + 512);
    let fleet = raft_fleet(Some(NODE_NOFILE), "");
    let (leader, addr, token) = stable_leader(&fleet).await;
    let pid = pid_of(&fleet, &leader);
    let client = NodeClient::new(Duration::from_secs(3));
    // Warm the keep-alive connection before the attack, as a real client would have one.
    for _ in 0..20 {
        let r = client.post(&addr, "/next").await.unwrap();
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    let fds_before = open_fds(pid);
    let trace_path = fleet.node(&leader).log.with_file_name("actor-trace.jsonl");
    let trace_before = std::fs::read(&trace_path).unwrap().len();

    let stop_clients = Arc::new(AtomicBool::new(false));
    let good = tokio::spawn(well_behaved(
        client.clone(),
        addr.clone(),
        stop_clients.clone(),
    ));
    let stop_attack = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(AttackStats::default());
    let attackers: Vec<_> = (0..ATTACKERS)
        .map(|i| {
            tokio::spawn(attacker(
                addr.clone(),
                Slow::of(i),
                stop_attack.clone(),
                stats.clone(),
            ))
        })
        .collect();

    let started = Instant::now();
    let (mut fds_peak, mut attackers_open_peak) = (0usize, 0u64);
    let mut follower_views_bad = Vec::new();
    let status_client = NodeClient::new(Duration::from_secs(2));
    let (mut fresh_tries, mut fresh_ok) = (0u64, 0u64);
    while started.elapsed() < ATTACK {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // A client arriving mid-attack, on a new connection, still gets in.
        let fresh = NodeClient::new(Duration::from_secs(2));
        fresh_tries += 1;
        if matches!(fresh.get(&addr, "/status").await, Ok(r) if r.status == 200) {
            fresh_ok += 1;
        }
        fds_peak = fds_peak.max(open_fds(pid));
        attackers_open_peak = attackers_open_peak.max(stats.open_now.load(Ordering::Relaxed));
        // The followers keep seeing the same leader throughout (their ports are not attacked).
        for n in fleet.state().nodes.iter().filter(|n| n.id != leader) {
            if let Ok(r) = status_client.get(&n.http_addr, "/status").await {
                let seen = r.json()["leader"]["node_id"].as_str().map(str::to_owned);
                if seen.as_deref() != Some(leader.as_str()) {
                    follower_views_bad.push((n.id.clone(), seen));
                }
            }
        }
    }
    stop_attack.store(true, Ordering::Relaxed);
    for a in attackers {
        let _ = a.await;
    }
    stop_clients.store(true, Ordering::Relaxed);
    let (attempts, ok, tokens, failures) = good.await.unwrap();

    // The attackers are gone: the node's descriptors come back to where they were.
    let recovered_by = Instant::now() + Duration::from_secs(15);
    let fds_after = loop {
        let n = open_fds(pid);
        if n <= fds_before + 16 || Instant::now() > recovered_by {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let availability = ok as f64 / attempts.max(1) as f64;
    let log = std::fs::read_to_string(&fleet.node(&leader).log).unwrap_or_default();
    let accept_failures = log.matches("accept failed").count();
    eprintln!(
        "attack on {leader} (token {token}): {ATTACKERS} attackers for {ATTACK:?}; \
         connects {}, refused 503 {}, closed by server {}, connect failures {}, attackers open at peak {attackers_open_peak}; \
         well-behaved /next {ok}/{attempts} = {:.4}; leader descriptors before {fds_before}, peak {fds_peak}, after {fds_after}; \
         tokens seen {tokens:?}; 'accept failed' lines {accept_failures}; \
         fresh-connection /status {fresh_ok}/{fresh_tries}; well-behaved failures {failures:?}",
        stats.connected.load(Ordering::Relaxed),
        stats.refused_503.load(Ordering::Relaxed),
        stats.closed_by_server.load(Ordering::Relaxed),
        stats.connect_failed.load(Ordering::Relaxed),
        availability,
    );
    assert!(
        stats.connected.load(Ordering::Relaxed) >= ATTACKERS as u64,
        "the attack did not get going"
    );
    // The cap was reached: attackers were cut off by eviction (or refused), not just by timeouts.
    assert!(
        stats.closed_by_server.load(Ordering::Relaxed) + stats.refused_503.load(Ordering::Relaxed)
            > ATTACKERS as u64,
        "the connection cap was never reached: was the attack real?"
    );
    assert!(
        availability >= 0.99,
        "/next availability {availability:.4} during the attack"
    );
    assert!(
        fresh_ok * 10 >= fresh_tries * 9,
        "new clients were locked out: /status {fresh_ok}/{fresh_tries}"
    );
    // The cap is half the limit (512 slots) plus at most 64 evicted connections still closing.
    let fd_bound = (NODE_NOFILE / 2) as usize + 64 + fds_before + 32;
    assert!(
        fds_peak <= fd_bound,
        "leader descriptors peaked at {fds_peak} (bound {fd_bound}, limit {NODE_NOFILE})"
    );
    assert_eq!(accept_failures, 0, "the leader ran out of descriptors");
    assert!(
        fds_after <= fds_before + 16,
        "descriptors did not recover: {fds_before} before, {fds_after} after"
    );
    assert!(
        follower_views_bad.is_empty(),
        "followers saw another leader: {follower_views_bad:?}"
    );
    assert_eq!(
        tokens.into_iter().collect::<Vec<_>>(),
        vec![token],
        "a leadership change during the attack"
    );
    // Timer-critical work was never starved: with a 150 ms raft lease renewed every 40 ms, a
    // runtime stalled by client work would show as a lost lease or a watchdog demotion.
    let trace = std::fs::read(&trace_path).unwrap();
    let during = String::from_utf8_lossy(&trace[trace_before..]);
    for bad in ["lease-lost", "deadline-passed", "demoted"] {
        assert!(
            !during.contains(bad),
            "{bad} in the leader's trace during the attack: {during:.2000}"
        );
    }
    let (leader_after, _, token_after) = fleet.leader(SETTLE).await;
    assert_eq!((leader_after, token_after), (leader, token));
}

/// Raw HTTP/1.1 on a fresh connection: what came back before the server closed it or `wait`
/// passed, and whether it closed.
fn raw_exchange(addr: &str, bytes: &[u8], wait: Duration) -> (String, bool) {
    let mut s = StdTcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let _ = s.write_all(bytes);
    let until = Instant::now() + wait;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < until {
        match s.read(&mut buf) {
            Ok(0) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), true),
        }
    }
    (String::from_utf8_lossy(&got).into_owned(), false)
}

fn statuses(text: &str) -> Vec<u16> {
    text.match_indices("HTTP/1.1 ")
        .filter_map(|(i, _)| text.get(i + 9..i + 12)?.parse().ok())
        .collect()
}

async fn next_rows(fleet: &Fleet) -> i64 {
    fleet
        .admin_db()
        .await
        .query_one(
            "SELECT count(*) FROM baton.fence_log WHERE op = 'next'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_oversized_endless_and_pipelined_requests_get_precise_answers() {
    let _g = SERIAL.lock().await;
    let extra = format!(
        "[http]\nheader_read_timeout_ms = {SHORT_TIMEOUT_MS}\nbody_read_timeout_ms = {SHORT_TIMEOUT_MS}\n"
    );
    let fleet = raft_fleet(None, &extra);
    let (leader, addr, token) = stable_leader(&fleet).await;
    let rows_before = next_rows(&fleet).await;
    let quick = Duration::from_secs(3);
    let bound = Duration::from_millis(SHORT_TIMEOUT_MS) + Duration::from_secs(3);
    let big_header = format!(
        "GET /status HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(80 * 1024)
    );
    let mut chunked_flood = b"POST /next HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..64 {
        chunked_flood.extend_from_slice(b"40\r\n");
        chunked_flood.extend_from_slice(&[b' '; 64]);
        chunked_flood.extend_from_slice(b"\r\n");
    }
    // (what, request, expected status, must the server close the connection)
    let cases: Vec<(&str, Vec<u8>, u16, bool)> = vec![
        ("garbage head", b"HELLO THERE\r\n\r\n".to_vec(), 400, true),
        (
            "bad header line",
            b"GET /status HTTP/1.1\r\nno colon here\r\n\r\n".to_vec(),
            400,
            true,
        ),
        ("head over the buffer", big_header.into_bytes(), 431, true),
        (
            "wrong method",
            b"GET /next HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            405,
            true,
        ),
        (
            "declared oversized",
            b"POST /next HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
                .to_vec(),
            413,
            true,
        ),
        ("chunked past the limit", chunked_flood, 413, true),
        (
            "not json",
            b"POST /next HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
                .to_vec(),
            415,
            true,
        ),
        (
            "broken json",
            b"POST /next HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\nConnection: close\r\n\r\n{\"n\":"
                .to_vec(),
            400,
            true,
        ),
    ];
    for (what, req, want, closes) in cases {
        let (text, closed) = raw_exchange(&addr, &req, quick);
        assert_eq!(statuses(&text).first(), Some(&want), "{what}: {text:.300}");
        assert_eq!(closed, closes, "{what}: closed = {closed}: {text:.300}");
        if want == 405 {
            assert!(
                text.to_ascii_lowercase().contains("allow: post"),
                "{what}: no Allow: {text:.300}"
            );
        }
    }

    // Never-ending and short bodies: 408 once the body bound passes, then the close.
    for (what, req) in [
        ("endless chunked", Slow::StalledChunked.opening()),
        ("short content-length", Slow::ShortBody.opening()),
    ] {
        let t0 = Instant::now();
        let (text, closed) = raw_exchange(&addr, req, bound);
        assert!(closed, "{what}: still open after {bound:?}");
        assert_eq!(statuses(&text), vec![408], "{what}: {text:.300}");
        assert!(t0.elapsed() >= Duration::from_millis(SHORT_TIMEOUT_MS - 100));
    }
    // A head that never completes, and an idle keep-alive connection: closed by the header clock.
    for (what, req) in [
        ("partial head", Slow::PartialHead.opening().to_vec()),
        ("nothing at all", Vec::new()),
        (
            "idle after one request",
            b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ),
    ] {
        let t0 = Instant::now();
        let (text, closed) = raw_exchange(&addr, &req, bound);
        assert!(closed, "{what}: still open after {bound:?}: {text:.300}");
        assert!(
            t0.elapsed() >= Duration::from_millis(SHORT_TIMEOUT_MS - 100),
            "{what}: closed too early"
        );
        let want: Vec<u16> = if req.is_empty() || what == "partial head" {
            vec![]
        } else {
            vec![200]
        };
        let got: Vec<u16> = statuses(&text).into_iter().filter(|s| *s != 408).collect();
        assert_eq!(got, want, "{what}: {text:.300}");
    }
    // Pipelined: answered in order, each on its own merits, on one connection.
    let pipelined = b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n\
POST /next?n=0 HTTP/1.1\r\nHost: x\r\n\r\n\
DELETE /status HTTP/1.1\r\nHost: x\r\n\r\n\
POST /next?bogus=1 HTTP/1.1\r\nHost: x\r\n\r\n\
GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let (text, closed) = raw_exchange(&addr, pipelined, quick);
    assert!(closed, "{text:.500}");
    assert_eq!(
        statuses(&text),
        vec![200, 400, 405, 400, 200],
        "{text:.800}"
    );

    // Nothing changed: the same leader and token, no ID issued.
    let (leader_after, _, token_after) = fleet.leader(SETTLE).await;
    assert_eq!((leader_after, token_after), (leader, token));
    assert_eq!(next_rows(&fleet).await, rows_before, "an ID was issued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stepdown_needs_the_fleets_admin_token() {
    let _g = SERIAL.lock().await;
    let fleet = raft_fleet(None, "");
    let (leader, addr, token) = stable_leader(&fleet).await;
    let state = fleet.state();
    let secret = state
        .admin_token
        .clone()
        .expect("fleet up generates an admin token");
    assert!(
        secret.len() >= 32,
        "token too short: {} bytes",
        secret.len()
    );
    // Every node got it; it never shows in /status.
    for n in &state.nodes {
        let cfg = baton::config::NodeConfig::from_file(&n.config).unwrap();
        assert_eq!(
            cfg.admin_token.as_ref().map(|t| t.expose()),
            Some(secret.as_str())
        );
        let st = fleet.client.get(&n.http_addr, "/status").await.unwrap();
        assert!(!String::from_utf8_lossy(&st.body).contains(&secret));
    }

    let bare = NodeClient::new(Duration::from_secs(5));
    let r = bare.post(&addr, "/stepdown").await.unwrap();
    assert_eq!(r.status, 401, "{:?}", r.body);
    let wrong = format!("Bearer {}", "0".repeat(secret.len()));
    for auth in [
        wrong.as_str(),
        "Bearer ",
        "Basic Zm9vOmJhcg==",
        secret.as_str(),
    ] {
        let r = bare
            .send(
                Method::POST,
                &addr,
                "/stepdown",
                &[("authorization", auth)],
                Bytes::new(),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 403, "{auth:?}: {:?}", r.body);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (still, _, still_token) = fleet.leader(SETTLE).await;
    assert_eq!(
        (still.as_str(), still_token),
        (leader.as_str(), token),
        "a refused /stepdown changed the leadership"
    );

    // The fleet's own tool (what chaos, bench and exp use) carries the token.
    let out = Command::new(BATON)
        .args(["fleet", "stepdown", "--dir"])
        .arg(fleet.path())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "baton fleet stepdown: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, _, new_token) = fleet.new_leader("", token, SETTLE).await;
    assert!(new_token > token);
    // No node logged the token.
    for n in &state.nodes {
        let log = std::fs::read_to_string(&n.log).unwrap_or_default();
        assert!(!log.contains(&secret), "{} logged the admin token", n.id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_out_of_descriptors_steps_down() {
    let _g = SERIAL.lock().await;
    let fleet = raft_fleet(None, "[http]\naccept_failure_stepdown_ms = 2000\n");
    let (leader, addr, token) = stable_leader(&fleet).await;
    let pid = pid_of(&fleet, &leader) as i32;
    // Leave the leader a handful of descriptors beyond what it has open now.
    // Only the soft limit: the hard one could not be raised back without CAP_SYS_RESOURCE.
    let mut original = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit on a process this test started; writes the struct we own.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut original) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    let lim = libc::rlimit {
        rlim_cur: open_fds(pid as u32) as u64 + 8,
        rlim_max: original.rlim_max,
    };
    // SAFETY: as above; reads the struct we own.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    // Hold connections until accept fails with EMFILE, and keep holding them.
    let mut held = Vec::new();
    let until = Instant::now() + Duration::from_secs(20);
    let mut stepped = None;
    while Instant::now() < until && stepped.is_none() {
        for _ in 0..8 {
            if let Ok(Ok(s)) =
                tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(&addr)).await
            {
                held.push(s);
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        let trace =
            std::fs::read_to_string(fleet.node(&leader).log.with_file_name("actor-trace.jsonl"))
                .unwrap_or_default();
        stepped = trace
            .lines()
            .find(|l| l.contains("unserviceable-stepdown"))
            .map(str::to_owned);
    }
    let step = stepped.expect("the leader that could not accept did not step down");
    eprintln!("{leader} held {} connections; trace: {step}", held.len());
    // Let go and give the descriptors back, so the old leader can follow and answer /status
    // again and the fleet can agree.
    drop(held);
    // SAFETY: as above.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &original, std::ptr::null_mut()) };
    assert_eq!(
        rc,
        0,
        "prlimit restore: {}",
        std::io::Error::last_os_error()
    );
    let (new_leader, _, new_token) = fleet.new_leader(&leader, token, SETTLE).await;
    assert!(new_token > token);
    eprintln!("new leader {new_leader} (token {new_token})");
}

/// Each thread of process `pid`: its name, and its on-CPU nanoseconds (`/proc/…/schedstat`,
/// exact, where `stat`'s ticks would round a few milliseconds down to 0; 0 when unreadable).
fn threads(pid: u32) -> Vec<(String, u64)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|t| {
                let t = t.ok()?.path();
                let name = std::fs::read_to_string(t.join("comm")).ok()?;
                let cpu_ns = std::fs::read_to_string(t.join("schedstat"))
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse().ok())
                    .unwrap_or(0);
                Some((name.trim().to_owned(), cpu_ns))
            })
            .collect()
        })
        .unwrap_or_default()
}

/// The name of each thread of process `pid`.
fn thread_names(pid: u32) -> Vec<String> {
    threads(pid).into_iter().map(|(name, _)| name).collect()
}

/// Whether the server has closed `s` (read sees EOF or a reset) within `wait`.
fn closed_by_server(s: &mut StdTcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            // A 503 or anything else the server wrote before closing: keep reading.
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// On-CPU nanoseconds of the threads of `pid` named `name`.
fn thread_cpu_ns(pid: u32, name: &str) -> u64 {
    threads(pid)
        .into_iter()
        .filter(|(n, _)| n == name)
        .map(|(_, ns)| ns)
        .sum()
}

/// `[http] commit_threads = 1`: the sequencer's commit path runs on a thread of its own,
/// `baton-commit-0`, and `POST /next` is answered from it: 300 IDs, strictly increasing, and
/// the commit thread's CPU time grew with them (left on a client thread, the commit thread
/// would idle and its time stand still).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_thread_of_its_own_runs_the_sequencers_commits() {
    let _g = SERIAL.lock().await;
    let fleet = raft_fleet(None, "[http]\ncommit_threads = 1\n");
    let (leader, addr, _token) = stable_leader(&fleet).await;
    let pid = pid_of(&fleet, &leader);
    let names = thread_names(pid);
    assert!(
        names.iter().any(|n| n == "baton-commit-0"),
        "no baton-commit-0 thread: {names:?}"
    );
    assert!(
        !names.iter().any(|n| n == "baton-commit-1"),
        "a second commit thread: {names:?}"
    );
    let client = NodeClient::new(Duration::from_secs(3));
    // The first answer comes once the term's claim is in: from then on every /next is a commit.
    let (_, mut last) = common::issued(&client.post(&addr, "/next").await.unwrap());
    let before = thread_cpu_ns(pid, "baton-commit-0");
    for _ in 0..300 {
        let r = client.post(&addr, "/next").await.unwrap();
        assert_eq!(
            r.status,
            200,
            "POST /next: {}",
            String::from_utf8_lossy(&r.body)
        );
        let (_, seq) = common::issued(&r);
        assert!(seq > last, "{seq} after {last}");
        last = seq;
    }
    let spent = thread_cpu_ns(pid, "baton-commit-0") - before;
    eprintln!("300 commits: {spent} ns on baton-commit-0");
    assert!(
        spent > 300 * 5_000,
        "baton-commit-0 spent {spent} ns over 300 commits: they did not run there"
    );
}

/// `[http] threads = 2`: two client threads accept on the one listener, and `max_connections`
/// bounds the node, not each thread. 40 connections that never send a request against a cap of
/// 16: each one past the cap evicts the stalest, so at least 24 are closed by the server, and
/// at most 16 stay open. (Two caps of 16, one per thread, would leave up to 32 open.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_threads_share_one_connection_cap() {
    let _g = SERIAL.lock().await;
    const CAP: usize = 16;
    const OPENED: usize = 40;
    let fleet = raft_fleet(
        None,
        &format!("[http]\nthreads = 2\nmax_connections = {CAP}\n"),
    );
    let (leader, addr, _token) = stable_leader(&fleet).await;
    let names = thread_names(pid_of(&fleet, &leader));
    for want in ["baton-http-0", "baton-http-1"] {
        assert!(
            names.iter().any(|n| n == want),
            "no {want} thread: {names:?}"
        );
    }
    assert!(
        !names.iter().any(|n| n == "baton-http-2"),
        "a third client thread: {names:?}"
    );
    let addr2 = addr.clone();
    let (closed, open) = tokio::task::spawn_blocking(move || {
        let mut conns: Vec<StdTcpStream> = (0..OPENED)
            .map(|_| {
                let s = StdTcpStream::connect(&addr2).unwrap();
                // One at a time, so every connection is admitted before the next arrives.
                std::thread::sleep(Duration::from_millis(20));
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let closed = conns
            .iter_mut()
            .map(|s| closed_by_server(s, Duration::from_millis(100)))
            .filter(|closed| *closed)
            .count();
        (closed, OPENED - closed)
    })
    .await
    .unwrap();
    eprintln!("{OPENED} idle connections against a cap of {CAP} on 2 threads: {closed} closed by the server, {open} open");
    assert!(
        closed >= OPENED - CAP && open <= CAP,
        "{closed} closed, {open} open: the cap of {CAP} was not shared by the threads"
    );
    // Requests are served meanwhile, on fresh connections, whichever thread accepts them.
    for _ in 0..20 {
        let client = NodeClient::new(Duration::from_secs(3));
        let r = client.post(&addr, "/next").await.unwrap();
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
}
