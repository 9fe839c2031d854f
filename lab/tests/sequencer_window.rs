//! `[sequencer] mode = "window"` against real servers (the private PostgreSQL, three raft nodes):
//! IDs served from memory below a bound persisted through the fence, across a kill -9 of the
//! leader. Every acknowledged ID is unique and increasing, lies in a ledger row of its own token
//! that was written before the ID was received, and the new leader starts above the old
//! leader's highest persisted bound (not merely above the IDs it served); the history checker
//! passes every invariant (`acked_unique`, `realtime_order`, `acked_in_ledger`, ...).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use baton_lab::check::{self, load::acks_from_ops};
use baton_lab::fleet::client::NodeClient;
use baton_lab::fleet::servers::PgServer;
use baton_lab::load::{self, LoadSpec, Outcome};
use common::{assert_ledger_monotonic, config_with, next_anywhere, Fleet};

const SETTLE: Duration = Duration::from_secs(30);
/// Small, so a few seconds of load cross several extensions of the bound.
const WINDOW_IDS: i64 = 500;

/// Sub-second elections on a 2-core machine, one PostgreSQL per fleet: one test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// config/raft.toml at twice its timing (see `Fleet::raft_at_twice_the_timing`), window mode.
fn window_config() -> String {
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
    assert!(config.contains("[sequencer]\n"), "{config}");
    config.replace(
        "[sequencer]\n",
        &format!("[sequencer]\nmode = \"window\"\nwindow_ids = {WINDOW_IDS}\n"),
    )
}

