//! Issue 3's end-to-end checks on the raft backend: real `baton node` processes electing among
//! themselves (openraft over their own authenticated peer listeners), the private PostgreSQL as the fenced resource,
//! every claim checked against the resource's ledger (`baton.fence_log`, its own clock).
//!
//! The peer cut uses the raft backend's fault hook (`<state_dir>/faults/isolate-peers`, see
//! `src/backends/raft/faults.rs`): no network namespaces needed.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton::config::NodeConfig;
use baton_lab::fleet::client::NodeClient;
use baton_lab::fleet::servers::PgServer;
use common::{assert_ledger_monotonic, issued, next_anywhere, strip_ansi, Fleet, NextLoad, BATON};

const SETTLE: Duration = Duration::from_secs(30);

/// Sub-second elections on a 2-core machine, one PostgreSQL per fleet: one test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The client view: seq strictly increasing, tokens never going back.
fn assert_client_view_monotonic(got: &[(i64, i64)]) {
    for w in got.windows(2) {
        assert!(w[1].1 > w[0].1, "seq went from {:?} to {:?}", w[0], w[1]);
        assert!(
            w[1].0 >= w[0].0,
            "token went back from {:?} to {:?}",
            w[0],
            w[1]
        );
    }
}

/// `first(new) − last(old)` in ms on the resource's clock, over all ops (`op = 'next'` if `next_only`).
async fn gap_ms(db: &tokio_postgres::Client, old: i64, new: i64, next_only: bool) -> f64 {
    let filter = if next_only { "AND op = 'next'" } else { "" };
    let sql = format!(
        "SELECT (extract(epoch FROM (SELECT min(committed_at) FROM baton.fence_log WHERE token = $2 {filter})
                                  - (SELECT max(committed_at) FROM baton.fence_log WHERE token = $1 {filter})) * 1000)::float8"
    );
    let v: Option<f64> = db.query_one(&sql, &[&old, &new]).await.unwrap().get(0);
    v.unwrap_or_else(|| panic!("fence_log lacks rows of token {old} or {new}"))
}

fn leaders_acting(text: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with("leaders_acting{") || l.starts_with("leaders_acting "))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .expect("leaders_acting exported")
}

