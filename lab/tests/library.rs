//! The library as a user meets it (SPEC §9): a node started in process returns a handle; closure
//! jobs get a `Term`; each supervision policy does what it says. One node on the pg-lease backend
//! with a private PostgreSQL as both its lease store and its fenced resource.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::actors::leadership::Role;
use baton::backends::BackendKind;
use baton::config::NodeConfig;
use baton::elector::FenceToken;
use baton::node::{NodeBuilder, NodeHandle};
use baton::work::SupervisionPolicy;
use baton_lab::fleet::servers::{free_ports, PgServer};

/// A private PostgreSQL, stopped however the test ends.
struct Pg {
    server: PgServer,
    _dir: tempfile::TempDir,
}

impl Drop for Pg {
    fn drop(&mut self) {
        self.server.stop();
    }
}

async fn private_pg() -> Pg {
    let dir = tempfile::tempdir().unwrap();
    let port = free_ports(1).unwrap()[0];
    let root = dir.path().join("pg");
    let server = tokio::task::spawn_blocking(move || PgServer::start(&root, port))
        .await
        .unwrap()
        .expect("start a private PostgreSQL");
    baton::work::fence::migrate(&server.admin_url(), Some(true))
        .await
        .expect("migrate the fenced resource");
    baton::backends::pg_lease::provision(&server.admin_url())
        .await
        .expect("provision the pg-lease role");
    Pg { server, _dir: dir }
}

fn node_config(pg: &Pg, node_id: &str) -> NodeConfig {
    let mut cfg = NodeConfig {
        node_id: node_id.into(),
        backend: BackendKind::PgLease,
        state_dir: pg._dir.path().join(node_id),
        ..NodeConfig::default()
    };
    cfg.sequencer.enabled = false;
    cfg.scheduler.enabled = false;
    cfg.resource.database_url = pg.server.app_url();
    cfg.pg_lease.database_url = format!(
        "postgres://{}@127.0.0.1:{}/baton",
        baton::backends::pg_lease::LEASE_ROLE,
        pg.server.port
    );
    std::fs::create_dir_all(&cfg.state_dir).unwrap();
    cfg
}

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
