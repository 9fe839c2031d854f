//! The supervisor against leader work that ends while its term is still starting: one node, in
//! process, on the pg-lease backend and a fenced resource in a private PostgreSQL.
//!
//! A refused claim ends a work actor within milliseconds of its start, often before the term's
//! other works have finished starting. The supervisor must still demote and release (so another
//! term can begin), never hold the lease with part of its work dead.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use baton::backends::BackendKind;
use baton::config::NodeConfig;
use baton::node::NodeBuilder;
use baton::work::{LeaderWork, RunningWork, WorkContext, WorkError};
use baton_lab::fleet::servers::PgServer;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef};

/// An actor that does nothing until it is stopped.
struct Idle;

#[async_trait]
impl Actor for Idle {
    type Msg = ();
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _myself: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
}

/// Leader work for the test: counts its terms, keeps every actor it started.
struct TestWork {
    name: &'static str,
    /// Ends its actor right after starting it (what a refused claim does).
    ends_at_once: bool,
    /// How long `start` takes before returning (a slow claim, a cold cache).
    start_delay: Duration,
    starts: AtomicUsize,
    cells: Mutex<Vec<ActorCell>>,
}

struct Running {
    name: &'static str,
    cell: ActorCell,
}

#[async_trait]
impl RunningWork for Running {
    fn name(&self) -> &'static str {
        self.name
    }
    fn cell(&self) -> ActorCell {
        self.cell.clone()
    }
    async fn checkpoint(&self) -> Result<(), WorkError> {
        Ok(())
    }
}

#[async_trait]
impl LeaderWork for TestWork {
    fn name(&self) -> &'static str {
        self.name
    }
    async fn start(&self, ctx: WorkContext) -> Result<Box<dyn RunningWork>, WorkError> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        let (actor, _) = Actor::spawn_linked(None, Idle, (), ctx.supervisor)
            .await
            .map_err(|e| WorkError::Start {
                work: self.name,
                reason: e.to_string(),
            })?;
        if self.ends_at_once {
            actor.stop(Some("claim refused (simulated)".into()));
        }
        tokio::time::sleep(self.start_delay).await;
        self.cells.lock().unwrap().push(actor.get_cell());
        Ok(Box::new(Running {
            name: self.name,
            cell: actor.get_cell(),
        }))
    }
}

fn work(name: &'static str, ends_at_once: bool, start_delay_ms: u64) -> Arc<TestWork> {
    Arc::new(TestWork {
        name,
        ends_at_once,
        start_delay: Duration::from_millis(start_delay_ms),
        starts: AtomicUsize::new(0),
        cells: Mutex::new(Vec::new()),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_that_ends_while_its_term_starts_demotes_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pg");
    let pg = tokio::task::spawn_blocking(move || PgServer::start_on_free_port(&root))
        .await
        .unwrap()
        .expect("start a private PostgreSQL");
    let _stop_pg = StopOnDrop(pg.clone());
    baton::work::fence::migrate(&pg.admin_url(), Some(true))
        .await
        .expect("migrate the fenced resource");
    baton::backends::pg_lease::provision(&pg.admin_url())
        .await
        .expect("provision the pg-lease role");

    let mut cfg = NodeConfig {
        backend: BackendKind::PgLease,
        state_dir: dir.path().join("n1"),
        ..NodeConfig::default()
    };
    cfg.resource.database_url = pg.app_url();
    cfg.pg_lease.database_url = pg.lease_url();
    std::fs::create_dir_all(&cfg.state_dir).unwrap();

    // The first work ends at once; the second is still starting when it does.
    let dies = work("dies-at-once", true, 0);
    let slow = work("slow-to-start", false, 300);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let node = tokio::spawn(
        NodeBuilder::new(cfg)
            .with_work(dies.clone())
            .with_work(slow.clone())
            .run(listener, async {
                let _ = stop_rx.await;
            }),
    );

    // Each term ends in a demotion and a release, and the node (alone) wins the next one: the
    // work is started again and again. Holding the lease with a dead work would stop at one.
    let until = Instant::now() + Duration::from_secs(20);
    while dies.starts.load(Ordering::SeqCst) < 3 {
        assert!(
            Instant::now() < until,
            "the node held its term with a dead work: started {} time(s) in 20 s",
            dies.starts.load(Ordering::SeqCst)
        );
        assert!(!node.is_finished(), "the node exited: {:?}", node.await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Every finished term stopped its still-running work before the next term began.
    let started = slow.starts.load(Ordering::SeqCst);
    let cells = slow.cells.lock().unwrap().clone();
    assert!(started >= 2, "slow work started {started} time(s)");
    for cell in &cells[..cells.len() - 1] {
        assert_eq!(
            cell.get_status(),
            ractor::ActorStatus::Stopped,
            "a previous term's work is still running"
        );
    }

    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(15), node)
        .await
        .expect("the node shuts down")
        .unwrap()
        .expect("the node ran without error");
}

/// Stops the private PostgreSQL however the test ends (a failed assertion included).
struct StopOnDrop(PgServer);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}