fn unix_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_mode_serves_unique_increasing_ids_under_persisted_bounds_across_a_kill9() {
    let _g = SERIAL.lock().await;
    let fleet = Fleet::up_with_config("raft", 3, &window_config());
    let (l1, _, t1) = fleet.settled_leader(SETTLE, Duration::from_secs(1)).await;

    // Open-loop load with a history for the checker, and beside it one sequential client that
    // notes when (wall clock) it received each ID, to compare with the ledger's commit times.
    let targets = fleet
        .state()
        .nodes
        .iter()
        .map(|n| n.http_addr.clone())
        .collect();
    let mut spec = LoadSpec::new(targets, 400.0, Duration::from_secs(5));
    spec.connections = 8;
    let run = tokio::spawn(load::run(spec));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seq_client = {
        let (client, nodes, stop) = (fleet.client.clone(), fleet.state().nodes, stop.clone());
        tokio::spawn(async move {
            let mut got = Vec::new();
            let mut hint = None;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match next_anywhere(&client, &nodes, &mut hint).await {
                    Ok((token, seq)) => got.push((token, seq, unix_us())),
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
            got
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    fleet.kill9(&l1);
    let (l2, _, t2) = fleet.new_leader(&l1, t1, SETTLE).await;
    assert!(t2 > t1 && l2 != l1);
    let report = run.await.unwrap().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let got = seq_client.await.unwrap();
    eprint!("{}", report.render());

    let summary = report.summary();
    assert!(
        summary.tokens.contains(&t1) && summary.tokens.iter().any(|t| *t > t1),
        "tokens {:?}, first leader {t1}",
        summary.tokens
    );
    assert!(summary.ok >= 1000, "too few IDs: {summary:?}");

    // The sequential client's view: strictly increasing seq, tokens never going back.
    for w in got.windows(2) {
        assert!(w[1].1 > w[0].1, "seq went from {:?} to {:?}", w[0], w[1]);
        assert!(w[1].0 >= w[0].0, "token went from {:?} to {:?}", w[0], w[1]);
    }
    let db = fleet.admin_db().await;
    let pairs: Vec<(i64, i64)> = got.iter().map(|(t, s, _)| (*t, *s)).collect();
    assert_ledger_monotonic(&db, &pairs).await;

    // The ledger holds bounds, a window at a time, and each was written before any ID under it
    // was received.
    let rows = db
        .query(
            "SELECT token, seq_lo, seq_hi, (extract(epoch FROM committed_at) * 1e6)::bigint
               FROM baton.fence_log WHERE op = 'next' AND resource = 'sequence' ORDER BY pos",
            &[],
        )
        .await
        .unwrap();
    let rows: Vec<(i64, i64, i64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert!(rows.len() >= 3, "bounds persisted: {rows:?}");
    for (_, lo, hi, _) in &rows {
        assert_eq!(hi - lo + 1, WINDOW_IDS, "a window-mode row is one window");
    }
    for (token, seq, received_us) in &got {
        let (_, _, _, committed_us) = rows
            .iter()
            .find(|(t, lo, hi, _)| t == token && lo <= seq && seq <= hi)
            .unwrap_or_else(|| panic!("({token}, {seq}) under no persisted bound"));
        assert!(
            committed_us <= received_us,
            "({token}, {seq}) received at {received_us} µs, its bound committed at {committed_us}"
        );
    }
    // Every later term starts above everything an earlier one persisted, served or not.
    let mut highest: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for (t, lo, hi, _) in &rows {
        let e = highest.entry(*t).or_insert((*lo, *hi));
        e.0 = e.0.min(*lo);
        e.1 = e.1.max(*hi);
    }
    let terms: Vec<_> = highest.iter().collect();
    for w in terms.windows(2) {
        let ((ta, (_, hi_a)), (tb, (lo_b, _))) = (w[0], w[1]);
        assert!(
            lo_b > hi_a,
            "term {tb} starts at {lo_b}, not above term {ta}'s bound {hi_a}"
        );
    }
    let served_by_t1 = got.iter().filter(|g| g.0 == t1).map(|g| g.1).max();
    let bound_t1 = highest[&t1].1;
    eprintln!(
        "window mode: {} bounds persisted {:?}; term {t1} served up to {served_by_t1:?} below its bound {bound_t1}",
        rows.len(),
        highest
    );

    // The history checker over the ledger and the open-loop history: PASS.
    let history = fleet.path().join("history.jsonl");
    load::write_history(&history, &report.ops).unwrap();
    let mut input = check::load::read(&db, None).await.unwrap();
    input.acks = acks_from_ops("history.jsonl", &report.ops);
    let verdict = check::run(&input);
    assert!(verdict.pass, "{}", verdict.render());
    assert_eq!(verdict.acked, report.count(Outcome::Ok));
}

/// With PostgreSQL gone (kill -9) a window-mode leader keeps serving the IDs left below its
/// persisted bound, and nothing above it: once they are used up each request is answered 503
/// (the extension cannot be written). When PostgreSQL is back on the same port and data, the
/// next bound goes through under the same term and IDs resume above the old bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_mode_serves_below_its_bound_through_a_database_outage_and_nothing_above_it() {
    let _g = SERIAL.lock().await;
    let fleet = Fleet::up_with_config("raft", 3, &window_config());
    let (_, addr, token) = fleet.settled_leader(SETTLE, Duration::from_secs(1)).await;
    let until = Instant::now() + SETTLE;
    let mut last = loop {
        assert!(Instant::now() < until, "the leader never served an ID");
        if let Ok(r) = fleet.client.post(&addr, "/next").await {
            if r.status == 200 {
                break r.json()["seq"].as_i64().unwrap();
            }
        }
    };
    let db = fleet.admin_db().await;
    let bound: i64 = db
        .query_one(
            "SELECT max(seq_hi) FROM baton.fence_log WHERE op = 'next' AND token = $1",
            &[&token],
        )
        .await
        .unwrap()
        .get(0);
    drop(db);
    let pg = fleet.state().postgres;
    {
        let pg = pg.clone();
        tokio::task::spawn_blocking(move || pg.kill9())
            .await
            .unwrap()
            .expect("kill -9 PostgreSQL");
    }
    // What is left below the bound (at most a window) is served; then one request is refused,
    // once the node's own 5 s bound on a request passes (a client that waits longer).
    let patient = NodeClient::new(Duration::from_secs(15));
    let mut served = 0;
    let refused = loop {
        let r = patient.post(&addr, "/next").await.unwrap();
        if r.status != 200 {
            break r;
        }
        let seq = r.json()["seq"].as_i64().unwrap();
        assert!(
            seq > last && seq <= bound,
            "served {seq} (last {last}, bound {bound})"
        );
        last = seq;
        served += 1;
        assert!(
            served <= WINDOW_IDS,
            "served more than a window with PostgreSQL down"
        );
    };
    assert_eq!(
        refused.status,
        503,
        "{:?}",
        String::from_utf8_lossy(&refused.body)
    );
    assert_eq!(
        last, bound,
        "the IDs below the bound were served to the last"
    );
    eprintln!("with PostgreSQL down: {served} IDs served up to the bound {bound}, then 503");

    let listen: Vec<std::net::IpAddr> = Vec::new();
    tokio::task::spawn_blocking(move || {
        PgServer::start_on(&pg.root, pg.port, &listen).expect("restart PostgreSQL")
    })
    .await
    .unwrap();
    let until = Instant::now() + SETTLE;
    let (t, resumed) = loop {
        let r = fleet.client.post(&addr, "/next").await;
        if let Some(r) = r.as_ref().ok().filter(|r| r.status == 200) {
            let v = r.json();
            break (v["token"].as_i64().unwrap(), v["seq"].as_i64().unwrap());
        }
        assert!(
            Instant::now() < until,
            "no ID within 30 s of the restart: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(t, token, "the same term carries on");
    assert!(resumed > bound, "resumed at {resumed}, old bound {bound}");
}
