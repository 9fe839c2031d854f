//! Issue 5's chaos tooling against real fleets in network namespaces (needs root): partition the
//! leader from etcd / from its raft peers while sending it `POST /next` directly, and pause an
//! etcd leader past its lease. Each test checks the client's view, the fence ledger
//! (`fence_log`, `fence_rejections`), the old leader's return as a follower, and that `fleet
//! down` leaves no namespace, link or rule behind.

// The serializing std Mutex is held across awaits on purpose: each test owns its runtime.
#![allow(clippy::await_holding_lock)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::clock::monotonic_ns;
use baton_lab::chaos::{self, FaultReport};
use baton_lab::fleet::client::NodeClient;
use baton_lab::fleet::FleetState;
use common::Fleet;

/// One fleet at a time: they share the two cores, and the namespaces are easier to audit.
static SERIAL: Mutex<()> = Mutex::new(());

/// One `POST /next` sent to a fixed node.
#[derive(Clone, Debug)]
struct Call {
    sent_ns: u64,
    done_ns: u64,
    /// HTTP status, or `None` for a transport error / client timeout.
    status: Option<u16>,
    token: Option<i64>,
    seq: Option<i64>,
    code: String,
}

/// Sends `POST /next` to `addr` every ~20 ms until `stop`, recording every call.
fn hammer(addr: String, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<Call>> {
    tokio::spawn(async move {
        let client = NodeClient::new(Duration::from_secs(2));
        let mut calls = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            calls.push(call_next(&client, &addr).await);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        calls
    })
}

async fn call_next(client: &NodeClient, addr: &str) -> Call {
    let sent_ns = monotonic_ns();
    let r = client.post(addr, "/next").await;
    let done_ns = monotonic_ns();
    match r {
        Ok(r) => {
            let v = r.json();
            Call {
                sent_ns,
                done_ns,
                status: Some(r.status.as_u16()),
                token: v["token"].as_i64(),
                seq: v["seq"].as_i64(),
                code: v["error"].as_str().unwrap_or("").to_owned(),
            }
        }
        Err(e) => Call {
            sent_ns,
            done_ns,
            status: None,
            token: None,
            seq: None,
            code: e.to_string(),
        },
    }
}

/// A leader other than `not`, with a token above `above`, as the other nodes report it (asked
/// concurrently, never the cut-off or paused node: it would stall each round). `(id, addr, token)`.
async fn new_leader(
    state: &FleetState,
    not: &str,
    above: i64,
    within: Duration,
) -> (String, String, i64) {
    let client = NodeClient::new(Duration::from_millis(500));
    let until = Instant::now() + within;
    loop {
        let asks = state.nodes.iter().filter(|n| n.id != not).map(|n| {
            let client = client.clone();
            async move {
                (
                    n,
                    client
                        .get(&n.http_addr, "/status")
                        .await
                        .map(|r| r.json())
                        .unwrap_or_default(),
                )
            }
        });
        let seen = futures::future::join_all(asks).await;
        if let Some((n, st)) = seen.iter().find(|(_, st)| {
            st["role"] == "leader" && st["fence_token"].as_i64().unwrap_or(0) > above
        }) {
            return (
                n.id.clone(),
                n.http_addr.clone(),
                st["fence_token"].as_i64().unwrap(),
            );
        }
        let views: Vec<_> = seen
            .iter()
            .map(|(n, st)| (n.id.clone(), st["role"].clone()))
            .collect();
        assert!(
            Instant::now() < until,
            "no new leader (not {not}, token > {above}) within {within:?}: {views:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Takes one ID from `addr` (retrying while it settles); `(token, seq, acked_at_ns)`.
async fn next_ok(addr: &str, within: Duration) -> (i64, i64, u64) {
    let client = NodeClient::new(Duration::from_secs(2));
    let until = Instant::now() + within;
    loop {
        let c = call_next(&client, addr).await;
        if c.status == Some(200) {
            return (c.token.unwrap(), c.seq.unwrap(), c.done_ns);
        }
        assert!(
            Instant::now() < until,
            "no 200 from {addr} within {within:?}: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the node at `addr` (`old_id`, the leader cut off) answers `/status` as a follower
/// of some other node. Not necessarily of the leader elected during the cut: when the old leader
/// rejoins, leadership may move once more (raft: its return can start an election), and what this
/// checks is that the old node follows, not who leads.
async fn rejoined_as_follower(addr: &str, old_id: &str, within: Duration) {
    let client = NodeClient::new(Duration::from_secs(1));
    let until = Instant::now() + within;
    loop {
        let st = client
            .get(addr, "/status")
            .await
            .map(|r| r.json())
            .unwrap_or_default();
        let leader = &st["leader"]["node_id"];
        if st["role"] == "follower" && leader.is_string() && leader != old_id {
            return;
        }
        assert!(
            Instant::now() < until,
            "{addr} ({old_id}) did not rejoin as a follower within {within:?}: {st}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the ledger says about the old and the new token.
#[derive(Debug)]
struct Ledger {
    old_last_pos: Option<i64>,
    new_first_pos: i64,
    /// `fence_log` rows of the old token after the new token's first row (must be 0).
    old_after_new: i64,
    /// `(resource, reason)` of every refused write with the old token.
    old_rejections: Vec<(String, String)>,
    /// `[seq_lo, seq_hi]` of every accepted sequence write with the old token.
    old_seq_ranges: Vec<(i64, i64, i64)>,
}

async fn ledger(fleet: &Fleet, old: i64, new: i64) -> Ledger {
    let db = fleet.admin_db().await;
    let one = |sql: &'static str, t: i64| {
        let db = &db;
        async move {
            db.query_one(sql, &[&t])
                .await
                .unwrap()
                .get::<_, Option<i64>>(0)
        }
    };
    let old_last_pos = one("SELECT max(pos) FROM baton.fence_log WHERE token = $1", old).await;
    let new_first_pos = one("SELECT min(pos) FROM baton.fence_log WHERE token = $1", new)
        .await
        .expect("the new leader wrote through the fence");
    let old_after_new: i64 = db
        .query_one(
            "SELECT count(*) FROM baton.fence_log WHERE token = $1 AND pos > $2",
            &[&old, &new_first_pos],
        )
        .await
        .unwrap()
        .get(0);
    let old_rejections = db
        .query(
            "SELECT resource, reason FROM baton.fence_rejections WHERE token = $1 ORDER BY id",
            &[&old],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let old_seq_ranges = db
        .query(
            "SELECT pos, seq_lo, seq_hi FROM baton.fence_log WHERE token = $1 AND seq_lo IS NOT NULL AND seq_hi IS NOT NULL",
            &[&old],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    Ledger {
        old_last_pos,
        new_first_pos,
        old_after_new,
        old_rejections,
        old_seq_ranges,
    }
}

/// `fleet down`, then: none of the fleet's namespaces or links exist, no relay runs.
fn down_and_check_clean(fleet: &Fleet) {
    let net = fleet.state().netns.expect("a --netns fleet");
    common::baton(&["fleet", "down", "--dir", fleet.path().to_str().unwrap()]);
    let netns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let netns = String::from_utf8_lossy(&netns.stdout);
    let links = std::process::Command::new("ip")
        .args(["-br", "link"])
        .output()
        .unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(
        !netns.contains(&net.id),
        "namespaces left after fleet down: {netns}"
    );
    assert!(
        !links.contains(&net.id),
        "links left after fleet down: {links}"
    );
    assert!(net.leftovers().is_empty(), "{:?}", net.leftovers());
    assert!(!fleet
        .path()
        .join(baton_lab::chaos::netns::NETNS_FILE)
        .exists());
}

/// Partitions the leader for `hold` while hammering it with `POST /next`, and checks everything.
async fn partition_scenario(fleet: &Fleet, hold: Duration) -> String {
    let state = fleet.state();
    let net = state
        .netns
        .clone()
        .expect("fleet up --netns records its namespaces");
    let (old_id, old_addr, t1) = fleet.leader(Duration::from_secs(30)).await;
    // The claim below (the others elect a leader while the old one is cut off) needs every
    // member up: with one already gone, the rest are no majority.
    let rows = baton_lab::fleet::status(&state).await;
    assert!(
        rows.iter().all(|r| r.alive && r.role.is_some()),
        "every member is up before the cut: {rows:?}\n{}",
        fleet.log_tails(20)
    );
    assert!(
        net.nodes
            .iter()
            .any(|n| old_addr.starts_with(&format!("{}:", n.ip))),
        "nodes listen on their namespace addresses: {old_addr}"
    );
    let (tok, _, _) = next_ok(&old_addr, Duration::from_secs(5)).await;
    assert_eq!(tok, t1);

    let stop = Arc::new(AtomicBool::new(false));
    let calls = hammer(old_addr.clone(), stop.clone());
    // The node that just answered as leader with t1 is cut, by name: on a loaded machine the
    // fault's own look for the leader could find one elected since.
    let fault = {
        let (st, id) = (state.clone(), old_id.clone());
        tokio::spawn(async move { chaos::partition_node(&st, &id, hold).await })
    };
    let (new_id, new_addr, t2) =
        new_leader(&state, &old_id, t1, hold + Duration::from_secs(10)).await;
    // The new leader's first write through the fence, acknowledged: from here on, nothing the old
    // leader does may be accepted.
    let (tok2, seq2, new_acked_ns) = next_ok(&new_addr, Duration::from_secs(10)).await;
    assert_eq!(tok2, t2);
    let report: FaultReport = fault
        .await
        .unwrap()
        .expect("partition applied, verified and healed");
    assert!(report.verified && report.node == old_id, "{report:?}");
    assert!(report.healed_at_mono_ns > report.applied_at_mono_ns);
    assert!(
        new_acked_ns < report.healed_at_mono_ns,
        "the new leader should serve while the old one is still cut off ({report:?})"
    );

    rejoined_as_follower(&old_addr, &old_id, Duration::from_secs(20)).await;
    stop.store(true, Ordering::Relaxed);
    let calls = calls.await.unwrap();

    // The client's view of the old leader.
    let ok_old: Vec<&Call> = calls.iter().filter(|c| c.status == Some(200)).collect();
    assert!(
        ok_old.iter().all(|c| c.token == Some(t1)),
        "the old node only ever answered with its own token: {ok_old:?}"
    );
    let late: Vec<&Call> = calls.iter().filter(|c| c.sent_ns > new_acked_ns).collect();
    let late_ok: Vec<&&Call> = late.iter().filter(|c| c.status == Some(200)).collect();
    assert!(
        late_ok.is_empty(),
        "the old leader answered 200 after the new leader's first write: {late_ok:?}"
    );
    let refused_during = calls
        .iter()
        .filter(|c| c.sent_ns >= report.applied_at_mono_ns && c.status != Some(200))
        .count();
    let refusals: std::collections::BTreeMap<String, usize> = calls
        .iter()
        .filter(|c| c.status != Some(200))
        .fold(Default::default(), |mut m, c| {
            *m.entry(format!(
                "{}:{}",
                c.status.map(|s| s.to_string()).unwrap_or("err".into()),
                c.code
            ))
            .or_default() += 1;
            m
        });
    assert!(
        refused_during > 0,
        "the cut-off leader refused nothing: {calls:?}"
    );
    assert!(
        late.iter()
            .all(|c| matches!(c.status, Some(409) | Some(503)) || c.status.is_none()),
        "late answers are refusals: {late:?}"
    );

    // The ledger.
    let l = ledger(fleet, t1, t2).await;
    assert_eq!(
        l.old_after_new, 0,
        "fence_log accepted the old token after the new token's first write: {l:?}"
    );
    let old_last = l
        .old_last_pos
        .expect("the old leader wrote before the fault");
    assert!(old_last < l.new_first_pos, "{l:?}");
    assert!(
        l.old_rejections
            .iter()
            .all(|(_, reason)| reason == "stale-token"),
        "{l:?}"
    );
    for c in &ok_old {
        let seq = c.seq.unwrap();
        assert!(seq < seq2, "old seq {seq} >= new leader's {seq2}");
        assert!(
            l.old_seq_ranges
                .iter()
                .any(|&(pos, lo, hi)| lo <= seq && seq <= hi && pos < l.new_first_pos),
            "acknowledged old seq {seq} is in fence_log before the new token: {l:?}"
        );
    }
    let summary = format!(
        "partition {old_id} (token {t1}) -> new leader {new_id} (token {t2}); old leader: {} ok before, {} refused after the cut {refusals:?}; fence: old last pos {old_last} < new first pos {}, {} stale-token rejections of token {t1}; held {:.2} s; rejoined as follower",
        ok_old.len(),
        refused_during,
        l.new_first_pos,
        l.old_rejections.len(),
        (report.healed_at_mono_ns - report.applied_at_mono_ns) as f64 / 1e9,
    );
    eprintln!("{summary}");
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_partitioned_leader_is_refused_then_rejoins() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let fleet = Fleet::up_with("etcd", 3, &["--netns", "--lease-ttl", "2s"]);
    // ~2 × TTL.
    partition_scenario(&fleet, Duration::from_secs(4)).await;
    down_and_check_clean(&fleet);
    eprintln!("etcd partition test took {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_leader_cut_from_peers_is_refused_then_rejoins() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    // At twice raft's shipped timing (lease 300 ms, elections 300-500 ms): a debug build on a
    // loaded 2-core machine at the shipped 150 ms lets the two survivors trade terms during the
    // cut, which is no failure of the fence but not what this test checks. 3 s is many terms.
    let fleet = Fleet::raft_at_twice_the_timing_and(3, &["--netns"]);
    partition_scenario(&fleet, Duration::from_secs(3)).await;
    down_and_check_clean(&fleet);
    eprintln!("raft partition test took {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_paused_past_its_lease_cannot_write_with_its_old_token() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let ttl = Duration::from_secs(2);
    let fleet = Fleet::up_with("etcd", 3, &["--netns", "--lease-ttl", "2s"]);
    let state = fleet.state();
    let (old_id, old_addr, t1) = fleet.leader(Duration::from_secs(30)).await;
    let (tok, _, _) = next_ok(&old_addr, Duration::from_secs(5)).await;
    assert_eq!(tok, t1);
    let old_pid = state.node(&old_id).unwrap().pid;

    let fault = {
        let st = state.clone();
        tokio::spawn(async move { chaos::pause_leader(&st, ttl + Duration::from_secs(1)).await })
    };
    let until = Instant::now() + Duration::from_secs(2);
    while chaos::faults::proc_state(old_pid) != Some('T') {
        assert!(Instant::now() < until, "the leader never stopped");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Requests that reach the frozen leader: the kernel queues them, the node handles them the
    // moment it wakes — its next protected writes.
    let frozen = (0..3)
        .map(|_| {
            let addr = old_addr.clone();
            tokio::spawn(async move {
                call_next(&NodeClient::new(Duration::from_secs(15)), &addr).await
            })
        })
        .collect::<Vec<_>>();
    let (new_id, new_addr, t2) =
        new_leader(&state, &old_id, t1, ttl + Duration::from_secs(10)).await;
    let new_seen_ns = monotonic_ns();
    let (_, seq2, new_acked_ns) = next_ok(&new_addr, Duration::from_secs(10)).await;
    let report = fault
        .await
        .unwrap()
        .expect("pause applied, verified and undone");
    assert!(report.verified && report.node == old_id, "{report:?}");
    // A pause past the lease: the successor is elected while the old leader sleeps. (Its first
    // write normally lands before the wake too, unless the old leader froze inside a fenced
    // transaction holding the resource row lock: then the successor's claim waits for the wake.)
    assert!(
        new_seen_ns < report.healed_at_mono_ns,
        "no successor while the old leader slept: pause too short for this machine (new leader seen {:.3} s, acked {:.3} s after the pause began; {report:?})",
        new_seen_ns.saturating_sub(report.applied_at_mono_ns) as f64 / 1e9,
        new_acked_ns.saturating_sub(report.applied_at_mono_ns) as f64 / 1e9,
    );
    let mut woke: Vec<Call> = Vec::new();
    for f in frozen {
        woke.push(f.await.unwrap());
    }
    let client = NodeClient::new(Duration::from_secs(3));
    for _ in 0..3 {
        woke.push(call_next(&client, &old_addr).await);
    }
    let answers: Vec<String> = woke
        .iter()
        .map(|c| {
            format!(
                "{}:{}",
                c.status.map(|s| s.to_string()).unwrap_or("err".into()),
                c.code
            )
        })
        .collect();
    rejoined_as_follower(&old_addr, &old_id, Duration::from_secs(20)).await;

    let l = ledger(&fleet, t1, t2).await;
    assert_eq!(
        l.old_after_new, 0,
        "fence_log accepted the old token after the new token's first write: {l:?}"
    );
    assert!(
        l.old_last_pos.expect("old leader wrote before the pause") < l.new_first_pos,
        "{l:?}"
    );
    let stale: Vec<_> = l
        .old_rejections
        .iter()
        .filter(|(_, r)| r == "stale-token")
        .collect();
    let woke_ok: Vec<&Call> = woke.iter().filter(|c| c.status == Some(200)).collect();
    for c in &woke_ok {
        // Only possible if its write landed before the new token's: then its seq is older and
        // the ledger has it before the new token's first row.
        let seq = c.seq.unwrap();
        assert!(seq < seq2 && c.token == Some(t1), "{c:?}");
        assert!(
            l.old_seq_ranges
                .iter()
                .any(|&(pos, lo, hi)| lo <= seq && seq <= hi && pos < l.new_first_pos),
            "acknowledged old seq {seq} is in fence_log before the new token: {l:?}"
        );
    }
    let outcome = if !stale.is_empty() {
        format!(
            "FENCED at the resource: {} stale-token rejection(s) of token {t1} {:?}; its /next answers after waking {answers:?}",
            stale.len(),
            stale
        )
    } else {
        let after_new: Vec<&Call> = woke.iter().filter(|c| c.sent_ns > new_acked_ns).collect();
        assert!(
            !after_new.is_empty() && after_new.iter().all(|c| c.status != Some(200)),
            "no stale-token rejection, so the awakened leader must have demoted itself before writing: {woke:?}"
        );
        format!("SELF-DEMOTED before writing (no stale-token row): its /next answers after waking {answers:?}")
    };
    eprintln!(
        "gc-pause {old_id} (token {t1}) for {:.2} s -> new leader {new_id} (token {t2}); {outcome}; fence: old last pos {:?} < new first pos {}",
        (report.healed_at_mono_ns - report.applied_at_mono_ns) as f64 / 1e9,
        l.old_last_pos,
        l.new_first_pos
    );
    down_and_check_clean(&fleet);
    eprintln!("etcd gc-pause test took {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_needs_a_netns_fleet() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fleet = Fleet::up_with("raft", 1, &[]);
    fleet.leader(Duration::from_secs(30)).await;
    let err = chaos::partition_leader(&fleet.state(), Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("--netns"), "{err}");
}
