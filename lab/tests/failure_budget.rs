//! The fleet-wide failure budget (`[failure_budget]`, `sql/0004_failure_budget.sql`): failed
//! terms counted per fence domain in the fenced resource, recorded only by the term's own leader
//! (a stale node cannot spend the budget), counted within a window by the resource's clock,
//! separately per shard, and cleared by an operator's reset. Then library jobs that keep failing
//! on a fleet of two in-process nodes: the fleet stops campaigning once the budget is spent, says
//! so, and campaigns again after a reset. A private PostgreSQL per test.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use baton::config::{FailureBudgetConfig, NodeConfig};
use baton::elector::FenceToken;
use baton::node::{NodeBuilder, NodeHandle};
use baton::shard::ShardId;
use baton::work::fence::{reset_failure_budget, BudgetState};
use baton::work::{Fence, FenceError};
use baton_lab::fleet::servers::ScratchPg;
use tokio_postgres::Client;

use common::connect;

mod common;

async fn private_pg() -> ScratchPg {
    ScratchPg::start()
        .await
        .expect("a private PostgreSQL, migrated")
}

/// A node's fence handle as the application role (what a node writes with).
fn fence(pg: &ScratchPg, holder: &str) -> Fence {
    let mut cfg = NodeConfig::default().resource;
    cfg.database_url = pg.server.app_url();
    Fence::new(&cfg, holder).expect("a fence handle")
}

fn budget(failed_terms: u32, window_ms: u64) -> FailureBudgetConfig {
    FailureBudgetConfig {
        failed_terms,
        window_ms,
        ..FailureBudgetConfig::default()
    }
}

