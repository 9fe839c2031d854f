//! Issue 2's end-to-end checks on the etcd backend, against real etcd, PostgreSQL and node
//! processes started by the test itself.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{assert_ledger_monotonic, Fleet, NextLoad};
use hyper::Method;

const SETTLE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_among_three_and_followers_redirect_to_it() {
    let fleet = Fleet::up(3, &[]);
    let (leader_id, leader_addr, token) = fleet.leader(SETTLE).await;
    assert!(token > 0);

    let ok = fleet.post_at_leader(&leader_addr, "/next").await;
    assert_eq!(ok.status, 200, "{:?}", ok.body);
    assert_eq!(ok.json()["token"].as_i64(), Some(token));

    for n in fleet.state().nodes.iter().filter(|n| n.id != leader_id) {
        let r = fleet.client.post(&n.http_addr, "/next").await.unwrap();
        assert_eq!(r.status, 409, "follower {} answered {:?}", n.id, r.body);
        assert_eq!(r.leader_header.as_deref(), Some(leader_addr.as_str()));
        assert_eq!(
            r.json()["leader"]["node_id"].as_str(),
            Some(leader_id.as_str())
        );
        let st = fleet
            .client
            .get(&n.http_addr, "/status")
            .await
            .unwrap()
            .json();
        assert_eq!(st["role"], "follower");
        assert!(st["fence_token"].is_null());
    }

    // leaders_acting summed over the fleet is exactly 1, and the exposition passes promtool.
    let mut acting = 0.0;
    for n in fleet.state().nodes {
        let text = String::from_utf8(
            fleet
                .client
                .get(&n.http_addr, "/metrics")
                .await
                .unwrap()
                .body
                .to_vec(),
        )
        .unwrap();
        acting += text
            .lines()
            .find(|l| l.starts_with("leaders_acting{"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .expect("leaders_acting exported");
        let mut promtool = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect(
                "promtool (Debian package prometheus) must be installed: scripts/ensure-deps.sh",
            );
        use std::io::Write;
        promtool
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = promtool.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics on {}: {}{}",
            n.id,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(acting, 1.0);
}

/// Drives `POST /next` sequentially through a step-down and a kill -9, then checks the client's
/// view and the resource's ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seq_strictly_increases_across_stepdown_and_kill9() {
    let fleet = Fleet::up(3, &[]);
    let (l1, addr1, t1) = fleet.leader(SETTLE).await;

    let load = NextLoad::start(&fleet);
    tokio::time::sleep(Duration::from_millis(700)).await;

    let r = fleet.client.post(&addr1, "/stepdown").await.unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    let (l2, _, t2) = fleet.new_leader(&l1, t1, SETTLE).await;
    tokio::time::sleep(Duration::from_millis(700)).await;

    let killed_at = Instant::now();
    fleet.kill9(&l2);
    let (_, _, t3) = fleet.new_leader(&l2, t2, SETTLE).await;
    let failover_observed = killed_at.elapsed();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let got = load.finish().await;

    // Client view: a sequential client's answers strictly increase, under non-decreasing tokens.
    assert!(got.len() > 20, "too few IDs: {}", got.len());
    for w in got.windows(2) {
        assert!(w[1].1 > w[0].1, "seq went from {:?} to {:?}", w[0], w[1]);
        assert!(
            w[1].0 >= w[0].0,
            "token went back from {:?} to {:?}",
            w[0],
            w[1]
        );
    }
    let tokens: std::collections::BTreeSet<i64> = got.iter().map(|g| g.0).collect();
    assert!(
        tokens.contains(&t1) && tokens.contains(&t3),
        "tokens seen {tokens:?}, leaders {t1} {t2} {t3}"
    );

    // Ledger view: no range overlaps or steps back, tokens never decrease, every ID once.
    let db = fleet.admin_db().await;
    assert_ledger_monotonic(&db, &got).await;

    // Step-down gap (old leader's last write -> new leader's first write) is positive.
    let gap_ms: f64 = db
        .query_one(
            "SELECT (extract(epoch FROM (SELECT min(committed_at) FROM baton.fence_log WHERE token = $2)
                                      - (SELECT max(committed_at) FROM baton.fence_log WHERE token = $1)) * 1000)::float8",
            &[&t1, &t2],
        )
        .await
        .unwrap()
        .get(0);
    assert!(gap_ms > 0.0, "step-down overlap: gap {gap_ms} ms");
    let failover_ms: f64 = db
        .query_one(
            "SELECT (extract(epoch FROM (SELECT min(committed_at) FROM baton.fence_log WHERE token = $2 AND op = 'next')
                                      - (SELECT max(committed_at) FROM baton.fence_log WHERE token = $1 AND op = 'next')) * 1000)::float8",
            &[&t2, &t3],
        )
        .await
        .unwrap()
        .get(0);
    eprintln!("step-down gap {gap_ms:.1} ms; kill -9 failover (resource clock) {failover_ms:.0} ms; observed {failover_observed:?}");
    assert!(
        failover_ms > 0.0 && failover_ms < 3000.0 + 2000.0,
        "kill -9 failover {failover_ms} ms with a 3 s TTL"
    );
    assert!(got.len() > 20 && l2 != l1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_token_sent_straight_to_the_resource_is_rejected_and_recorded() {
    let fleet = Fleet::up(1, &[]);
    let (leader, addr, token) = fleet.leader(SETTLE).await;
    let r = fleet.post_at_leader(&addr, "/next").await;
    assert_eq!(r.status, 200);
    let node = fleet.node_db(&leader).await;
    let admin = fleet.admin_db().await;
    let last_before: i64 = admin
        .query_one(
            "SELECT last_seq FROM baton.sequence WHERE name = 'sequence'",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    // A stale token, with the leader's own credentials, straight to the function.
    let row = node
        .query_one(
            "SELECT * FROM baton.seq_commit('sequence', $1, $2, 1000000, 1000000)",
            &[&(token - 1), &leader],
        )
        .await
        .unwrap();
    assert!(!row.get::<_, bool>("accepted"));
    assert_eq!(row.get::<_, i64>("max_token"), token);
    // The current token under another holder's name: the holder is who logged in, so the
    // call is refused before the fence is even consulted.
    let err = node
        .query_one(
            "SELECT * FROM baton.seq_commit('sequence', $1, 'intruder', 1000001, 1000001)",
            &[&token],
        )
        .await
        .expect_err("a node role writing as another holder");
    assert_eq!(err.code().map(|c| c.code()), Some("42501"), "{err}");
    // The shared application role: refused on a fleet's resource.
    let err = fleet
        .app_db()
        .await
        .query_one(
            "SELECT * FROM baton.seq_commit('sequence', $1, $2, 1000001, 1000001)",
            &[&token, &leader],
        )
        .await
        .expect_err("the shared role on a fleet's resource");
    assert_eq!(err.code().map(|c| c.code()), Some("42501"), "{err}");

    let rej = admin
        .query("SELECT token, max_token, holder, max_holder, op, reason FROM baton.fence_rejections ORDER BY id", &[])
        .await
        .unwrap();
    let rows: Vec<(i64, i64, String, String, String, String)> = rej
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect();
    assert_eq!(
        rows,
        vec![(
            token - 1,
            token,
            leader.clone(),
            leader.clone(),
            "next".into(),
            "stale-token".into()
        )],
        "only the stale write is recorded"
    );
    let last_after: i64 = admin
        .query_one(
            "SELECT last_seq FROM baton.sequence WHERE name = 'sequence'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        last_after >= last_before && last_after < 1000000,
        "a rejected write changed the sequence"
    );

    // No bypass: a node's role (a member of the application role) can read or write no table.
    for sql in [
        "UPDATE baton.fenced_resource SET max_token = 0",
        "SELECT * FROM baton.fence_log",
        "INSERT INTO baton.fence_log (resource, token, holder, op) VALUES ('sequence', 1, 'x', 'next')",
        "UPDATE baton.settings SET fencing = false",
    ] {
        let err = node.batch_execute(sql).await.expect_err(sql);
        assert_eq!(err.as_db_error().map(|e| e.code().code()), Some("42501"), "{sql}: {err}");
    }
    // The leader itself was never disturbed.
    assert_eq!(fleet.post_at_leader(&addr, "/next").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_holds_leadership_and_our_nodes_take_over_after_it() {
    let fleet = Fleet::up(3, &[]);
    let (_, _, t1) = fleet.leader(SETTLE).await;
    let endpoints = fleet.state().etcd.unwrap().endpoints().join(",");
    for n in fleet.state().nodes {
        fleet.kill9(&n.id);
    }
    // etcd's own client campaigns on the same name; it wins once our dead leases expire.
    let mut elect = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &endpoints, "elect", "baton", "outsider"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcdctl (Debian package etcd-client)");
    // `etcdctl elect` prints the leader key and its value once it wins.
    let stdout = elect.stdout.take().unwrap();
    let (won_tx, won_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if line.trim() == "outsider" {
                let _ = won_tx.send(());
            }
        }
    });
    if won_rx.recv_timeout(Duration::from_secs(20)).is_err() {
        let _ = elect.kill();
        panic!("etcdctl elect never became leader");
    }
    for n in fleet.state().nodes {
        fleet.start(&n.id);
    }
    // Our nodes queue behind it: none leads, all see "outsider", /next redirects to nobody usable.
    tokio::time::sleep(Duration::from_secs(4)).await;
    for n in fleet.state().nodes {
        let st = fleet
            .client
            .get(&n.http_addr, "/status")
            .await
            .unwrap()
            .json();
        assert_ne!(
            st["role"], "leader",
            "{} leads while etcdctl holds the election",
            n.id
        );
        assert_eq!(st["leader"]["node_id"], "outsider");
        let r = fleet.client.post(&n.http_addr, "/next").await.unwrap();
        assert_eq!(r.status, 409);
        assert_eq!(r.json()["leader"]["node_id"], "outsider");
    }
    // When it ends (SIGINT: etcdctl resigns), one of ours takes over with a higher token.
    unsafe { libc::kill(elect.id() as i32, libc::SIGINT) };
    let _ = elect.wait();
    let (_, addr, t2) = fleet.leader(SETTLE).await;
    assert!(t2 > t1);
    assert_eq!(fleet.post_at_leader(&addr, "/next").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_precise_4xx_and_changes_nothing() {
    let fleet = Fleet::up(2, &[]);
    let (_, addr, token) = fleet.leader(SETTLE).await;
    assert_eq!(fleet.post_at_leader(&addr, "/next").await.status, 200);
    let db = fleet.admin_db().await;
    let snapshot = || async {
        let r = db
            .query_one(
                "SELECT (SELECT count(*) FROM baton.fence_log WHERE op = 'next'), (SELECT last_seq FROM baton.sequence WHERE name = 'sequence'),
                        (SELECT count(*) FROM baton.fence_rejections), (SELECT max_token FROM baton.fenced_resource WHERE name = 'leadership')",
                &[],
            )
            .await
            .unwrap();
        (
            r.get::<_, i64>(0),
            r.get::<_, i64>(1),
            r.get::<_, i64>(2),
            r.get::<_, i64>(3),
        )
    };
    let before = snapshot().await;

    let json = [("content-type", "application/json")];
    #[allow(clippy::type_complexity)] // a table of request cases, read row by row
    let cases: Vec<(Method, &str, Vec<(&str, &str)>, Bytes, u16, Option<&str>)> = vec![
        (
            Method::GET,
            "/next",
            vec![],
            Bytes::new(),
            405,
            Some("POST"),
        ),
        (
            Method::DELETE,
            "/status",
            vec![],
            Bytes::new(),
            405,
            Some("GET"),
        ),
        (
            Method::GET,
            "/stepdown",
            vec![],
            Bytes::new(),
            405,
            Some("POST"),
        ),
        (
            Method::POST,
            "/metrics",
            vec![],
            Bytes::new(),
            405,
            Some("GET"),
        ),
        (
            Method::POST,
            "/next",
            vec![("content-type", "text/plain")],
            Bytes::from_static(b"hello"),
            415,
            None,
        ),
        (
            Method::POST,
            "/next",
            json.to_vec(),
            Bytes::from_static(b"{\"n\":"),
            400,
            None,
        ),
        (
            Method::POST,
            "/next",
            json.to_vec(),
            Bytes::from_static(b"{\"bogus\":1}"),
            400,
            None,
        ),
        (
            Method::POST,
            "/next",
            json.to_vec(),
            Bytes::from_static(b"{\"n\":-3}"),
            400,
            None,
        ),
        (Method::POST, "/next?n=0", vec![], Bytes::new(), 400, None),
        (Method::POST, "/next?n=abc", vec![], Bytes::new(), 400, None),
        (
            Method::POST,
            "/next?n=100000",
            vec![],
            Bytes::new(),
            400,
            None,
        ),
        (Method::POST, "/next?x=1", vec![], Bytes::new(), 400, None),
        (
            Method::POST,
            "/next",
            json.to_vec(),
            Bytes::from(vec![b' '; 4096]),
            413,
            None,
        ),
        (
            Method::POST,
            "/stepdown",
            json.to_vec(),
            Bytes::from_static(b"[1,2"),
            400,
            None,
        ),
        (
            Method::POST,
            "/stepdown?to=",
            vec![],
            Bytes::new(),
            400,
            None,
        ),
        (
            Method::POST,
            "/stepdown",
            vec![("content-type", "text/csv")],
            Bytes::from_static(b"a,b"),
            415,
            None,
        ),
        (Method::GET, "/nope", vec![], Bytes::new(), 404, None),
    ];
    for (method, path, headers, body, want, allow) in cases {
        let r = fleet
            .client
            .send(method.clone(), &addr, path, &headers, body)
            .await
            .unwrap();
        assert_eq!(
            r.status.as_u16(),
            want,
            "{method} {path}: {:?}",
            String::from_utf8_lossy(&r.body)
        );
        assert!(r.json()["error"].is_string(), "{method} {path}: error body");
        if let Some(a) = allow {
            assert_eq!(r.allow.as_deref(), Some(a), "{method} {path}: Allow header");
        }
    }
    assert_eq!(
        snapshot().await,
        before,
        "a refused request changed the resource"
    );
    let (_, _, still) = fleet.leader(SETTLE).await;
    assert_eq!(still, token, "a refused request changed leadership");
}