/// Several samples of the whole fleet: exactly one node says leader (always the same one, with
/// the same token), all others follow it and redirect `/next` to it, and `leaders_acting` sums to 1.
async fn assert_exactly_one_leader(fleet: &Fleet, n: usize) {
    let (leader, addr, token) = fleet.settled_leader(SETTLE, Duration::from_secs(1)).await;
    assert!(token > 0);
    assert_eq!(fleet.state().nodes.len(), n);
    for _ in 0..8 {
        let rows = baton_lab::fleet::status(&fleet.state()).await;
        let leaders: Vec<_> = rows
            .iter()
            .filter(|r| r.role.as_deref() == Some("leader"))
            .collect();
        assert_eq!(leaders.len(), 1, "{rows:?}");
        assert_eq!(
            (leaders[0].id.as_str(), leaders[0].token),
            (leader.as_str(), Some(token)),
            "{rows:?}"
        );
        for r in rows.iter().filter(|r| r.id != leader) {
            assert_eq!(r.role.as_deref(), Some("follower"), "{rows:?}");
            assert_eq!(r.leader.as_deref(), Some(leader.as_str()), "{rows:?}");
            assert_eq!(r.token, None, "{rows:?}");
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let ok = fleet.client.post(&addr, "/next").await.unwrap();
    assert_eq!(ok.status, 200, "{:?}", ok.body);
    assert_eq!(ok.json()["token"].as_i64(), Some(token));
    let mut acting = 0.0;
    for node in fleet.state().nodes {
        if node.id != leader {
            let r = fleet.client.post(&node.http_addr, "/next").await.unwrap();
            assert_eq!(r.status, 409, "follower {} answered {:?}", node.id, r.body);
            assert_eq!(r.leader_header.as_deref(), Some(addr.as_str()));
        }
        let text = fleet
            .client
            .get(&node.http_addr, "/metrics")
            .await
            .unwrap()
            .body;
        acting += leaders_acting(&String::from_utf8_lossy(&text));
    }
    assert_eq!(acting, 1.0, "leaders_acting summed over the fleet");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_among_three_with_raft_as_the_default_backend() {
    let _g = SERIAL.lock().await;
    // No --backend: raft is the default.
    let dir = tempfile::Builder::new()
        .prefix("baton-test-")
        .tempdir()
        .unwrap();
    let fleet = Fleet {
        dir,
        client: NodeClient::new(Duration::from_secs(3)),
    };
    let out = Command::new(BATON)
        .args(["fleet", "up", "3", "--dir", fleet.path().to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fleet.state().backend, baton::backends::BackendKind::Raft);
    // Its nodes got config/raft.toml as their base (the raft timing, not the generic defaults).
    let cfg = NodeConfig::from_file(&fleet.node("n1").config).unwrap();
    assert_eq!(
        (
            cfg.election_timeout_ms.as_str(),
            cfg.lease_ttl_ms,
            cfg.renew_interval_ms
        ),
        ("150-250", 150, 40)
    );
    assert_eq!(cfg.raft.peers.len(), 3);
    assert_exactly_one_leader(&fleet, 3).await;
    let (_, leader_addr, _) = fleet.leader(SETTLE).await;
    fleet.assert_lease_left_within_ttl(&leader_addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_among_five() {
    let _g = SERIAL.lock().await;
    let fleet = Fleet::raft_at_twice_the_timing(5);
    assert_exactly_one_leader(&fleet, 5).await;
}

/// kill -9 of the leader under sequential load: a new leader with a higher term serves, and seq
/// keeps strictly increasing (client view and ledger); failover is printed from the ledger.
///
/// On a loaded 2-core machine the first leader after a kill can miss its first renewal (only two
/// nodes are left to form a quorum; CI saw it with the default 150 ms grant) and hand over again
/// before it serves an ID. That is the lease working, so the test waits for a settled leader
/// after each kill and measures each failover to the first term after the killed one that served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_leader_new_leader_higher_token_seq_strictly_increases() {
    let _g = SERIAL.lock().await;
    let fleet = Fleet::raft_at_twice_the_timing(3);
    let (l1, _, t1) = fleet.settled_leader(SETTLE, Duration::from_secs(1)).await;
    let load = NextLoad::start(&fleet);
    tokio::time::sleep(Duration::from_millis(700)).await;

    let killed_at = Instant::now();
    fleet.kill9(&l1);
    let (first, _, _) = fleet.new_leader(&l1, t1, SETTLE).await;
    let observed = killed_at.elapsed();
    assert_ne!(first, l1);
    let (l2, addr2, t2) = fleet
        .settled_leader(SETTLE, Duration::from_millis(700))
        .await;
    assert!(t2 > t1 && l2 != l1);
    // The killed node comes back with its state and follows; a second kill moves on again.
    fleet.start(&l1);
    let (l3, _, t3) = fleet.leader(SETTLE).await;
    assert_eq!(
        (l3.as_str(), t3),
        (l2.as_str(), t2),
        "a restarted follower disturbed the leader"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    fleet.kill9(&l2);
    let (l4, _, t4) = fleet.new_leader(&l2, t2, SETTLE).await;
    fleet
        .settled_leader(SETTLE, Duration::from_millis(700))
        .await;
    let got = load.finish().await;

    let r = fleet.client.post(&addr2, "/next").await;
    assert!(r.is_err(), "the killed leader answered");
    let tokens: BTreeSet<i64> = got.iter().map(|g| g.0).collect();
    let served_after = |t: i64| tokens.range(t + 1..).next().copied();
    let (after1, after2) = (served_after(t1), served_after(t2));
    assert!(
        tokens.contains(&t1) && tokens.contains(&t2) && after2.is_some(),
        "tokens seen {tokens:?}, leaders {l1}:{t1} {l2}:{t2} {l4}:{t4}"
    );
    assert!(got.len() > 50, "too few IDs: {}", got.len());
    assert_client_view_monotonic(&got);

    let db = fleet.admin_db().await;
    assert_ledger_monotonic(&db, &got).await;
    let f1 = gap_ms(&db, t1, after1.unwrap(), true).await;
    let f2 = gap_ms(&db, t2, after2.unwrap(), true).await;
    eprintln!("raft kill -9 failover (resource clock): {f1:.0} ms, {f2:.0} ms; first observed by status after {observed:?}; tokens that served {tokens:?}");
    for f in [f1, f2] {
        assert!(f > 0.0 && f < 3000.0, "kill -9 failover {f} ms");
    }
}

/// `baton fleet kill` every node, then `baton fleet start` every node: the terms were persisted,
/// so every token accepted after the restart is above every token accepted before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_fleet_restart_every_token_after_exceeds_every_token_before() {
    let _g = SERIAL.lock().await;
    let fleet = Fleet::raft_at_twice_the_timing(3);
    let db = fleet.admin_db().await;
    let mut hint = None;
    // Two terms before the restart, so "before" is more than one token.
    let (l1, _, t1) = fleet.leader(SETTLE).await;
    for _ in 0..20 {
        next_anywhere(&fleet.client, &fleet.state().nodes, &mut hint)
            .await
            .unwrap();
    }
    fleet.kill9(&l1);
    fleet.new_leader(&l1, t1, SETTLE).await;
    fleet.start(&l1);
    fleet.leader(SETTLE).await;
    for _ in 0..20 {
        next_anywhere(&fleet.client, &fleet.state().nodes, &mut hint)
            .await
            .unwrap();
    }
    for n in fleet.state().nodes {
        fleet.kill9(&n.id);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Read once every node is dead: the leader's scheduler ticks on until its kill, so a read
    // taken before the kills could miss its last writes and count them as "after".
    let row = db
        .query_one(
            "SELECT max(pos), max(token), count(DISTINCT token) FROM baton.fence_log",
            &[],
        )
        .await
        .unwrap();
    let (pos_before, max_before, distinct_before): (i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2));
    assert!(
        distinct_before >= 2,
        "expected two terms before the restart"
    );
    for n in fleet.state().nodes {
        fleet.start(&n.id);
    }
    let (_, addr, t_after) = fleet.leader(SETTLE).await;
    assert!(
        t_after > max_before,
        "leader token {t_after} after the restart, {max_before} before"
    );
    for _ in 0..20 {
        next_anywhere(&fleet.client, &fleet.state().nodes, &mut hint)
            .await
            .unwrap();
    }
    assert_eq!(fleet.post_at_leader(&addr, "/next").await.status, 200);
    let row = db
        .query_one(
            "SELECT min(token), count(*) FROM baton.fence_log WHERE pos > $1",
            &[&pos_before],
        )
        .await
        .unwrap();
    let (min_after, rows_after): (Option<i64>, i64) = (row.get(0), row.get(1));
    assert!(
        rows_after >= 20,
        "only {rows_after} accepted writes after the restart"
    );
    let min_after = min_after.unwrap();
    assert!(min_after > max_before, "a token accepted after the restart ({min_after}) is not above every token before it ({max_before})");
    assert_ledger_monotonic(&db, &[]).await;
}

fn isolate_file(fleet: &Fleet, id: &str) -> PathBuf {
    let cfg = NodeConfig::from_file(&fleet.node(id).config).unwrap();
    baton::backends::raft::faults::isolate_peers_path(&cfg.state_dir)
}

/// A leader cut from its peers (the `isolate-peers` hook: raft traffic dropped both ways, clients
/// and PostgreSQL still reachable) keeps being asked for IDs, but stops acting on its own — its
/// last accepted write is before the new leader's first, and the fence never had to refuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_leader_stops_acting_before_the_new_leader_writes() {
    let _g = SERIAL.lock().await;
    let fleet = Fleet::raft_at_twice_the_timing(3);
    let (l1, addr1, t1) = fleet.leader(SETTLE).await;
    let load = NextLoad::start(&fleet);
    // A second client talks to the old leader only, all along: it would see any write it still made.
    let stop_direct = Arc::new(AtomicBool::new(false));
    let direct = {
        let (client, addr, flag) = (fleet.client.clone(), addr1.clone(), stop_direct.clone());
        tokio::spawn(async move {
            let mut ok = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                match client.post(&addr, "/next").await {
                    Ok(r) if r.status == 200 => ok.push((
                        r.json()["token"].as_i64().unwrap(),
                        r.json()["seq"].as_i64().unwrap(),
                    )),
                    _ => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
            ok
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;

    let file = isolate_file(&fleet, &l1);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, b"").unwrap();
    let cut_at = Instant::now();

    // The other two elect a new leader among themselves.
    let others: Vec<_> = fleet
        .state()
        .nodes
        .into_iter()
        .filter(|n| n.id != l1)
        .collect();
    let (l2, t2) = loop {
        let mut seen = None;
        for n in &others {
            if let Ok(r) = fleet.client.get(&n.http_addr, "/status").await {
                let st = r.json();
                if st["role"] == "leader" && st["fence_token"].as_i64().is_some_and(|t| t > t1) {
                    seen = Some((n.id.clone(), st["fence_token"].as_i64().unwrap()));
                }
            }
        }
        if let Some(s) = seen {
            break s;
        }
        assert!(
            cut_at.elapsed() < SETTLE,
            "no new leader among {others:?} after isolating {l1}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The isolated node, still reachable by clients, no longer says it leads and serves nothing.
    let st = fleet.client.get(&addr1, "/status").await.unwrap().json();
    assert_ne!(
        st["role"], "leader",
        "isolated {l1} still says leader: {st}"
    );
    assert_ne!(
        fleet.client.post(&addr1, "/next").await.unwrap().status,
        200
    );
    let m = fleet.client.get(&addr1, "/metrics").await.unwrap().body;
    assert_eq!(leaders_acting(&String::from_utf8_lossy(&m)), 0.0);
    tokio::time::sleep(Duration::from_millis(700)).await;

    // Heal: the old leader rejoins as a follower of the new one, which keeps leading.
    std::fs::remove_file(&file).unwrap();
    let (l3, _, t3) = fleet.leader(SETTLE).await;
    assert_eq!(
        (l3.as_str(), t3),
        (l2.as_str(), t2),
        "healing {l1} disturbed the new leader\n{}",
        fleet.log_tails(60)
    );
    stop_direct.store(true, Ordering::Relaxed);
    let got = load.finish().await;
    let direct = direct.await.unwrap();
    assert!(
        direct.iter().all(|(t, _)| *t == t1),
        "the old leader's address served another token"
    );
    assert!(
        got.iter().any(|g| g.0 == t2),
        "the new leader never served the load"
    );
    assert_client_view_monotonic(&got);

    let db = fleet.admin_db().await;
    assert_ledger_monotonic(&db, &got).await;
    let row = db
        .query_one(
            "SELECT (SELECT max(committed_at) FROM baton.fence_log WHERE token = $1 AND holder = $2)
                  < (SELECT min(committed_at) FROM baton.fence_log WHERE token = $3 AND holder = $4),
                    (SELECT count(*) FROM baton.fence_log WHERE token = $1),
                    (SELECT count(*) FROM baton.fence_rejections WHERE token = $1 AND holder = $2)",
            &[&t1, &l1, &t2, &l2],
        )
        .await
        .unwrap();
    let (before, old_rows, refused): (Option<bool>, i64, i64) =
        (row.get(0), row.get(1), row.get(2));
    assert!(old_rows > 0, "the old leader wrote nothing before the cut");
    assert_eq!(
        before,
        Some(true),
        "the isolated leader's last accepted write is not before the new leader's first"
    );
    assert_eq!(
        refused, 0,
        "the isolated leader kept acting until the fence refused it"
    );
    let gap = gap_ms(&db, t1, t2, false).await;
    eprintln!("isolated leader {l1} (term {t1}): its last write {gap:.0} ms before {l2}'s (term {t2}) first");
    assert!(gap > 0.0);
}

/// `POST /stepdown?to=X`: X leads next, after a positive dark time (old's last row → new's first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stepdown_to_named_node_hands_over_with_positive_dark_time() {
    let _g = SERIAL.lock().await;
    let fleet = Fleet::raft_at_twice_the_timing(3);
    let (mut leader, mut addr, mut token) = fleet.leader(SETTLE).await;
    let load = NextLoad::start(&fleet);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let db = fleet.admin_db().await;
    let mut darks = Vec::new();
    // Twice, to a different named follower each time.
    let mut round = 0;
    let mut moved_on_its_own = 0;
    while round < 2 {
        let target = fleet
            .state()
            .nodes
            .iter()
            .map(|n| n.id.clone())
            .filter(|id| *id != leader)
            .nth(round % 2)
            .unwrap();
        let r = fleet
            .client
            .post(&addr, &format!("/stepdown?to={target}"))
            .await
            .unwrap();
        // Raft's default lease is 150 ms: on a loaded 2-core machine leadership can move on its
        // own between finding the leader and asking it to step down (409 not_leader). That is
        // a liveness blip, not this test's subject: find the leader again and retry the round.
        if r.status == 409 && moved_on_its_own < 3 {
            moved_on_its_own += 1;
            (leader, addr, token) = fleet.leader(SETTLE).await;
            continue;
        }
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(
            r.json()["stepped_down"]["successor"].as_str(),
            Some(target.as_str())
        );
        let (next, next_addr, next_token) = fleet.new_leader(&leader, token, SETTLE).await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        // Whoever leads next, the old term's last write precedes the new term's first.
        let dark = gap_ms(&db, token, next_token, false).await;
        eprintln!(
            "step-down {leader} -> {next} (asked for {target}): dark {dark:.1} ms (resource clock)"
        );
        assert!(dark > 0.0, "step-down overlap: {dark} ms");
        darks.push(dark);
        // The same blip after the hand-over: a third node whose election timer ran out (its
        // heartbeats late on a loaded machine) can win the term the named one was sent to win.
        // Tolerated a few times, never as the rule.
        let handed_over = next == target;
        (leader, addr, token) = (next, next_addr, next_token);
        if !handed_over && moved_on_its_own < 3 {
            moved_on_its_own += 1;
            continue;
        }
        assert!(handed_over, "stepped down to {target}, but {leader} leads");
        round += 1;
    }
    let got = load.finish().await;
    assert_client_view_monotonic(&got);
    assert_ledger_monotonic(&db, &got).await;
    assert!(darks.iter().all(|d| *d < 3000.0), "dark times {darks:?}");
}

/// Pinned from the nemesis (issue 11): a follower killed, its state dir wiped (raft log and vote
/// gone) and restarted under its old id. Its leader then saw that follower's log go backwards,
/// and openraft asserted on it: RaftCore panicked, the leader process stayed up without raft, and
/// once two of three members had died that way the fleet had no quorum for good. Now the leader
/// resets that follower's progress (`allow_log_reversion`): the fleet keeps one leader, the wiped
/// member catches up, and leadership can be handed to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_with_a_wiped_disk_rejoins_under_its_old_id() {
    let _g = SERIAL.lock().await;
    let fleet = Fleet::raft_at_twice_the_timing(3);
    let (leader, addr, token) = fleet.leader(SETTLE).await;
    // A few hand-overs first, so the follower's matching log index is well past the start.
    let (mut leader, mut addr, mut token) = (leader, addr, token);
    for _ in 0..3 {
        let r = fleet.client.post(&addr, "/stepdown").await.unwrap();
        assert_eq!(r.status, 200, "{:?}", r.body);
        (leader, addr, token) = fleet.new_leader(&leader, token, SETTLE).await;
    }
    let wiped = fleet
        .state()
        .nodes
        .iter()
        .find(|n| n.id != leader)
        .expect("a follower")
        .id
        .clone();
    fleet.kill9(&wiped);
    let state = fleet.state();
    let until = Instant::now() + Duration::from_secs(5);
    while baton_lab::fleet::servers::pid_alive(state.node(&wiped).unwrap().pid) {
        assert!(Instant::now() < until, "{wiped} survived kill -9");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let removed = state.wipe_node_state(&wiped).expect("wipe");
    assert!(removed.iter().any(|r| r == "raft"), "{removed:?}");
    fleet.start(&wiped);
    // Replication to the reverted follower is what asserted; give it a few heartbeats.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for n in fleet.state().nodes {
        let log = std::fs::read_to_string(&n.log).unwrap_or_default();
        assert!(
            !log.contains("panicked at"),
            "{} panicked:\n{}",
            n.id,
            log.lines()
                .filter(|l| l.contains("panicked") || l.contains("reversion"))
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    // Still one leader, and it can hand over to the member that lost its disk.
    let (l2, a2, t2) = fleet.leader(SETTLE).await;
    assert!(t2 >= token);
    let r = fleet
        .client
        .post(&a2, &format!("/stepdown?to={wiped}"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    let (l3, _, t3) = fleet.new_leader(&l2, t2, SETTLE).await;
    assert!(t3 > t2);
    assert_eq!(
        l3, wiped,
        "the hand-over went to {l3}, not the wiped member"
    );
    // Settled: one leader, every follower agreeing, exactly one acting. The member that just
    // took over was empty seconds ago; on a loaded machine its first renewals can miss the
    // 150 ms grant once (it demotes and wins again: safe), so wait for a steady leadership first.
    wait_steady_leader(&fleet, Duration::from_secs(2)).await;
    assert_exactly_one_leader(&fleet, 3).await;
}

/// Waits (at most [`SETTLE`]) until one node has reported itself leader under one token for
/// `hold` without a break.
async fn wait_steady_leader(fleet: &Fleet, hold: Duration) {
    let until = Instant::now() + SETTLE;
    let mut since: Option<(String, Option<i64>, Instant)> = None;
    loop {
        let rows = baton_lab::fleet::status(&fleet.state()).await;
        let leaders: Vec<_> = rows
            .iter()
            .filter(|r| r.role.as_deref() == Some("leader"))
            .map(|r| (r.id.clone(), r.token))
            .collect();
        since = match (leaders.as_slice(), since) {
            ([(id, tok)], Some((sid, stok, t))) if *id == sid && *tok == stok => {
                if t.elapsed() >= hold {
                    return;
                }
                Some((sid, stok, t))
            }
            ([(id, tok)], _) => Some((id.clone(), *tok, Instant::now())),
            _ => None,
        };
        assert!(Instant::now() < until, "no steady leader: {rows:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The fenced resource goes away under a raft leader (PostgreSQL killed -9; the raft lease does
/// not depend on it) and comes back on the same port and data. While it is down `POST /next`
/// is answered 503 promptly, never a hang and never an ID that is not durable, and the leader
/// says so in its log once, not once per failed commit. Once PostgreSQL is back, IDs are served
/// again above every ID served before, and the log says when commits went through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_goes_away_gets_prompt_503s_and_one_warning_then_ids_resume() {
    let _g = SERIAL.lock().await;
    let fleet = Fleet::raft_at_twice_the_timing(3);
    let (leader, addr, token) = fleet.settled_leader(SETTLE, Duration::from_secs(1)).await;
    let mut got = Vec::new();
    let until = Instant::now() + SETTLE;
    while got.len() < 20 {
        assert!(Instant::now() < until, "the leader never served an ID");
        if let Ok(r) = fleet.client.post(&addr, "/next").await {
            if r.status == 200 {
                got.push(issued(&r));
            }
        }
    }

    let pg = fleet.state().postgres;
    let killed = {
        let pg = pg.clone();
        tokio::task::spawn_blocking(move || pg.kill9())
            .await
            .unwrap()
            .expect("kill -9 PostgreSQL")
    };
    // Twenty requests while it is down: each answered 503, each within the fence's bound.
    for i in 0..20 {
        let asked = Instant::now();
        let r = fleet
            .client
            .post(&addr, "/next")
            .await
            .unwrap_or_else(|e| panic!("request {i} with PostgreSQL down got no answer: {e}"));
        assert_eq!(
            r.status,
            503,
            "request {i} with PostgreSQL down: {:?}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(
            asked.elapsed() < Duration::from_secs(4),
            "request {i} took {:?}",
            asked.elapsed()
        );
    }
    let log_of = |id: &str| strip_ansi(&std::fs::read_to_string(fleet.node(id).log).unwrap());
    let failing = "sequencer: a group commit failed for want of the database";
    let log = log_of(&leader);
    assert_eq!(
        log.matches(failing).count(),
        1,
        "{leader} must warn once for the whole outage (killed {killed:?}):\n{log}"
    );

    let listen: Vec<std::net::IpAddr> = Vec::new();
    tokio::task::spawn_blocking(move || {
        PgServer::start_on(&pg.root, pg.port, &listen).expect("restart PostgreSQL")
    })
    .await
    .unwrap();
    let until = Instant::now() + SETTLE;
    let resumed = loop {
        let r = fleet.client.post(&addr, "/next").await;
        if let Some(r) = r.as_ref().ok().filter(|r| r.status == 200) {
            break issued(r);
        }
        assert!(
            Instant::now() < until,
            "no ID served within 30 s of the restart; last answer {r:?}\n{}",
            fleet.log_tails(30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    got.push(resumed);
    assert_client_view_monotonic(&got);
    let db = fleet.admin_db().await;
    assert_ledger_monotonic(&db, &got).await;
    // The same term carried on (nothing about the raft lease changed), so its log closes the
    // outage; a new term would not have been failing.
    assert_eq!(resumed.0, token, "a new term served after the restart");
    let log = log_of(&leader);
    assert!(
        log.contains("sequencer: group commits go through again"),
        "{leader} did not log the end of the outage:\n{log}"
    );
    eprintln!("{leader} logged the outage's edges; resumed at {resumed:?}");
}