/// The rows of a two-column query.
async fn pairs<A, B>(client: &Client, sql: &str) -> Vec<(A, B)>
where
    A: for<'a> tokio_postgres::types::FromSql<'a>,
    B: for<'a> tokio_postgres::types::FromSql<'a>,
{
    let rows = client.query(sql, &[]).await.expect(sql);
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// `(accepted, reason, failed_terms, exhausted)` of one `record_failed_term` as the app role.
async fn record_sql(
    app: &Client,
    resource: &str,
    token: i64,
    holder: &str,
) -> (bool, Option<String>, i32, bool) {
    let r = app
        .query_one(
            "SELECT accepted, reason, failed_terms, exhausted
               FROM baton.record_failed_term($1, $2, $3, 'child: exited (exit=3)', 600000, 3)",
            &[&resource, &token, &holder],
        )
        .await
        .expect("record_failed_term");
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

/// Only the term's own leader may record its failure: a token the fence has moved past, or the
/// current token under another holder's name, is refused (and recorded as a refusal), and the
/// count does not move; so is a per-node role writing under another node's name. Through the
/// library too: `Fence::record_failed_term` returns `Rejected` with op `failed-term`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_node_cannot_spend_the_budget() {
    let pg = private_pg().await;
    let app = connect(&pg.server.app_url()).await;
    let admin = connect(&pg.server.admin_url()).await;

    // Term 5 (n1) fails and records it; term 6 (n2) claims the sequence, as a new leader does.
    assert_eq!(
        record_sql(&app, "failure-budget", 5, "n1").await,
        (true, None, 1, false)
    );
    app.query_one("SELECT * FROM baton.seq_claim('ids', 6, 'n2')", &[])
        .await
        .unwrap();
    // n1, still believing it leads term 5, records again: refused, the count stays at 1.
    let (ok, reason, count, _) = record_sql(&app, "failure-budget", 5, "n1").await;
    assert!(!ok, "a stale token recorded a failure");
    assert_eq!(reason.as_deref(), Some("stale-token"));
    assert_eq!(count, 1);
    // Term 6 under another holder's name: refused as such.
    let (ok, reason, count, _) = record_sql(&app, "failure-budget", 6, "n3").await;
    assert!(!ok);
    assert_eq!(reason.as_deref(), Some("holder-mismatch"));
    assert_eq!(count, 1);
    // The same term recorded twice counts once.
    assert_eq!(
        record_sql(&app, "failure-budget", 6, "n2").await,
        (true, None, 2, false)
    );
    assert_eq!(
        record_sql(&app, "failure-budget", 6, "n2").await,
        (true, None, 2, false)
    );
    let refused: Vec<(i64, String)> = pairs(
        &admin,
        "SELECT token, reason FROM baton.fence_rejections WHERE op = 'failed-term' ORDER BY id",
    )
    .await;
    assert_eq!(
        refused,
        [
            (5, "stale-token".to_owned()),
            (6, "holder-mismatch".to_owned())
        ]
    );
    let rows: i64 = admin
        .query_one("SELECT count(*) FROM baton.failed_terms", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 2, "one row per accepted failed term");

    // The library's call: a stale term's record is refused, named as the failed-term op.
    let limits = budget(3, 600_000);
    match fence(&pg, "n1")
        .record_failed_term(FenceToken(5), "job failed: stale", &limits)
        .await
    {
        Err(FenceError::Rejected {
            op,
            max_token,
            reason,
            ..
        }) => {
            assert_eq!(op, "failed-term");
            assert_eq!(max_token, 6);
            assert_eq!(reason, "stale-token");
        }
        other => panic!("a stale record was not refused: {other:?}"),
    }
    // The current leader's is accepted, and spends the budget (3 of 3).
    let state = fence(&pg, "n2")
        .record_failed_term(FenceToken(7), "job failed: disk full", &limits)
        .await
        .expect("the current leader records its failure");
    assert!(state.exhausted && state.failed_terms == 3, "{state:?}");
    assert_eq!(
        state.last_failure.as_deref(),
        Some("term 7 on n2: job failed: disk full")
    );

    // A per-node role writes only under its own name.
    let n1 = connect(&pg.server.node_role_url("n1").await.unwrap()).await;
    let err = record_sql_err(&n1, 8, "n2").await;
    assert_eq!(err.code().map(|c| c.code()), Some("42501"), "{err}");
    // Nonsense limits are refused before anything is written (the fence row included).
    for (window_ms, limit) in [(600_000i64, 0i32), (0, 3), (700_000_000, 3)] {
        let err = app
            .query_one(
                "SELECT * FROM baton.record_failed_term('failure-budget', 99, 'n9', 'x', $1, $2)",
                &[&window_ms, &limit],
            )
            .await
            .expect_err("a nonsense limit");
        assert_eq!(err.code().map(|c| c.code()), Some("22023"), "{err}");
    }
    let max_token: i64 = admin
        .query_one(
            "SELECT max_token FROM baton.fenced_resource WHERE name = 'leadership'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(max_token, 7, "a refused call moved the fence");
    // The application role cannot reset the budget, nor reach the tables.
    for sql in [
        "SELECT * FROM baton.failure_budget_reset('failure-budget')",
        "DELETE FROM baton.failed_terms",
    ] {
        let err = app.query(sql, &[]).await.expect_err(sql);
        assert_eq!(err.code().map(|c| c.code()), Some("42501"), "{sql}: {err}");
    }
}

async fn record_sql_err(client: &Client, token: i64, holder: &str) -> tokio_postgres::Error {
    client
        .query_one(
            "SELECT * FROM baton.record_failed_term('failure-budget', $1, $2, 'x', 600000, 3)",
            &[&token, &holder],
        )
        .await
        .expect_err("a record under another node's name")
}

/// Counted per shard (shard S's failures are in its own domain, `leadership#S`), within the
/// window by the resource's clock (the budget reopens when enough failures have left it, and
/// says when), and cleared by the operator's reset, which is logged and touches only its shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_counts_per_shard_within_its_window_until_a_reset() {
    let pg = private_pg().await;
    let admin = connect(&pg.server.admin_url()).await;
    let shard0 = fence(&pg, "n1");
    let shard2 = shard0.for_shard(ShardId(2)).unwrap();
    let window_ms = 3000;
    let limits = budget(2, window_ms);
    let spent = |s: &BudgetState| s.exhausted && s.failed_terms == 2;

    for token in [1, 2] {
        shard2
            .record_failed_term(FenceToken(token), "exit=3", &limits)
            .await
            .unwrap();
    }
    let s2 = shard2.failure_budget(&limits).await.unwrap();
    assert!(spent(&s2), "{s2:?}");
    let reopens_in = s2.reopens_in.expect("a spent budget says when it reopens");
    assert!(
        reopens_in > Duration::ZERO && reopens_in <= Duration::from_millis(window_ms),
        "{s2:?}"
    );
    assert_eq!(s2.last_failure.as_deref(), Some("term 2 on n1: exit=3"));
    // Shard 0 is untouched, and its terms start again at token 1: each shard's own tokens.
    let s0 = shard0.failure_budget(&limits).await.unwrap();
    assert_eq!(
        s0,
        BudgetState {
            failed_terms: 0,
            exhausted: false,
            reopens_in: None,
            last_failure: None
        }
    );
    for token in [1, 2] {
        shard0
            .record_failed_term(FenceToken(token), "exit=4", &limits)
            .await
            .unwrap();
    }
    assert!(spent(&shard0.failure_budget(&limits).await.unwrap()));

    // The operator resets shard 0: it reopens, shard 2 stays spent; the reset is logged.
    let cleared = reset_failure_budget(&pg.server.admin_url(), ShardId(0))
        .await
        .unwrap();
    assert_eq!(cleared, 2);
    let s0 = shard0.failure_budget(&limits).await.unwrap();
    assert!(!s0.exhausted && s0.failed_terms == 0, "{s0:?}");
    assert!(spent(&shard2.failure_budget(&limits).await.unwrap()));
    let logged: Vec<(String, i32)> = pairs(
        &admin,
        "SELECT domain, cleared FROM baton.failure_budget_resets",
    )
    .await;
    assert_eq!(logged, [("leadership".to_owned(), 2)]);
    // The CLI's report, from the same rows.
    let report = baton_lab::budget_admin::status(&admin, ShardId(2), &limits)
        .await
        .unwrap();
    assert!(
        report.contains("2 failed term(s) of 2") && report.contains("SPENT"),
        "{report}"
    );

    // Shard 2's window passes: it reopens by itself.
    tokio::time::sleep(reopens_in + Duration::from_millis(200)).await;
    let s2 = shard2.failure_budget(&limits).await.unwrap();
    assert!(!s2.exhausted && s2.failed_terms == 0, "{s2:?}");
}

/// A job that fails at once, every term, with an error chain; counts its starts.
fn doomed_job(
    starts: Arc<Mutex<Vec<FenceToken>>>,
) -> impl Fn(baton::work::Term) -> futures::future::BoxFuture<'static, anyhow::Result<()>>
       + Send
       + Sync
       + 'static {
    move |term| {
        let starts = starts.clone();
        Box::pin(async move {
            starts.lock().unwrap().push(term.token());
            Err(anyhow::anyhow!("disk full")).context("writing the compaction output")
        })
    }
}

