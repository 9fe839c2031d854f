//! The fence's own surface, as the application role sees it (SPEC §10): what a holder of the
//! role's credentials, or a bug, can still do, and how far. Tokens and sequence bounds are
//! range-checked; one call cannot move the sequence by more than `max_seq_advance`; nobody holds
//! the fence row past the role's timeouts; a poisoned `max_token` is visible to the operator and
//! recoverable with `baton fence reset`. A private PostgreSQL per test.

use std::time::{Duration, Instant};

use baton_lab::fence_admin;
use baton_lab::fleet::servers::ScratchPg;
use common::Stopped;
use tokio_postgres::{Client, NoTls};

mod common;

type Pg = ScratchPg;

async fn private_pg() -> Pg {
    ScratchPg::start()
        .await
        .expect("a private PostgreSQL, migrated")
}

async fn connect(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect(url);
    tokio::spawn(conn);
    client
}

/// `(accepted, max_token, reason)` of one seq_commit call as the application role.
async fn seq_commit(
    app: &Client,
    token: i64,
    holder: &str,
    lo: i64,
    hi: i64,
) -> (bool, i64, Option<String>) {
    let r = app
        .query_one(
            "SELECT accepted, max_token, reason FROM baton.seq_commit('seq', $1, $2, $3, $4)",
            &[&token, &holder, &lo, &hi],
        )
        .await
        .expect("seq_commit");
    (r.get(0), r.get(1), r.get(2))
}

