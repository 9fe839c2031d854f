//! Issue 33: the SWIM failure detector feeding the elector, against real servers and node
//! processes (`baton fleet up 3 --backend pg-lease`, a 3 s lease):
//!
//! * with `[detector] kind = "swim"` a `kill -9`ed leader is replaced well inside its TTL: the
//!   new leader's first fenced write (the resource's ledger, PostgreSQL's clock) comes less than
//!   2 s after the dead leader's last one, sooner than its lease could have run out (renewed at
//!   most 1 s before the kill, it had at least 2 s left), and a survivor counts the takeover;
//!   without the detector it does not (the lease is waited out). The speed goal (p50 ≤
//!   700 ms) is measured in a release build by the ignored `measure` test, not asserted here;
//! * forged (wrong MAC), replayed (a sequence number already seen) and stale (old timestamp)
//!   datagrams sent to the leader's detector socket change nothing: same leader, same token, no
//!   member confirmed dead, every one dropped and counted in `/status` and `/metrics`;
//! * a live leader falsely accused (paused past the suspicion timeout, well inside its lease)
//!   loses its lease to a higher token, demotes cleanly when it wakes, and its stale token is
//!   refused by the resource.
//!
//! One test at a time (a process-wide lock): they measure failover timing on a 2-core machine.

// The serializing guard is held across awaits on purpose: each test has its own runtime.
#![allow(clippy::await_holding_lock)]

mod common;

use std::net::UdpSocket;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use baton::config::NodeConfig;
use baton::detector::wire::Sealer;
use baton::peer_auth::{now_unix_ms, PeerAuth};
use common::{assert_ledger_monotonic, config_with, Fleet, NextLoad};

const SETTLE: Duration = Duration::from_secs(40);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// config/pg-lease.toml (3 s lease), with the detector on or off.
fn pg_lease_config(swim: bool) -> String {
    backend_config("pg-lease", swim)
}

/// config/BACKEND.toml (a 3 s lease), with the detector on or off.
fn backend_config(backend: &str, swim: bool) -> String {
    let mut c = config_with(backend, &[]);
    if swim {
        c.push_str("\n[detector]\nkind = \"swim\"\n");
    }
    c
}

/// The new leader's first `next` minus the old leader's last, on the resource's clock (ms).
async fn ledger_failover_ms(fleet: &Fleet, old: (&str, i64), new: (&str, i64)) -> f64 {
    let db = fleet.admin_db().await;
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let v: Option<f64> = db
            .query_one(
                "SELECT (extract(epoch FROM (SELECT min(committed_at) FROM baton.fence_log WHERE token = $2 AND holder = $4 AND op = 'next')
                                          - (SELECT max(committed_at) FROM baton.fence_log WHERE token = $1 AND holder = $3 AND op = 'next')) * 1000)::float8",
                &[&old.1, &new.1, &old.0, &new.0],
            )
            .await
            .unwrap()
            .get(0);
        match v {
            Some(v) => return v,
            None if Instant::now() < until => tokio::time::sleep(Duration::from_millis(100)).await,
            None => panic!("no `next` of the new leader {new:?} in the ledger after {old:?}"),
        }
    }
}

/// `kill -9` of the leader under a sequential `/next` load: `(old, old token, new, new token,
/// failover ms)`; the IDs answered stay strictly increasing and match the ledger.
async fn kill_leader_under_load(fleet: &Fleet) -> (String, i64, String, i64, f64) {
    let (l1, t1, l2, t2, ms, _) = kill_leader_under_load_at(fleet).await;
    (l1, t1, l2, t2, ms)
}

/// [`kill_leader_under_load`], also returning when the kill was sent (wall ms, this host's clock,
/// which the nodes' traces share).
async fn kill_leader_under_load_at(fleet: &Fleet) -> (String, i64, String, i64, f64, u64) {
    let (l1, _, t1) = fleet.settled_leader(SETTLE, Duration::from_secs(2)).await;
    let load = NextLoad::start(fleet);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let kill_wall_ms = baton::peer_auth::now_unix_ms();
    eprintln!("kill at wall_ms {kill_wall_ms}");
    fleet.kill9(&l1);
    eprintln!("killed at wall_ms {}", baton::peer_auth::now_unix_ms());
    let (l2, _, t2) = fleet.new_leader(&l1, t1, SETTLE).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = load.finish().await;
    assert!(got.len() > 10, "too few IDs: {}", got.len());
    for w in got.windows(2) {
        assert!(w[1].1 > w[0].1, "seq went from {:?} to {:?}", w[0], w[1]);
        assert!(w[1].0 >= w[0].0, "token went back: {:?} {:?}", w[0], w[1]);
    }
    assert_ledger_monotonic(&fleet.admin_db().await, &got).await;
    let ms = ledger_failover_ms(fleet, (&l1, t1), (&l2, t2)).await;
    (l1, t1, l2, t2, ms, kill_wall_ms)
}