fn node_config(pg: &ScratchPg, node_id: &str) -> NodeConfig {
    let mut cfg = common::job_node_config(pg, node_id);
    // Quick local backoff, a long window, quick looks while spent.
    cfg.term_backoff.base_ms = 100;
    cfg.term_backoff.max_ms = 400;
    cfg.failure_budget = FailureBudgetConfig {
        failed_terms: 3,
        window_ms: 600_000,
        recheck_ms: 300,
    };
    cfg
}

async fn wait_starts(starts: &Mutex<Vec<FenceToken>>, n: usize, within: Duration) {
    let until = Instant::now() + within;
    while starts.lock().unwrap().len() < n {
        assert!(
            Instant::now() < until,
            "only {} job start(s) within {within:?}",
            starts.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every node says the budget is spent, in its status: the count, the limit, when it reopens,
/// and the job's error chain.
fn assert_says_spent(nodes: &[NodeHandle]) {
    for node in nodes {
        let st = node.status();
        let b = st
            .failure_budget
            .clone()
            .unwrap_or_else(|| panic!("{}: no failure_budget in its status", st.node_id));
        assert!(b.exhausted && b.failed_terms == 3 && b.limit == 3, "{b:?}");
        let left = b.reopens_in_ms.expect("when it reopens");
        assert!(left > 0 && left <= 600_000, "{b:?}");
        let last = b.last_failure.unwrap_or_default();
        assert!(
            last.contains("writing the compaction output: disk full"),
            "the job's error chain: {last}"
        );
        // Issue 43: the chain is said once, the job named once (not "doomed: failed: doomed
        // failed: ...").
        assert!(
            last.ends_with(": doomed: failed: writing the compaction output: disk full")
                && last.matches("doomed").count() == 1,
            "{last}"
        );
        // ... and the role says why this node does not campaign.
        assert_eq!(st.role.as_str(), "budget_blocked", "{st:?}");
        assert!(!st.acting && st.fence_token.is_none(), "{st:?}");
    }
}

/// Library jobs (`with_job`) go the same way as `baton run`'s program: on a fleet of two nodes,
/// a job that fails every term spends the fleet's budget of 3 failed terms, after which neither
/// node starts it again (a campaign under way when the third failure was recorded may still win
/// a term, which gives up without starting the job); both say so. An operator reset lets them
/// campaign again, and the job runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_library_jobs_spend_the_fleet_budget_then_the_fleet_stops_campaigning() {
    let pg = private_pg().await;
    let starts: Arc<Mutex<Vec<FenceToken>>> = Arc::default();
    let mut nodes = Vec::new();
    for id in ["j1", "j2"] {
        let node = NodeBuilder::new(node_config(&pg, id))
            .with_job("doomed", doomed_job(starts.clone()))
            .start()
            .await
            .expect("start a node");
        nodes.push(node);
    }
    wait_starts(&starts, 3, Duration::from_secs(60)).await;
    // Long enough for several more terms at a 100-400 ms backoff, had the budget not stopped them.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let tokens = starts.lock().unwrap().clone();
    assert_eq!(tokens.len(), 3, "the job ran past the budget: {tokens:?}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    assert_says_spent(&nodes);

    let cleared = reset_failure_budget(&pg.server.admin_url(), ShardId(0))
        .await
        .unwrap();
    assert_eq!(cleared, 3);
    wait_starts(&starts, 4, Duration::from_secs(30)).await;
    // ... and spends it again after three more.
    wait_starts(&starts, 6, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(starts.lock().unwrap().len(), 6);
    assert_says_spent(&nodes);
    for node in nodes {
        node.shutdown().await.unwrap();
    }
}