/// The sequence `seq`'s last committed value, as the owner sees it.
async fn last_seq(admin: &Client) -> i64 {
    admin
        .query_one(
            "SELECT last_seq FROM baton.sequence WHERE name = 'seq'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_role_abuse_is_refused_or_bounded() {
    let pg = private_pg().await;
    let app = connect(&pg.server.app_url()).await;
    let admin = connect(&pg.server.admin_url()).await;
    app.query_one("SELECT * FROM baton.seq_claim('seq', 7, 'n1')", &[])
        .await
        .unwrap();
    assert!(seq_commit(&app, 7, "n1", 1, 100).await.0);

    // Using the sequence up in one call (the leader's own token and holder): refused, named.
    let (ok, _, reason) = seq_commit(&app, 7, "n1", 101, 9_223_372_036_854_775_000).await;
    assert!(
        !ok,
        "a call moving the sequence to near i64::MAX was accepted"
    );
    assert_eq!(reason.as_deref(), Some("seq-advance-too-large"));
    // Backwards: refused as such, not as a stale token.
    let (ok, _, reason) = seq_commit(&app, 7, "n1", 50, 60).await;
    assert!(!ok);
    assert_eq!(reason.as_deref(), Some("seq-not-forward"));
    // A stale token is named stale whatever its range.
    let (ok, _, reason) = seq_commit(&app, 6, "n0", 101, 110).await;
    assert!(!ok);
    assert_eq!(reason.as_deref(), Some("stale-token"));
    // The current token under another holder's name: refused as a holder mismatch.
    let (ok, _, reason) = seq_commit(&app, 7, "n9", 101, 110).await;
    assert!(!ok);
    assert_eq!(reason.as_deref(), Some("holder-mismatch"));
    let last = last_seq(&admin).await;
    assert_eq!(last, 100, "no refused call moved the sequence");
    let refused: Vec<String> = admin
        .query(
            "SELECT reason FROM baton.fence_rejections WHERE op = 'next' ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        refused,
        [
            "seq-advance-too-large",
            "seq-not-forward",
            "stale-token",
            "holder-mismatch"
        ],
        "each refusal is recorded once, with its reason"
    );
    // The legitimate leader carries on.
    assert!(seq_commit(&app, 7, "n1", 101, 200).await.0);
    // An owner deleted the fence row: seq_commit re-creates it (as every entry point does)
    // rather than failing, and the leader's token then moves it as any new term's would.
    admin
        .execute("DELETE FROM baton.fenced_resource", &[])
        .await
        .unwrap();
    assert!(seq_commit(&app, 7, "n1", 201, 210).await.0);

    // Tokens that are not terms (a wrapped conversion) and oversized names: an error, no change.
    for bad in [
        "SELECT * FROM baton.seq_claim('seq', -5, 'n1')",
        "SELECT * FROM baton.seq_claim('seq', 0, 'n1')",
        "SELECT * FROM baton.fence_assert('seq', -9223372036854775808, 'n1')",
        "SELECT * FROM baton.seq_commit('seq', 7, 'n1', -10, -5)",
        "SELECT * FROM baton.seq_commit('seq', 0, 'n1', 211, 220)",
        "SELECT * FROM baton.seq_commit('', 7, 'n1', 211, 220)",
    ] {
        let err = app.query(bad, &[]).await.expect_err(bad);
        assert_eq!(err.code().map(|c| c.code()), Some("22023"), "{bad}: {err}");
    }
    let long_holder = "x".repeat(500);
    let err = app
        .query(
            "SELECT * FROM baton.seq_claim('seq', 8, $1)",
            &[&long_holder],
        )
        .await
        .expect_err("a 500-character holder");
    assert_eq!(err.code().map(|c| c.code()), Some("22023"));
    let (max_token, holder): (i64, String) = {
        let r = admin
            .query_one("SELECT max_token, holder FROM baton.fenced_resource", &[])
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(
        (max_token, holder.as_str()),
        (7, "n1"),
        "bad calls changed the fence"
    );
}

/// A client that takes the fence row's lock and then stalls (paused mid-transaction, or a
/// hostile `BEGIN; ...; pg_sleep`) is cut off by the server; the next writer gets through. All
/// three write under one token, so none may end another (a higher token would, see
/// `a_lower_tokens_open_transaction_is_ended_not_waited_for`): this is the servers' timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_holds_the_fence_row() {
    let pg = private_pg().await;
    let app_url = pg.server.app_url();
    let idle = connect(&app_url).await;
    idle.batch_execute("BEGIN; SELECT baton.fence_assert('r', 5, 'n1');")
        .await
        .unwrap();
    // ... and now it sits idle inside its transaction, holding the lock.
    let sleeper = connect(&app_url).await;
    let sleeping = tokio::spawn(async move {
        sleeper
            .batch_execute("BEGIN; SELECT baton.fence_assert('r', 5, 'n2'); SELECT pg_sleep(60);")
            .await
    });
    let writer = connect(&app_url).await;
    let started = Instant::now();
    let mut accepted = false;
    while started.elapsed() < Duration::from_secs(20) {
        // Each attempt waits on the lock for at most lock_timeout (5 s), then retries.
        if writer
            .query_one("SELECT * FROM baton.seq_claim('seq', 5, 'n3')", &[])
            .await
            .map(|r| r.get::<_, bool>(0))
            .unwrap_or(false)
        {
            accepted = true;
            break;
        }
    }
    let waited = started.elapsed();
    assert!(accepted, "the fence row was held for {waited:?}");
    assert!(
        waited < Duration::from_secs(15),
        "the fence row was held for {waited:?}"
    );
    let slept = sleeping.await.unwrap();
    assert!(
        slept.is_err(),
        "pg_sleep(60) under the fence lock was allowed to finish"
    );
    eprintln!("next writer through after {waited:?}");
}

/// A transaction left open under a lower token (its client paused between `fence_assert` and
/// `COMMIT`) does not hold a newer term up: the newer term's first write ends the session instead
/// of waiting for its lock, the stale COMMIT fails, and the ending is in `fence_rejections`. It
/// ends nothing else: a holder under an equal or a higher token (the latter still inside its
/// term's first, uncommitted write), another shard's holder, or anyone once the owner switched
/// preemption off, is waited for as before (here for the writer's 500 ms lock_timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_tokens_open_transaction_is_ended_not_waited_for() {
    let pg = private_pg().await;
    let app_url = pg.server.app_url();
    let admin = connect(&pg.server.admin_url()).await;
    // A fenced transaction left open under `token`; returns its session.
    let open = |resource: &'static str, token: i64, holder: &'static str| {
        let app_url = app_url.clone();
        async move {
            let c = connect(&app_url).await;
            c.batch_execute(&format!(
                "BEGIN; SELECT baton.fence_assert('{resource}', {token}, '{holder}');"
            ))
            .await
            .expect("fence_assert");
            c
        }
    };
    // A claim under `token` that waits at most 500 ms for a lock: accepted, or why not.
    let claim = |resource: &'static str, token: i64, holder: &'static str| {
        let app_url = app_url.clone();
        async move {
            let c = connect(&app_url).await;
            c.batch_execute("SET lock_timeout = '500ms'").await.unwrap();
            let began = Instant::now();
            let r = c
                .query_one(
                    "SELECT accepted FROM baton.seq_claim($1, $2, $3)",
                    &[&resource, &token, &holder],
                )
                .await;
            let took = began.elapsed();
            let outcome = r
                .map(|r| r.get::<_, bool>(0))
                .map_err(|e| e.code().map(|c| c.code().to_owned()).unwrap_or_default());
            (outcome, took)
        }
    };
    let lock_timeout = Err("55P03".to_owned());

    // Lower: ended at once, the claim accepted, the stale COMMIT refused.
    let stale = open("orders", 3, "n1").await;
    let (outcome, took) = claim("seq", 4, "n2").await;
    assert_eq!(outcome, Ok(true), "the newer term's claim");
    assert!(
        took < Duration::from_secs(2),
        "the claim waited {took:?} on a lower token"
    );
    let commit = stale.batch_execute("COMMIT").await;
    assert!(commit.is_err(), "the stale transaction committed");
    eprintln!(
        "the claim took {took:?}; the stale COMMIT: {}",
        commit.unwrap_err()
    );
    let recorded = admin
        .query_one(
            "SELECT resource, token, max_token, holder, max_holder, op FROM baton.fence_rejections
              WHERE reason = 'preempted'",
            &[],
        )
        .await
        .expect("one preemption recorded");
    let recorded: (String, i64, i64, String, String, String) = (
        recorded.get(0),
        recorded.get(1),
        recorded.get(2),
        recorded.get(3),
        recorded.get(4),
        recorded.get(5),
    );
    assert_eq!(
        recorded,
        (
            "leadership".into(),
            3,
            4,
            "baton_app".into(),
            "n2".into(),
            "user".into()
        )
    );

    // Equal, and higher (a term's first write: the fence row's new token is not committed yet).
    for (held, claimed) in [(4, 4), (6, 5)] {
        let holder = open("orders", held, "n2").await;
        let (outcome, _) = claim("seq", claimed, "n2").await;
        assert_eq!(outcome, lock_timeout, "token {claimed} ended {held}");
        holder.batch_execute("COMMIT").await.expect("not ended");
    }
    // Another shard's holder: neither ended nor in the way.
    let other_shard = open("orders#2", 1, "n1").await;
    assert_eq!(claim("seq", 7, "n2").await.0, Ok(true));
    other_shard
        .batch_execute("COMMIT")
        .await
        .expect("not ended");
    // The switch off: the behaviour before, waiting.
    admin
        .batch_execute("UPDATE baton.settings SET preempt_lower_tokens = false")
        .await
        .unwrap();
    let holder = open("orders", 7, "n2").await;
    assert_eq!(claim("seq", 8, "n3").await.0, lock_timeout);
    holder.batch_execute("COMMIT").await.expect("not ended");
    admin
        .batch_execute("UPDATE baton.settings SET preempt_lower_tokens = true")
        .await
        .unwrap();
    // The sequencer's hot path ends a lower holder too.
    let stale = open("orders", 8, "n3").await;
    let (accepted, _, _) = seq_commit(&connect(&app_url).await, 9, "n4", 1, 10).await;
    assert!(accepted, "seq_commit under a newer token");
    assert!(stale.batch_execute("COMMIT").await.is_err());
    let preempted: i64 = admin
        .query_one(
            "SELECT count(*) FROM baton.fence_rejections WHERE reason = 'preempted'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(preempted, 2, "one row per ended session");
    // A per-node role writing as another holder ends nobody: it is refused before it could.
    let stale = open("orders", 10, "n4").await;
    let impostor = connect(&pg.server.node_role_url("n9").await.unwrap()).await;
    let refused = impostor
        .query_one(
            "SELECT * FROM baton.seq_commit('seq', 11, 'n4', 11, 20)",
            &[],
        )
        .await
        .expect_err("n9 writing as n4");
    assert_eq!(refused.code().map(|c| c.code()), Some("42501"), "{refused}");
    stale.batch_execute("COMMIT").await.expect("not ended");
}

/// A poisoned max_token (a credential holder claimed i64::MAX): every real term is refused,
/// safely; `baton fence status` shows it with the reason; `baton fence reset` recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poisoned_max_token_is_visible_and_recoverable() {
    let pg = private_pg().await;
    let app = connect(&pg.server.app_url()).await;
    let admin = connect(&pg.server.admin_url()).await;
    let poison = i64::MAX;
    app.query_one(
        "SELECT * FROM baton.seq_claim('seq', $1, 'mallory')",
        &[&poison],
    )
    .await
    .unwrap();
    let refused: bool = app
        .query_one("SELECT accepted FROM baton.seq_claim('seq', 42, 'n1')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        !refused,
        "a real term was accepted above a poisoned max_token"
    );

    let report = fence_admin::status(&admin, 5).await.unwrap();
    assert!(
        report.contains(&format!("max_token {poison} holder \"mallory\"")),
        "{report}"
    );
    assert!(
        report.contains("claim on seq (stale-token): token 42"),
        "{report}"
    );

    let (before, holder) = baton::work::fence::reset(&pg.server.admin_url(), 41)
        .await
        .unwrap();
    assert_eq!((before, holder.as_str()), (poison, "mallory"));
    let accepted: bool = app
        .query_one("SELECT accepted FROM baton.seq_claim('seq', 42, 'n1')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(accepted, "the real term is accepted after the reset");
    let logged: i64 = admin
        .query_one(
            "SELECT count(*) FROM baton.fence_log WHERE op = 'operator-reset' AND token = 41",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(logged, 1, "the reset is in fence_log");
}

/// The private PostgreSQL trusts nobody: no password, no entry, on TCP or on its socket as
/// another OS user. (It used to `trust` every local connection: any OS user could connect as the
/// superuser and switch fencing off.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_private_postgres_asks_every_client_for_a_password() {
    let pg = private_pg().await;
    for role in ["postgres", "baton_app", "baton_lease"] {
        let url = format!("postgres://{role}@127.0.0.1:{}/baton", pg.server.port);
        let err = tokio_postgres::connect(&url, NoTls)
            .await
            .err()
            .unwrap_or_else(|| panic!("{role} connected without a password"));
        let wrong = format!("postgres://{role}:guess@127.0.0.1:{}/baton", pg.server.port);
        let err2 = tokio_postgres::connect(&wrong, NoTls)
            .await
            .err()
            .unwrap_or_else(|| panic!("{role} connected with a wrong password"));
        eprintln!("{role}: {err} / {err2}");
    }
    // Another OS user on the socket, claiming to be the superuser: peer auth says no.
    let sock = pg.dir.path().join("pg").join("sock");
    let out = std::process::Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(pg.server.bin_dir.join("psql"))
        .arg("-h")
        .arg(&sock)
        .args([
            "-p",
            &pg.server.port.to_string(),
            "-U",
            "postgres",
            "-d",
            "baton",
            "-c",
            "SELECT 1",
            "-w",
        ])
        .output()
        .expect("run psql as nobody");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("Peer authentication failed"),
        "OS user nobody on the socket as the superuser: not refused by peer auth ({stderr})"
    );
    // With the generated password, the application role gets in (and only calls functions).
    connect(&pg.server.app_url()).await;
}