/// One node's actor-trace lines (`actor-trace.jsonl` beside its config).
fn trace_lines(fleet: &Fleet, id: &str) -> Vec<serde_json::Value> {
    let dir = fleet.node(id).config.parent().unwrap().to_path_buf();
    let text = std::fs::read_to_string(dir.join("actor-trace.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// When (ms after `since_wall_ms`) node `id` first traced `actor`'s `event` at or after it.
fn first_after(
    lines: &[serde_json::Value],
    since_wall_ms: u64,
    actor: &str,
    event: &str,
) -> Option<f64> {
    lines
        .iter()
        .filter(|l| l["actor"] == actor && l["event"] == event)
        .filter_map(|l| l["wall_ms"].as_u64())
        .find(|&w| w >= since_wall_ms)
        .map(|w| (w - since_wall_ms) as f64)
}

/// The `p`-quantile (nearest rank) of `sorted`.
fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

async fn status(fleet: &Fleet, id: &str) -> serde_json::Value {
    let addr = fleet.node(id).http_addr;
    fleet.client.get(&addr, "/status").await.unwrap().json()
}

async fn metrics_text(fleet: &Fleet, id: &str) -> String {
    let addr = fleet.node(id).http_addr;
    let r = fleet.client.get(&addr, "/metrics").await.unwrap();
    String::from_utf8_lossy(&r.body).into_owned()
}

fn dropped(status: &serde_json::Value, reason: &str) -> u64 {
    status["detector"]["dropped"][reason].as_u64().unwrap_or(0)
}

/// Waits until every live member's detector sees the others alive.
async fn detector_settled(fleet: &Fleet, ids: &[String]) {
    let until = Instant::now() + SETTLE;
    'outer: loop {
        assert!(Instant::now() < until, "detectors did not settle");
        for id in ids {
            let s = status(fleet, id).await;
            let alive = s["detector"]["members"]
                .as_array()
                .map(|m| m.iter().filter(|m| m["state"] == "alive").count())
                .unwrap_or(0);
            if alive + 1 < ids.len() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue 'outer;
            }
        }
        return;
    }
}

/// `kill -9` of the leader with the detector on: replaced well inside the 3 s lease, and the
/// survivors' `/status` and `/metrics` show the confirmation and the lease ended.
async fn swim_replaces_a_killed_leader(backend: &str) {
    let _guard = serial();
    let fleet = Fleet::up_with_config(backend, 3, &backend_config(backend, true));
    let ids: Vec<String> = fleet.state().nodes.iter().map(|n| n.id.clone()).collect();
    detector_settled(&fleet, &ids).await;
    let (l1, t1, l2, t2, ms) = kill_leader_under_load(&fleet).await;
    eprintln!("{backend} + swim: kill -9 of {l1} (token {t1}) -> {l2} (token {t2}): failover {ms:.0} ms (resource clock)");
    if std::env::var_os("DETECTOR_TRACE").is_some() {
        let n = fleet.node(&l2);
        let dir = n.config.parent().unwrap().to_path_buf();
        let t = std::fs::read_to_string(dir.join("actor-trace.jsonl")).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        eprintln!("{}", lines[lines.len().saturating_sub(25)..].join("\n"));
    }
    assert!(t2 > t1);
    // The lease had at least 2 s left at the kill (renewed at most 1 s before): anything
    // sooner was the detector ending it (the takeover count below says which node did).
    assert!(
        ms < 2000.0,
        "with the detector a dead leader's 3 s lease should be ended early: failover {ms:.0} ms\n{}",
        fleet.log_tails(30)
    );
    // The survivors saw it confirmed dead, and one of them ended its lease.
    let mut takeovers = 0.0;
    for id in ids.iter().filter(|i| **i != l1) {
        let s = status(&fleet, id).await;
        let dead: Vec<&str> = s["detector"]["confirmed_dead"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert!(dead.contains(&l1.as_str()), "{id}: {s}");
        let text = metrics_text(&fleet, id).await;
        assert!(
            text.contains("baton_detector_confirmed_dead_total"),
            "{id}: no confirmation metric"
        );
        takeovers += text
            .lines()
            .find(|l| l.starts_with("baton_detector_lease_takeovers_total"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    assert!(
        takeovers >= 1.0,
        "no survivor ended the dead leader's lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_lease_with_swim_replaces_a_killed_leader_well_inside_its_ttl() {
    swim_replaces_a_killed_leader("pg-lease").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_with_swim_replaces_a_killed_leader_well_inside_its_ttl() {
    swim_replaces_a_killed_leader("etcd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_with_swim_replaces_a_killed_leader_well_inside_its_ttl() {
    swim_replaces_a_killed_leader("zk").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_with_swim_replaces_a_killed_leader_well_inside_its_ttl() {
    swim_replaces_a_killed_leader("redis").await;
}

/// Sharded (K = 4, 3 nodes): a `kill -9`ed node's shards are led again by live nodes, at a
/// higher token, well inside their 3 s leases. Without the detector this cannot happen: placement
/// counts a member down only after `down_after_ms` (2 s) of failed probes, and only then do the
/// shards' new owners campaign, for leases renewed at most 1 s before the kill (2 s left). With
/// it, placement counts the member down at its confirmation and each new owner's elector, which
/// was not a candidate when the confirmation came, ends the dead node's lease as its campaign
/// starts. Returns the ms from the kill until every one of the dead node's shards was led again.
async fn swim_moves_a_killed_nodes_shards(backend: &str) -> f64 {
    const K: u32 = 4;
    let _guard = serial();
    let base = if backend == "raft" {
        "raft-shards"
    } else {
        backend
    };
    let mut config = config_with(base, &[]);
    config.push_str("\n[detector]\nkind = \"swim\"\n");
    let fleet = Fleet::up_with_config_and(backend, 3, &config, &["--shards", "4"]);
    let ids: Vec<String> = fleet.state().nodes.iter().map(|n| n.id.clone()).collect();
    detector_settled(&fleet, &ids).await;
    // A placement where every shard is led, held for a second (a fresh fleet still moves shards
    // to members it has only just counted live).
    let led =
        |rows: &[baton_lab::fleet::NodeRow]| -> std::collections::BTreeMap<u32, (String, i64)> {
            rows.iter()
                .filter(|r| r.alive)
                .flat_map(|r| r.shards_led.iter().map(|(s, t)| (*s, (r.id.clone(), *t))))
                .collect()
        };
    let until = Instant::now() + SETTLE;
    let before = loop {
        let a = led(&baton_lab::fleet::status(&fleet.state()).await);
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let b = led(&baton_lab::fleet::status(&fleet.state()).await);
        if a.len() == K as usize && a == b {
            break b;
        }
        assert!(Instant::now() < until, "shards did not settle: {b:?}");
    };
    // On raft, the raft leader if it leads a shard: the hard case, where the shard table's
    // server dies too and the expiry must wait for (and be retried at) the next raft leader.
    let victim = match backend {
        "raft" => {
            Some(common::raft_leader(&fleet)).filter(|l| before.values().any(|(n, _)| n == l))
        }
        _ => None,
    }
    .unwrap_or_else(|| before.values().next().unwrap().0.clone());
    let moved: Vec<(u32, i64)> = before
        .iter()
        .filter(|(_, (n, _))| *n == victim)
        .map(|(s, (_, t))| (*s, *t))
        .collect();
    let killed = Instant::now();
    fleet.kill9(&victim);
    let ms = loop {
        let now = led(&baton_lab::fleet::status(&fleet.state()).await);
        let done = moved
            .iter()
            .all(|(s, t)| now.get(s).is_some_and(|(n, t2)| *n != victim && t2 > t));
        if done {
            break killed.elapsed().as_secs_f64() * 1000.0;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "{victim}'s shards {moved:?} were not led again: {now:?}\n{}",
            fleet.log_tails(30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("{backend} K={K} + swim: kill -9 of {victim} (shards {moved:?}): led again after {ms:.0} ms");
    assert!(
        ms < 2000.0,
        "with the detector a dead node's shards should move inside their leases: {ms:.0} ms\n{}",
        fleet.log_tails(30)
    );
    ms
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_lease_shards_with_swim_move_off_a_killed_node_inside_their_leases() {
    swim_moves_a_killed_nodes_shards("pg-lease").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_shards_with_swim_move_off_a_killed_node_inside_their_leases() {
    swim_moves_a_killed_nodes_shards("raft").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_lease_without_the_detector_waits_out_the_lease() {
    let _guard = serial();
    let fleet = Fleet::up_with_config("pg-lease", 3, &pg_lease_config(false));
    let (l1, t1, l2, t2, ms) = kill_leader_under_load(&fleet).await;
    eprintln!("lease: kill -9 of {l1} (token {t1}) -> {l2} (token {t2}): failover {ms:.0} ms (resource clock)");
    // The lease was renewed at most a renew interval (1 s) before the kill: 2 s of it were left.
    assert!(
        ms > 1500.0,
        "without the detector the lease must be waited out: failover {ms:.0} ms"
    );
    assert!(status(&fleet, &l2).await.get("detector").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_replayed_and_stale_datagrams_change_nothing() {
    let _guard = serial();
    let fleet = Fleet::up_with_config("pg-lease", 3, &pg_lease_config(true));
    let ids: Vec<String> = fleet.state().nodes.iter().map(|n| n.id.clone()).collect();
    detector_settled(&fleet, &ids).await;
    let (leader, _, token) = fleet.settled_leader(SETTLE, Duration::from_secs(2)).await;
    let cfg = NodeConfig::from_file(&fleet.node(&leader).config).unwrap();
    let secret = cfg.raft.secret().unwrap().unwrap();
    let target = cfg
        .detector
        .peers
        .iter()
        .find(|p| p.id == leader)
        .unwrap()
        .addr
        .clone();
    let other = ids.iter().find(|i| **i != leader).unwrap().clone();
    let other_boot = status(&fleet, &other).await["detector"]["boot"]
        .as_u64()
        .unwrap();
    let before = status(&fleet, &leader).await;

    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    // What a SWIM "member down" would carry is beside the point: none of these is decoded.
    let payload = vec![0xa5u8; 200];
    // Forged: the right shape, a member's name, a MAC under another secret.
    let evil = PeerAuth::new(b"not-the-cluster-secret-at-all", 10_000);
    let mut forger = Sealer::new(evil, &other, other_boot);
    for _ in 0..50 {
        sock.send_to(&forger.seal(&payload, now_unix_ms()), &target)
            .unwrap();
    }
    // Replayed: a member's real boot and a sequence number long since seen, under the real
    // secret (as a datagram recorded off the wire would be).
    let real = PeerAuth::new(secret.expose().as_bytes(), 10_000);
    // Sent 21 times: the first may be new to the leader (the member's early sequence numbers
    // went to other peers, and one the leader never saw, inside its 64-wide window, is not a
    // replay to it; it is then dropped as undecodable); the next 20 are replays of it whatever.
    let mut replayer = Sealer::new(real.clone(), &other, other_boot);
    let replay = replayer.seal(&payload, now_unix_ms());
    for _ in 0..21 {
        sock.send_to(&replay, &target).unwrap();
    }
    // An earlier boot of the member: a replay from before its restart.
    let mut old_boot = Sealer::new(real.clone(), &other, other_boot - 1);
    sock.send_to(&old_boot.seal(&payload, now_unix_ms()), &target)
        .unwrap();
    // Stale: a timestamp a minute old.
    let mut stale = Sealer::new(real, &other, other_boot + 1);
    sock.send_to(&stale.seal(&payload, now_unix_ms() - 60_000), &target)
        .unwrap();
    // Junk.
    sock.send_to(b"bsw1\x05hello", &target).unwrap();

    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = status(&fleet, &leader).await;
    assert!(
        dropped(&after, "bad_mac") >= dropped(&before, "bad_mac") + 50,
        "{after}"
    );
    assert!(
        dropped(&after, "replay") >= dropped(&before, "replay") + 21,
        "{after}"
    );
    assert!(
        dropped(&after, "stale") > dropped(&before, "stale"),
        "{after}"
    );
    assert!(
        dropped(&after, "malformed") > dropped(&before, "malformed"),
        "{after}"
    );
    let text = metrics_text(&fleet, &leader).await;
    assert!(
        text.contains("baton_detector_dropped_total{") && text.contains("reason=\"bad_mac\""),
        "no drop metric"
    );
    // Nothing changed: same leader, same term, nobody confirmed dead, all members alive.
    let (now_leader, _, now_token) = fleet.leader(SETTLE).await;
    assert_eq!((now_leader.as_str(), now_token), (leader.as_str(), token));
    for id in &ids {
        let s = status(&fleet, id).await;
        assert_eq!(s["detector"]["confirmations"], 0, "{id}: {s}");
        assert_eq!(s["detector"]["declared_self_dead"], 0, "{id}: {s}");
    }
    detector_settled(&fleet, &ids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_falsely_accused_live_leader_demotes_cleanly_and_its_stale_writes_are_refused() {
    let _guard = serial();
    let fleet = Fleet::up_with_config("pg-lease", 3, &pg_lease_config(true));
    let ids: Vec<String> = fleet.state().nodes.iter().map(|n| n.id.clone()).collect();
    detector_settled(&fleet, &ids).await;
    let (l1, _, t1) = fleet.settled_leader(SETTLE, Duration::from_secs(2)).await;
    let load = NextLoad::start(&fleet);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // Paused past the suspicion timeout, well inside its 3 s lease: alive, but silent. The
    // others confirm it dead, end its lease and elect while it is still paused.
    let pid = fleet.node(&l1).pid as i32;
    let db = fleet.admin_db().await;
    let paused = common::Stopped::stop(pid);
    let paused_at = Instant::now();
    let t2 = loop {
        let e: i64 = db
            .query_one("SELECT max(epoch) FROM baton_lease.leases", &[])
            .await
            .unwrap()
            .get(0);
        if e > t1 {
            break e;
        }
        assert!(
            paused_at.elapsed() < Duration::from_millis(2500),
            "no new term within 2.5 s of pausing the leader (its lease is 3 s)\n{}",
            fleet.log_tails(30)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = paused_at.elapsed();
    // Resumed while its own watchdog may still believe in the lease.
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(paused);
    let (l2, _, t2b) = fleet.new_leader(&l1, t1, SETTLE).await;
    assert!(t2b >= t2 && t2 > t1);
    let paused_for = Instant::now();
    eprintln!("{l1} (token {t1}) paused; a new term {t2} began {took:?} into the pause; {l2} leads at {t2b}");
    // It wakes, learns it was declared dead (or that its lease is gone) and demotes.
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let s = status(&fleet, &l1).await;
        if s["role"] != "leader" && s["leader"]["node_id"] == serde_json::json!(l2) {
            eprintln!(
                "{l1} follows {l2} {:?} after resuming; declared_self_dead = {}",
                paused_for.elapsed(),
                s["detector"]["declared_self_dead"]
            );
            break;
        }
        assert!(Instant::now() < until, "{l1} did not demote: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = load.finish().await;
    for w in got.windows(2) {
        assert!(w[1].1 > w[0].1, "seq went from {:?} to {:?}", w[0], w[1]);
        assert!(w[1].0 >= w[0].0, "token went back: {:?} {:?}", w[0], w[1]);
    }
    assert_ledger_monotonic(&fleet.admin_db().await, &got).await;
    // Its old term's token, with its own credentials, straight to the resource: refused.
    let db = fleet.node_db(&l1).await;
    let err = db
        .query_one("SELECT baton.fence_assert('sequence', $1, $2)", &[&t1, &l1])
        .await
        .expect_err("a stale token must be refused");
    assert_eq!(err.code().map(|c| c.code()), Some("BF409"), "{err}");
    // The trace shows the usual demotion order on the accused node: no release before the
    // work stopped (the supervisor's own invariant; here: it demoted, and a term followed).
    let (now, _, tn) = fleet.leader(SETTLE).await;
    assert!(tn >= t2, "{now} at {tn}");
}

/// The goal, measured (ignored; run by hand): per backend (`DETECTOR_BACKENDS`, comma-
/// separated; default every lease backend) first `DETECTOR_IDLE_S` (default 60) seconds of an
/// idle healthy fleet, in which no member may be confirmed dead (a false positive); then
/// `DETECTOR_KILLS` (default 10) `kill -9`s of the leader under load, each followed by a restart
/// of the killed node, with the detector on. Prints each failover (resource clock) with where
/// its time went, from the new leader's trace (ms after the kill was sent): the first survivor's
/// confirmation (detection), the lease ended, the win, the term's first fenced claim; then the
/// p50 / p99 (nearest rank) of detection and failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn measure_failover_with_swim() {
    let _guard = serial();
    let backends =
        std::env::var("DETECTOR_BACKENDS").unwrap_or_else(|_| "pg-lease,redis,etcd,zk".into());
    let kills: usize = std::env::var("DETECTOR_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let idle_s: u64 = std::env::var("DETECTOR_IDLE_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    for backend in backends.split(',') {
        let fleet = Fleet::up_with_config(backend, 3, &backend_config(backend, true));
        let ids: Vec<String> = fleet.state().nodes.iter().map(|n| n.id.clone()).collect();
        detector_settled(&fleet, &ids).await;
        // Confirmations made while the fleet started (a member not up yet) are not false
        // positives: count those made during the idle window only.
        let mut dead_counts = 0;
        for id in &ids {
            let s = status(&fleet, id).await;
            dead_counts += s["detector"]["confirmations"].as_u64().unwrap_or(0)
                + s["detector"]["declared_self_dead"].as_u64().unwrap_or(0);
        }
        tokio::time::sleep(Duration::from_secs(idle_s)).await;
        let mut false_positives = 0;
        for id in &ids {
            let s = status(&fleet, id).await;
            false_positives += s["detector"]["confirmations"].as_u64().unwrap_or(0)
                + s["detector"]["declared_self_dead"].as_u64().unwrap_or(0);
        }
        false_positives -= dead_counts;
        eprintln!("IDLE {backend}: {idle_s} s of an idle healthy fleet: {false_positives} members confirmed or declared dead");
        let mut ms = Vec::new();
        let mut detect = Vec::new();
        for _ in 0..kills {
            detector_settled(&fleet, &ids).await;
            let (l1, _, l2, _, m, killed_at) = kill_leader_under_load_at(&fleet).await;
            ms.push(m);
            let survivors: Vec<Vec<serde_json::Value>> = ids
                .iter()
                .filter(|i| **i != l1)
                .map(|i| trace_lines(&fleet, i))
                .collect();
            let detected = survivors
                .iter()
                .filter_map(|t| first_after(t, killed_at, "elector", "peer-dead"))
                .reduce(f64::min);
            if let Some(d) = detected {
                detect.push(d);
            }
            let new = trace_lines(&fleet, &l2);
            let at = |actor: &str, event: &str| {
                first_after(&new, killed_at, actor, event)
                    .map(|v| format!("{v:.0}"))
                    .unwrap_or_else(|| "-".into())
            };
            eprintln!(
                "KILL {backend}: failover {m:.0} ms; after the kill (ms): detected {}, {l2}: peer-dead {}, lease ended {}, campaign {}, won {}, elected {}, sequencer started {}, claimed {}, work started {}",
                detected.map(|d| format!("{d:.0}")).unwrap_or_else(|| "-".into()),
                at("elector", "peer-dead"),
                at("elector", "dead-holder-expired"),
                at("elector", "campaign"),
                at("elector", "won"),
                at("supervisor", "elected"),
                at("sequencer", "started"),
                at("sequencer", "claimed"),
                at("supervisor", "work-started"),
            );
            if m > 1500.0 {
                let logs = fleet.log_tails(200);
                let dead_lines: Vec<&str> = logs
                    .lines()
                    .filter(|l| l.contains("dead") || l.contains("detector"))
                    .collect();
                eprintln!("SLOW {m:.0} ms:\n{}", dead_lines.join("\n"));
            }
            fleet.start(&l1);
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let mut sorted = ms.clone();
        sorted.sort_by(f64::total_cmp);
        detect.sort_by(f64::total_cmp);
        eprintln!(
            "RESULT {backend} + swim (3 s TTL): {} kills, failover p50 {:.0} ms, p99 {:.0} ms; detection p50 {:.0} ms, p99 {:.0} ms ({} seen); idle false positives {false_positives}: {:?}",
            ms.len(),
            quantile(&sorted, 0.5),
            quantile(&sorted, 0.99),
            quantile(&detect, 0.5),
            quantile(&detect, 0.99),
            detect.len(),
            ms.iter().map(|m| m.round() as i64).collect::<Vec<_>>()
        );
    }
}
