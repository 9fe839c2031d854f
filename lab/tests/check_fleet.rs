//! The load generator and the history checker against a real fleet (etcd, PostgreSQL, three
//! node processes): open-loop load through a step-down passes every invariant; a ledger row that
//! reuses a seq under an older token — what fencing off lets through — fails it, by name.

mod common;

use std::process::Command;
use std::time::Duration;

use baton_lab::check::{self, load::acks_from_ops};
use baton_lab::load::{self, LoadSpec, Outcome};
use common::{Fleet, BATON};

const SETTLE: Duration = Duration::from_secs(30);

fn baton_check(fleet: &Fleet, history: &std::path::Path) -> (i32, String) {
    let out = Command::new(BATON)
        .args([
            "check",
            "--dir",
            fleet.path().to_str().unwrap(),
            "--history",
            history.to_str().unwrap(),
        ])
        .env("RUST_LOG", "warn")
        .output()
        .expect("run baton check");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.code().is_some(),
        "baton check died: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap(), stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_load_through_a_stepdown_passes_and_an_injected_seq_reuse_fails() {
    let fleet = Fleet::up_with("etcd", 3, &[]);
    let (l1, addr1, t1) = fleet.leader(SETTLE).await;

    // 200 req/s for 4 s over 4 connections, with a step-down of the leader at ~1.5 s.
    let targets = fleet
        .state()
        .nodes
        .iter()
        .map(|n| n.http_addr.clone())
        .collect();
    let mut spec = LoadSpec::new(targets, 200.0, Duration::from_secs(4));
    spec.connections = 4;
    let run = tokio::spawn(load::run(spec));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = fleet.client.post(&addr1, "/stepdown").await.unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    let (_, _, t2) = fleet.new_leader(&l1, t1, SETTLE).await;
    let report = run.await.unwrap().unwrap();
    let summary = report.summary();
    eprint!("{}", report.render());

    assert_eq!(
        report.ops.len() as u64 + report.unsent,
        800,
        "every slot is accounted for"
    );
    assert!(
        summary.ok >= 600,
        "too few acknowledged IDs through one step-down: {summary:?}"
    );
    assert!(
        summary.tokens.contains(&t1) && summary.tokens.contains(&t2),
        "tokens {:?}, leaders {t1} then {t2}",
        summary.tokens
    );
    assert!(
        summary.achieved_rate > 150.0,
        "open loop fell behind: {summary:?}"
    );
    // Each slot was scheduled at t0 + i/R and not sent before it.
    for op in &report.ops {
        assert_eq!(
            op.sched_ns,
            report.t0_ns + op.id * 5_000_000,
            "slot {} mis-scheduled",
            op.id
        );
        assert!(
            op.invoke_ns >= op.sched_ns && op.complete_ns >= op.invoke_ns,
            "{op:?}"
        );
    }
    let history = fleet.path().join("history.jsonl");
    load::write_history(&history, &report.ops).unwrap();
    assert_eq!(load::read_history(&history).unwrap(), report.ops);

    // The checker as a library, over the ledger and this history: PASS.
    let admin = fleet.admin_db().await;
    let mut input = check::load::read(&admin, None).await.unwrap();
    input.acks = acks_from_ops("history.jsonl", &report.ops);
    let verdict = check::run(&input);
    assert!(verdict.pass, "{}", verdict.render());
    assert_eq!(verdict.acked, report.count(Outcome::Ok));
    let acting: Vec<i64> = verdict.timeline.intervals.iter().map(|i| i.token).collect();
    assert!(
        acting.contains(&t1) && acting.contains(&t2),
        "timeline {acting:?}"
    );
    assert!(verdict.timeline.interleavings.is_empty());

    // ...and as `baton check`: exit 0 and the PASS line.
    let (code, stdout) = baton_check(&fleet, &history);
    eprintln!("{stdout}");
    assert_eq!(code, 0, "{stdout}");
    let pass = stdout.lines().last().unwrap();
    assert!(
        pass.starts_with("check: PASS (")
            && pass.ends_with(&format!("{} acked IDs)", verdict.acked)),
        "{pass}"
    );

    // The bug, for real: the old leader's token commits a seq it already handed out, after the
    // new leader took over. (Fencing on refuses this; with fencing off the resource stores it.)
    let (_, reused) = report
        .acked()
        .into_iter()
        .filter(|(t, _)| *t == t1)
        .nth(50)
        .expect("IDs under the first token");
    admin
        .execute(
            "INSERT INTO baton.fence_log (resource, token, holder, op, seq_lo, seq_hi) VALUES ('sequence', $1, $2, 'next', $3, $3)",
            &[&t1, &l1, &reused],
        )
        .await
        .unwrap();
    let mut input = check::load::read(&admin, None).await.unwrap();
    input.acks = acks_from_ops("history.jsonl", &report.ops);
    let verdict = check::run(&input);
    assert!(!verdict.pass);
    let v = verdict
        .failed("seq_increasing")
        .unwrap_or_else(|| panic!("seq_increasing must fail:\n{}", verdict.render()));
    assert!(
        v.message.starts_with(&format!("seq {reused} reused: "))
            && v.message.contains(&format!("(token {t1}, holder {l1})")),
        "{}",
        v.message
    );
    let v = verdict
        .failed("token_order")
        .expect("token_order must fail");
    assert!(
        v.message
            .contains(&format!("accepted token {t1} (holder {l1})")),
        "{}",
        v.message
    );
    let v = verdict
        .failed("acked_in_ledger")
        .expect("acked_in_ledger must fail");
    assert!(
        v.message.contains(&format!("(token {t1}, seq {reused})")) && v.message.contains("2 times"),
        "{}",
        v.message
    );
    assert!(
        verdict.failed("acting_timeline").is_some(),
        "the old token now writes inside the new one's span"
    );

    let (code, stdout) = baton_check(&fleet, &history);
    eprintln!("{stdout}");
    assert_eq!(code, 1, "{stdout}");
    let fail = stdout.lines().last().unwrap();
    assert!(
        fail.starts_with("check: FAIL token_order: ") && fail.contains("seq_increasing"),
        "{fail}"
    );
    assert!(
        stdout.contains(&format!("FAIL  seq_increasing: seq {reused} reused")),
        "{stdout}"
    );
}

