//! The library as a user meets it (SPEC §9): a node started in process returns a handle; closure
//! jobs get a `Term`; each supervision policy does what it says. One node on the pg-lease backend
//! with a private PostgreSQL as both its lease store and its fenced resource.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::elector::FenceToken;
use baton::leadership::Role;
use baton::node::{NodeBuilder, NodeHandle};
use baton::work::SupervisionPolicy;
use baton_lab::fleet::servers::ScratchPg;

type Pg = ScratchPg;

async fn private_pg() -> Pg {
    ScratchPg::start()
        .await
        .expect("a private PostgreSQL, migrated")
}

use common::job_node_config as node_config;

mod common;

/// Every term a job was started in, in order, and how each start ended.
#[derive(Default)]
struct Starts {
    tokens: Mutex<Vec<FenceToken>>,
}

impl Starts {
    fn tokens(&self) -> Vec<FenceToken> {
        self.tokens.lock().unwrap().clone()
    }
    async fn wait_for(&self, n: usize, within: Duration) -> Vec<FenceToken> {
        let until = Instant::now() + within;
        loop {
            let t = self.tokens();
            if t.len() >= n {
                return t;
            }
            assert!(
                Instant::now() < until,
                "only {} start(s) within {within:?}: {t:?}",
                t.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A job that fails (returns an error) on its first `failures` starts, then runs until stopped.
fn flaky_job(
    starts: Arc<Starts>,
    failures: usize,
) -> impl Fn(baton::work::Term) -> futures::future::BoxFuture<'static, anyhow::Result<()>>
       + Send
       + Sync
       + 'static {
    move |mut term| {
        let starts = starts.clone();
        Box::pin(async move {
            let n = {
                let mut t = starts.tokens.lock().unwrap();
                t.push(term.token());
                t.len()
            };
            if n <= failures {
                anyhow::bail!("simulated failure {n}");
            }
            term.stopping().await;
            Ok(())
        })
    }
}

async fn wait_leading(node: &NodeHandle, within: Duration) {
    let until = Instant::now() + within;
    while !node.is_leading() {
        assert!(Instant::now() < until, "not leading within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handle_reports_the_term_and_steps_down() {
    let pg = private_pg().await;
    let cfg = node_config(&pg, "h1");
    let ttl_ms = cfg.lease_ttl_ms;
    let starts = Arc::new(Starts::default());
    let node = NodeBuilder::new(cfg)
        .with_job("report", flaky_job(starts.clone(), 0))
        .start()
        .await
        .expect("start the node");
    wait_leading(&node, Duration::from_secs(15)).await;
    starts.wait_for(1, Duration::from_secs(5)).await;

    // The lease time left is the deadline the watchdog enforces: within (0, TTL] on every read,
    // also after renewals have moved it (reads across several renew intervals).
    for _ in 0..12 {
        let st = node.status();
        assert_eq!(st.role, Role::Leader);
        assert_eq!(st.fence_token, node.token());
        let left = st.lease_ttl_remaining_ms.expect("a leader has a deadline");
        assert!(
            left > 0 && left <= ttl_ms,
            "lease_ttl_remaining_ms {left} outside (0, {ttl_ms}]"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let token = node.token().expect("leading");
    let report = node.step_down(None).await.expect("step down");
    assert_eq!(report.token, token);
    assert!(report.released_mono_ns >= report.work_stopped_mono_ns);
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_policy_restarts_in_the_same_term_then_demotes_past_its_limit() {
    let pg = private_pg().await;
    // Fails 3 times: restarts 1 and 2 keep the term (same token); the 3rd failure exceeds
    // max = 2 and demotes; the next term (a higher token) runs it for good.
    let starts = Arc::new(Starts::default());
    let node = NodeBuilder::new(node_config(&pg, "r1"))
        .with_job_supervised(
            "flaky",
            SupervisionPolicy::Restart {
                max: 2,
                within: Duration::from_secs(60),
                backoff: Duration::from_millis(30),
            },
            flaky_job(starts.clone(), 3),
        )
        .start()
        .await
        .expect("start the node");
    let t = starts.wait_for(4, Duration::from_secs(30)).await;
    assert_eq!(t[0], t[1], "restart 1 must keep the token: {t:?}");
    assert_eq!(t[1], t[2], "restart 2 must keep the token: {t:?}");
    assert!(
        t[3] > t[2],
        "past the limit the node demotes; the next term is newer: {t:?}"
    );
    wait_leading(&node, Duration::from_secs(15)).await;
    assert_eq!(node.token(), Some(t[3]));
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demote_policy_gives_up_the_term() {
    let pg = private_pg().await;
    let starts = Arc::new(Starts::default());
    let node = NodeBuilder::new(node_config(&pg, "d1"))
        .with_job("flaky", flaky_job(starts.clone(), 1))
        .start()
        .await
        .expect("start the node");
    let t = starts.wait_for(2, Duration::from_secs(30)).await;
    assert!(t[1] > t[0], "a failed work must cost the term: {t:?}");
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_policy_releases_then_stops_the_node() {
    let pg = private_pg().await;
    let cfg = node_config(&pg, "s1");
    let trace_path = cfg.state_dir.join("actor-trace.jsonl");
    let starts = Arc::new(Starts::default());
    let node = NodeBuilder::new(cfg)
        .with_job_supervised(
            "fatal",
            SupervisionPolicy::Shutdown,
            flaky_job(starts.clone(), 1),
        )
        .start()
        .await
        .expect("start the node");
    tokio::time::timeout(Duration::from_secs(30), node.stopped())
        .await
        .expect("the node stops itself");
    assert_eq!(
        starts.tokens().len(),
        1,
        "no second term after a Shutdown failure"
    );
    // The order in the actor trace: the lease was released before the node stopped.
    let trace = std::fs::read_to_string(&trace_path).unwrap();
    let demoted = trace.find("\"demoted\"").expect("a demoted step");
    let stopped = trace
        .find("\"policy-shutdown\"")
        .expect("a policy-shutdown step");
    assert!(demoted < stopped, "released after stopping:\n{trace}");
    node.shutdown().await.unwrap();
}

/// Runs SQL on the private PostgreSQL as `url`'s role; a batch when it ends in `;`.
async fn sql(url: &str, text: &str) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    if text.trim_end().ends_with(';') {
        client.batch_execute(text).await?;
        return Ok(Vec::new());
    }
    client.query(text, &[]).await
}

/// The library's central promise: the user's own job writes its own table through the fence, and
/// a stale term's write is refused by PostgreSQL, rolled back whole, and recorded with both
/// tokens. Also the SQL form any language can call, and what the application role still cannot do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_terms_fenced_user_write_is_refused_and_recorded() {
    let pg = private_pg().await;
    let admin = pg.server.admin_url();
    let app = pg.server.app_url();
    sql(
        &admin,
        "CREATE TABLE orders (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, token BIGINT, note TEXT);
         GRANT INSERT, SELECT ON orders TO baton_app;",
    )
    .await
    .unwrap();

    // The job writes one row per term, then keeps its Term's fence and token for the test: what
    // a paused node would still hold when it wakes.
    let kept: Arc<Mutex<Vec<(baton::work::Fence, FenceToken)>>> = Arc::default();
    let kept_by_job = kept.clone();
    let node = NodeBuilder::new(node_config(&pg, "u1"))
        .with_job("orders", move |mut term| {
            let kept = kept_by_job.clone();
            async move {
                let tx = term.fence().begin("orders", term.token()).await?;
                let insert = "INSERT INTO orders (token, note) VALUES ($1, 'term start')";
                tx.client().execute(insert, &[&term.token().0]).await?;
                tx.commit().await?;
                kept.lock()
                    .unwrap()
                    .push((term.fence().clone(), term.token()));
                term.stopping().await;
                Ok(())
            }
        })
        .start()
        .await
        .expect("start the node");
    let wait_kept = |n: usize| {
        let kept = kept.clone();
        async move {
            let until = Instant::now() + Duration::from_secs(20);
            while kept.lock().unwrap().len() < n {
                assert!(Instant::now() < until, "the job did not write in term {n}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_kept(1).await;
    node.step_down(None).await.expect("step down");
    wait_kept(2).await;
    let (fence, old) = kept.lock().unwrap()[0].clone();
    let new = kept.lock().unwrap()[1].1;
    assert!(new > old, "a new term has a higher token ({new} vs {old})");

    // The stale term's fenced transaction: refused before any statement runs.
    match fence.begin("orders", old).await {
        Err(baton::work::FenceError::Rejected {
            token,
            max_token,
            op,
            ..
        }) => {
            assert_eq!((token, max_token, op), (old, new.0, "user"));
        }
        Err(e) => panic!("expected a fence rejection, got {e}"),
        Ok(_) => panic!("a stale token {old} opened a fenced transaction at {new}"),
    }
    let rec = sql(
        &admin,
        "SELECT token, max_token, reason FROM baton.fence_rejections WHERE op = 'user'",
    )
    .await
    .unwrap();
    assert_eq!(rec.len(), 1, "one recorded rejection");
    assert_eq!(rec[0].get::<_, i64>(0), old.0);
    assert_eq!(rec[0].get::<_, i64>(1), new.0);
    assert_eq!(rec[0].get::<_, &str>(2), "stale-token");

    // A fenced transaction dropped without commit rolls back.
    let tx = fence.begin("orders", new).await.expect("current token");
    tx.client()
        .execute(
            "INSERT INTO orders (token, note) VALUES ($1, 'dropped')",
            &[&new.0],
        )
        .await
        .unwrap();
    drop(tx);

    // SQL, for writers in any language, as the application role: a stale assertion aborts the
    // caller's own transaction (SQLSTATE BF409), so its INSERT never lands.
    let stale_sql = format!(
        "BEGIN; INSERT INTO orders (token, note) VALUES ({old}, 'stale sql');
         SELECT baton.fence_assert('orders', {old}, 'u1'); COMMIT;"
    );
    let err = sql(&app, &stale_sql)
        .await
        .expect_err("stale SQL assertion");
    assert_eq!(err.code().map(|c| c.code()), Some("BF409"), "{err}");
    let recorded = sql(
        &app,
        &format!("SELECT recorded FROM baton.fence_record_rejection('orders', {old}, 'u1')"),
    )
    .await
    .unwrap();
    assert!(
        recorded[0].get::<_, bool>(0),
        "the stale SQL write is recorded after rollback"
    );
    // A current token cannot be planted as a rejection.
    let planted = sql(
        &app,
        &format!("SELECT recorded FROM baton.fence_record_rejection('orders', {new}, 'u1')"),
    )
    .await
    .unwrap();
    assert!(
        !planted[0].get::<_, bool>(0),
        "a write the fence accepts is not recorded as refused"
    );

    let notes: Vec<String> = sql(&admin, "SELECT note FROM orders ORDER BY id")
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        notes,
        vec!["term start", "term start"],
        "only the two terms' own writes landed"
    );

    // The application role still cannot touch the fence itself.
    for forbidden in [
        "UPDATE baton.fenced_resource SET max_token = 0",
        "SELECT * FROM baton.fence_check('orders', 999, 'u1', 'user')",
        "UPDATE baton.settings SET fencing = false",
    ] {
        let err = sql(&app, forbidden).await.expect_err(forbidden);
        assert_eq!(
            err.code().map(|c| c.code()),
            Some("42501"),
            "{forbidden}: {err}"
        );
    }
    node.shutdown().await.unwrap();
}

/// `[sequencer] min_commit_interval_ms`: under a steady trickle of `POST /next`, group commits
/// start no closer than the interval, so they are few and carry many IDs each, and every request
/// is still answered with its own ID. (With the interval at 0 the same trickle gives a commit
/// per request or two: this test then fails on the commit count.)
/// A leading node serving `POST /next` at the address returned, its sequencer set by `sequencer`,
/// once it has answered its first ID.
async fn sequencer_node(
    pg: &Pg,
    sequencer: impl FnOnce(&mut baton::config::SequencerConfig),
) -> (NodeHandle, String, baton_lab::fleet::client::NodeClient) {
    let mut cfg = node_config(pg, "s1");
    cfg.sequencer.enabled = true;
    sequencer(&mut cfg.sequencer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let node = NodeBuilder::new(cfg)
        .with_default_work()
        .serve_http(listener)
        .start()
        .await
        .expect("start the node");
    wait_leading(&node, Duration::from_secs(20)).await;
    let client = baton_lab::fleet::client::NodeClient::new(Duration::from_secs(5));
    // The sequencer claims its range right after the term starts: wait for the first ID.
    let until = Instant::now() + Duration::from_secs(20);
    while !client
        .post(&addr, "/next")
        .await
        .is_ok_and(|r| r.status.as_u16() == 200)
    {
        assert!(Instant::now() < until, "no ID within 20 s of leading");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (node, addr, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_commit_interval_spaces_group_commits() {
    const INTERVAL_MS: u64 = 20;
    let pg = private_pg().await;
    let (node, addr, client) =
        sequencer_node(&pg, |s| s.min_commit_interval_ms = INTERVAL_MS).await;
    let admin = pg.server.admin_url();
    let commits = || async {
        let count = "SELECT count(*) FROM baton.fence_log WHERE op = 'next'";
        sql(&admin, count).await.unwrap()[0].get::<_, i64>(0)
    };
    let before = commits().await;

    // 32 clients, each asking for its next ID 2 ms after its last answer, for 400 ms. Each
    // waits for a commit, so a commit carries at most 32 IDs.
    let started = Instant::now();
    let clients: Vec<_> = (0..32)
        .map(|_| {
            let (client, addr) = (client.clone(), addr.clone());
            tokio::spawn(async move {
                let mut seqs = Vec::new();
                while started.elapsed() < Duration::from_millis(400) {
                    let r = client.post(&addr, "/next").await.expect("an answer");
                    assert_eq!(r.status.as_u16(), 200, "{:?}", r.body);
                    seqs.push(r.json()["seq"].as_i64().expect("a seq"));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                seqs
            })
        })
        .collect();
    let mut seqs = Vec::new();
    for c in clients {
        seqs.extend(c.await.unwrap());
    }
    let elapsed_ms = started.elapsed().as_millis() as i64;
    let commits_made = commits().await - before;
    let n = seqs.len();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), n, "every answer its own ID");
    // Commits start at least INTERVAL_MS apart: at most one per interval, plus the first.
    let most = elapsed_ms / INTERVAL_MS as i64 + 2;
    assert!(
        commits_made <= most,
        "{commits_made} group commits for {n} requests in {elapsed_ms} ms: more than {most}"
    );
    assert!(
        n as i64 > 4 * commits_made,
        "{n} requests in {commits_made} commits"
    );
    node.shutdown().await.unwrap();
}

/// `[sequencer] commits_in_flight = 2`: under a closed loop of 64 clients, commits go out
/// behind one in flight, and still every answer is its own ID, each client's IDs increase, and
/// every ID answered lies in one committed range of the term, the ranges in the ledger in the
/// order cut (a later range reaching the fence row first would have ended the term). The node
/// then shuts down with commits in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_commits_in_flight_answer_every_id_from_a_committed_range() {
    let pg = private_pg().await;
    let (node, addr, client) = sequencer_node(&pg, |s| s.commits_in_flight = 2).await;
    let started = Instant::now();
    let clients: Vec<_> = (0..64)
        .map(|_| {
            let (client, addr) = (client.clone(), addr.clone());
            tokio::spawn(async move {
                let mut seqs = Vec::new();
                while started.elapsed() < Duration::from_millis(600) {
                    let r = client.post(&addr, "/next").await.expect("an answer");
                    assert_eq!(r.status.as_u16(), 200, "{:?}", r.body);
                    seqs.push(r.json()["seq"].as_i64().expect("a seq"));
                }
                seqs
            })
        })
        .collect();
    let mut seqs = Vec::new();
    for c in clients {
        let mine = c.await.unwrap();
        assert!(
            mine.windows(2).all(|w| w[0] < w[1]),
            "one client's IDs: {mine:?}"
        );
        seqs.extend(mine);
    }
    node.shutdown().await.unwrap();
    let n = seqs.len();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), n, "every answer its own ID");
    let ranges: Vec<(i64, i64)> = sql(
        &pg.server.admin_url(),
        "SELECT seq_lo, seq_hi FROM baton.fence_log WHERE op = 'next' ORDER BY pos",
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    assert!(
        ranges.windows(2).all(|w| w[0].1 < w[1].0),
        "ranges committed in the order cut: {ranges:?}"
    );
    for seq in &seqs {
        assert!(
            ranges.iter().any(|(lo, hi)| lo <= seq && seq <= hi),
            "ID {seq} answered outside every committed range"
        );
    }
    assert!(n > 200, "only {n} IDs answered in 600 ms");
}