/// The holder is who authenticated: a node's own role writes only under its own name, and once
/// the resource requires per-node roles (as `baton fleet` sets it), the shared role is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_is_the_authenticated_node_role() {
    let pg = private_pg().await;
    let n1 = connect(&pg.server.node_role_url("n1").await.unwrap()).await;
    let as_n2 = n1
        .query("SELECT * FROM baton.seq_claim('seq', 5, 'n2')", &[])
        .await
        .expect_err("n1's role claiming as n2");
    assert_eq!(as_n2.code().map(|c| c.code()), Some("42501"), "{as_n2}");
    let as_n2 = n1
        .query(
            "SELECT * FROM baton.fence_record_rejection('seq', 1, 'n2')",
            &[],
        )
        .await
        .expect_err("n1's role recording a rejection as n2");
    assert_eq!(as_n2.code().map(|c| c.code()), Some("42501"), "{as_n2}");
    let ok: bool = n1
        .query_one("SELECT accepted FROM baton.seq_claim('seq', 5, 'n1')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(ok, "n1's role claims as n1");
    // seq_commit restates the holder rule (the hot path calls no helper): the same refusal.
    let as_n2 = n1
        .query("SELECT * FROM baton.seq_commit('seq', 5, 'n2', 1, 10)", &[])
        .await
        .expect_err("n1's role committing as n2");
    assert_eq!(as_n2.code().map(|c| c.code()), Some("42501"), "{as_n2}");
    let ok: bool = n1
        .query_one(
            "SELECT accepted FROM baton.seq_commit('seq', 5, 'n1', 1, 10)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ok, "n1's role commits as n1");
    // The role's session timeouts are its own (role settings do not inherit).
    let idle: String = n1
        .query_one("SHOW idle_in_transaction_session_timeout", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(idle, "5s");

    let shared = connect(&pg.server.app_url()).await;
    shared
        .query_one(
            "SELECT accepted FROM baton.seq_claim('seq', 6, 'anyone')",
            &[],
        )
        .await
        .expect("the shared role may name a holder while per-node roles are not required");
    baton::work::fence::set_require_node_roles(&pg.server.admin_url(), true)
        .await
        .unwrap();
    let err = shared
        .query("SELECT * FROM baton.seq_claim('seq', 7, 'anyone')", &[])
        .await
        .expect_err("the shared role once per-node roles are required");
    assert_eq!(err.code().map(|c| c.code()), Some("42501"), "{err}");
    let err = shared
        .query(
            "SELECT * FROM baton.seq_commit('seq', 6, 'anyone', 11, 20)",
            &[],
        )
        .await
        .expect_err("the shared role committing once per-node roles are required");
    assert_eq!(err.code().map(|c| c.code()), Some("42501"), "{err}");
    let bad =
        baton::work::fence::provision_node_role(&pg.server.admin_url(), "n1\"; DROP", "x").await;
    assert!(bad.is_err(), "a node id that cannot name a role is refused");
}

/// The sequencer's pipelined group commits (`[sequencer] commits_in_flight`): commits sent on
/// one `SeqPipe` run in the order they were sent, even when the caller awaits them in the
/// reverse order, so a later range never reaches the fence row before an earlier one (which
/// the resource refuses as `seq-not-forward`, ending the term). Sent lazily (on the await), the
/// reversed awaits below would send the highest range first and every other commit would be
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_commits_run_in_the_order_sent() {
    use baton::backends::FenceToken;
    use std::sync::Arc;
    let pg = private_pg().await;
    let resource = baton::config::ResourceConfig {
        database_url: pg.server.app_url(),
        ..Default::default()
    };
    let fence = baton::work::Fence::new(&resource, "n1").unwrap();
    let token = FenceToken(7);
    assert_eq!(fence.seq_claim("seq", token).await.unwrap(), 0);
    let pipe = Arc::new(fence.seq_pipe("seq").await.unwrap());
    const COMMITS: i64 = 50;
    let mut sent: Vec<_> = (0..COMMITS)
        .map(|k| pipe.send_commit(token, k * 10 + 1, k * 10 + 10))
        .collect();
    sent.reverse();
    let outcomes = futures::future::join_all(sent).await;
    let refused: Vec<String> = outcomes
        .iter()
        .filter_map(|o| o.as_ref().err().map(|e| e.to_string()))
        .collect();
    assert!(refused.is_empty(), "refused: {refused:?}");
    let admin = connect(&pg.server.admin_url()).await;
    let logged: Vec<(i64, i64)> = admin
        .query(
            "SELECT seq_lo, seq_hi FROM baton.fence_log WHERE op = 'next' ORDER BY pos",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let expected: Vec<(i64, i64)> = (0..COMMITS).map(|k| (k * 10 + 1, k * 10 + 10)).collect();
    assert_eq!(logged, expected, "committed in another order");
    let last = last_seq(&admin).await;
    assert_eq!(last, COMMITS * 10);
    // A later commit after a refused one still runs: each is its own transaction.
    let stale = pipe.send_commit(token, 5, 6);
    let fine = pipe.send_commit(token, COMMITS * 10 + 1, COMMITS * 10 + 1);
    assert!(stale.await.is_err(), "a range that does not move forward");
    fine.await.expect("the commit behind a refused one");
}

/// A commit the database never answers (its backend stopped: the kernel still acknowledges
/// the bytes, so only a deadline on the client side can tell) fails as unavailable within the
/// bound (the server's statement timeout plus a second), and that connection leaves the pool:
/// the next pipe is a new connection and commits while the old backend is still stopped.
/// Without the bound the commit waits for as long as the backend is stopped, and without the
/// detach the next pipe is the same dead connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_the_database_never_answers_fails_in_time_and_its_connection_is_replaced() {
    use baton::backends::FenceToken;
    use std::sync::Arc;
    let pg = private_pg().await;
    let statement_timeout_ms = 500;
    let resource = baton::config::ResourceConfig {
        database_url: pg.server.app_url(),
        statement_timeout_ms,
        ..Default::default()
    };
    let bound = Duration::from_millis(statement_timeout_ms + 1000);
    let fence = baton::work::Fence::new(&resource, "n1").unwrap();
    let token = FenceToken(3);
    assert_eq!(fence.seq_claim("seq", token).await.unwrap(), 0);
    let pipe = Arc::new(fence.seq_pipe("seq").await.unwrap());
    pipe.send_commit(token, 1, 10).await.expect("first commit");
    let admin = connect(&pg.server.admin_url()).await;
    let backend_of_pipe = || async {
        let rows = admin
            .query(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE '%seq_commit%' \
                 AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap();
        rows.iter().map(|r| r.get::<_, i32>(0)).collect::<Vec<_>>()
    };
    let pids = backend_of_pipe().await;
    assert_eq!(
        pids.len(),
        1,
        "one backend ran the pipe's commits: {pids:?}"
    );
    let stopped = Stopped::stop(pids[0]);

    let began = Instant::now();
    let outcome = tokio::time::timeout(
        bound + Duration::from_secs(5),
        pipe.send_commit(token, 11, 20),
    )
    .await
    .expect("the commit to a stopped backend must end by itself, not wait for it");
    let took = began.elapsed();
    let err = outcome.expect_err("an unanswered commit cannot succeed");
    assert!(
        matches!(err, baton::work::FenceError::Unavailable(_)),
        "unavailable, outcome unknown: {err}"
    );
    assert!(
        took >= bound - Duration::from_millis(50) && took < bound + Duration::from_secs(1),
        "gave up after {took:?}, the bound is {bound:?}"
    );
    assert!(pipe.is_closed(), "the pipe is presumed dead");
    drop(pipe);

    // The old backend is still stopped: a pipe that commits now is another connection.
    let fresh = tokio::time::timeout(Duration::from_secs(10), async {
        let pipe = Arc::new(fence.seq_pipe("seq").await?);
        pipe.send_commit(token, 21, 30).await
    })
    .await
    .expect("the next pipe must not be the stopped connection");
    fresh.expect("a commit on a new connection");
    assert_eq!(last_seq(&admin).await, 30);
    drop(stopped);
}

/// A fenced transaction whose server stops answering fails as unavailable within the bound, at
/// `begin` and at `commit`, and that connection leaves the pool: with a pool of one, the next
/// `begin` opens a new connection and commits while the old backend is still stopped. Without
/// the bound each call waits for as long as the backend is stopped; without the detach the
/// next `begin` is handed the stopped connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_transaction_the_database_never_answers_fails_in_time_and_its_connection_is_replaced(
) {
    use baton::backends::FenceToken;
    use baton::work::{Fence, FenceError};
    let pg = private_pg().await;
    let statement_timeout_ms = 500;
    let resource = baton::config::ResourceConfig {
        database_url: pg.server.app_url(),
        statement_timeout_ms,
        pool_size: 1,
        ..Default::default()
    };
    let bound = Duration::from_millis(statement_timeout_ms + 1000);
    let fence = Fence::new(&resource, "n1").unwrap();
    let token = FenceToken(3);
    // A fenced transaction that commits: the pid of the backend it ran on.
    let fence = &fence;
    let write = move || async move {
        let tx = fence.begin("orders", token).await?;
        let pid: i32 = tx
            .client()
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        tx.commit().await?;
        Ok::<_, FenceError>(pid)
    };
    let within_bound = |took: Duration| {
        assert!(
            took >= bound - Duration::from_millis(50) && took < bound + Duration::from_secs(1),
            "gave up after {took:?}, the bound is {bound:?}"
        );
    };
    let first = write().await.expect("a fenced write");
    assert_eq!(
        write().await.expect("a second fenced write"),
        first,
        "a pool of one reuses its connection"
    );

    // `begin` on the stopped connection.
    let stopped = Stopped::stop(first);
    let began = Instant::now();
    let outcome =
        tokio::time::timeout(bound + Duration::from_secs(5), fence.begin("orders", token))
            .await
            .expect("a begin on a stopped backend must end by itself, not wait for it");
    within_bound(began.elapsed());
    assert!(
        matches!(outcome, Err(FenceError::Unavailable(_))),
        "unavailable: {:?}",
        outcome.err()
    );
    let second = tokio::time::timeout(Duration::from_secs(10), write())
        .await
        .expect("the next begin must not be handed the stopped connection")
        .expect("a fenced write on a new connection");
    assert_ne!(second, first, "a new backend");

    // `commit` on a connection that stops answering after its statements ran.
    let tx = fence.begin("orders", token).await.expect("begin");
    let pid: i32 = tx
        .client()
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(pid, second, "a pool of one reuses its connection");
    let stopped_too = Stopped::stop(pid);
    let began = Instant::now();
    let outcome = tokio::time::timeout(bound + Duration::from_secs(5), tx.commit())
        .await
        .expect("a commit on a stopped backend must end by itself, not wait for it");
    within_bound(began.elapsed());
    assert!(
        matches!(outcome, Err(FenceError::Unavailable(_))),
        "unavailable, outcome unknown: {outcome:?}"
    );
    // The stopped transaction still holds the fence row (its `fence_assert` ran), so a new
    // fenced write waits for that lock until the statement timeout ends it: an error in time,
    // not a hang. Once the backend runs again, the write after is served on a new connection
    // (the old one was closed; the server then ends that backend).
    let blocked = tokio::time::timeout(bound + Duration::from_secs(5), write())
        .await
        .expect("a write behind the stopped holder's lock must end by itself");
    assert!(
        matches!(blocked, Err(FenceError::Unavailable(_))),
        "unavailable: {blocked:?}"
    );
    drop(stopped_too);
    let third = tokio::time::timeout(Duration::from_secs(10), write())
        .await
        .expect("the next begin must not be handed the stopped connection")
        .expect("a fenced write on a new connection");
    assert!(third != first && third != second, "a new backend");
    drop(stopped);
}
