//! Setting up and operating the fenced resource the way a library user does, against a private
//! PostgreSQL that each test starts: the migration and the pg-lease store say nothing at INFO;
//! a fence reset lets a new election backend's terms in.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use baton::backends::pg_lease::PgLeaseElector;
use baton::backends::{BackendKind, Elector};
use baton::config::NodeConfig;
use baton::elector::FenceToken;
use baton::work::FenceError;
use baton_lab::fleet::servers::ScratchPg;

/// Everything logged in this test binary, at DEBUG and above, as the `fmt` subscriber writes it
/// (the driver's `log` records included, as a service's subscriber would see them).
fn captured_logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || Captured(sink.clone()))
            .init();
        logs
    })
}

struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The captured lines logged at `level` (`INFO`, `DEBUG`, ...) that mention `text`.
fn logged(level: &str, text: &str) -> Vec<String> {
    let logs = captured_logs().lock().unwrap();
    String::from_utf8_lossy(&logs)
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(level) && l.contains(text))
        .map(str::to_owned)
        .collect()
}

/// PostgreSQL's notices about idempotent DDL ("function ... does not exist, skipping",
/// "relation ... already exists, skipping") are DEBUG: a migration, run twice, and two pg-lease
/// starts on one store log none of them at INFO or above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_and_pg_lease_starts_are_quiet_at_info() {
    captured_logs();
    let pg = ScratchPg::start().await.expect("a private PostgreSQL, migrated");
    baton::work::fence::migrate(&pg.server.admin_url(), None)
        .await
        .unwrap();
    let mut cfg = NodeConfig {
        node_id: "quiet".into(),
        ..NodeConfig::for_backend(BackendKind::PgLease)
    };
    cfg.pg_lease.database_url = pg.server.lease_url();
    for _ in 0..2 {
        // Each new elector makes sure of its schema (`CREATE ... IF NOT EXISTS`) on first use.
        let elector = PgLeaseElector::connect(&cfg).await.unwrap();
        elector.leader().await.unwrap();
        elector.close().await.unwrap();
    }
    let noisy: Vec<String> = ["INFO", "WARN", "ERROR"]
        .iter()
        .flat_map(|level| logged(level, "skipping"))
        .collect();
    assert!(noisy.is_empty(), "notices above DEBUG: {noisy:#?}");
    // The notices were there (so this test can fail): the migration's, at DEBUG.
    assert!(
        !logged("DEBUG", "does not exist, skipping").is_empty(),
        "the migration sent no notice at all: nothing was tested"
    );
}

/// Moving a fleet from pg-lease to raft on the same database: the fence is at pg-lease's epoch
/// (77) and raft's first term is 1, so every raft term would be refused until one passed 77.
/// `fence::reset` to 0 (the fleet stopped) lets the new backend's first term in; a bad request
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_reset_lets_a_new_backends_first_term_in() {
    let pg = ScratchPg::start().await.expect("a private PostgreSQL, migrated");
    let resource = baton::config::ResourceConfig {
        database_url: pg.server.app_url(),
        ..Default::default()
    };
    let fence = baton::work::Fence::new(&resource, "n1").unwrap();
    fence.begin("ledger", FenceToken(77)).await.unwrap().commit().await.unwrap();
    let refused = fence.begin("ledger", FenceToken(1)).await;
    assert!(
        matches!(refused, Err(FenceError::Rejected { max_token: 77, .. })),
        "before the reset a term-1 write must be refused: {:?}",
        refused.err()
    );

    let admin = pg.server.admin_url();
    let bad = baton::work::fence::reset(&admin, -1).await;
    assert!(matches!(bad, Err(FenceError::Invalid(_))), "{bad:?}");
    let replaced = baton::work::fence::reset(&admin, 0).await.unwrap();
    assert_eq!(replaced, (77, "n1".to_owned()), "the bad request changed nothing");

    fence.begin("ledger", FenceToken(1)).await.unwrap().commit().await.unwrap();
}