/// `baton load` as a command: a history file and the summary lines, then `baton check --json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_load_writes_a_history_that_baton_check_json_accepts() {
    let fleet = Fleet::up_with("etcd", 2, &[]);
    let (_, _, token) = fleet.leader(SETTLE).await;
    let dir = fleet.path().to_str().unwrap().to_owned();
    let history = fleet.path().join("h.jsonl");
    let out = common::baton(&[
        "load",
        "--dir",
        &dir,
        "--rate",
        "300",
        "--duration",
        "2s",
        "--connections",
        "2",
        "--history",
        history.to_str().unwrap(),
    ]);
    assert!(out.contains("load: 600 requests in "), "{out}");
    assert!(
        out.contains("outcomes: ok ") && out.contains("p999"),
        "{out}"
    );
    let ops = load::read_history(&history).unwrap();
    assert_eq!(ops.len(), 600);
    // A quiet fleet answers (almost) everything, all under the one token.
    let ok: Vec<_> = ops.iter().filter(|o| o.outcome == Outcome::Ok).collect();
    assert!(ok.len() >= 590, "{} of 600 ok on a quiet fleet", ok.len());
    assert!(ok.iter().all(|o| o.token == Some(token)));

    let out = Command::new(BATON)
        .args([
            "check",
            "--dir",
            &dir,
            "--history",
            history.to_str().unwrap(),
            "--resource",
            "sequence",
            "--json",
        ])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["pass"], true);
    assert_eq!(v["acked"], ok.len());
    assert_eq!(v["violations"].as_array().unwrap().len(), 0);
    assert_eq!(v["timeline"]["intervals"][0]["token"], token);
}
