//! The nemesis, short (`baton exp nemesis --quick --backends raft`): ~100 seeded random faults of
//! every kind raft can take (kills of leader / follower / mid step-down with state kept or wiped,
//! pauses below and above the lease, partitions from peers / PostgreSQL / both, a clock-rate fault
//! under libfaketime, PostgreSQL kill -9, step-downs and transfers) under load, through the real
//! binary; the checker over the history and the ledger must pass and ≥ 90% of the faults must have
//! been observed in effect. Then a prefix of the same schedule with the fence switched off, which
//! must fail. Needs root (network namespaces), like the partition experiments. Serialized: each
//! run is a whole fleet on a 2-core machine.

use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use serde_json::Value;

const BATON: &str = env!("CARGO_BIN_EXE_baton");

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// `baton exp nemesis --quick --backends raft ARGS` into a temp dir; (exit code, stdout, dir).
fn nemesis(args: &[&str]) -> (i32, String, tempfile::TempDir) {
    let tmp = tempfile::Builder::new()
        .prefix("baton-nemesis-")
        .tempdir()
        .unwrap();
    let t = Instant::now();
    let o = Command::new(BATON)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .args(["exp", "nemesis", "--quick", "--backends", "raft", "--out"])
        .arg(tmp.path().join("results"))
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run baton exp nemesis");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    eprintln!(
        "baton exp nemesis --quick {args:?}: {:.1}s\n{stdout}{}",
        t.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&o.stderr)
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path().join("state/nemesis"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "fleet dirs left behind: {left:?}");
    (o.status.code().unwrap_or(-1), stdout, tmp)
}

fn run_json(dir: &Path, label: &str) -> Value {
    let p = dir.join("results").join(format!("{label}.json"));
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

#[test]
fn a_hundred_seeded_faults_take_effect_and_the_checker_passes() {
    let _g = serial();
    let (code, stdout, dir) = nemesis(&[]);
    assert_eq!(code, 0, "{stdout}");
    let v = run_json(dir.path(), "raft");
    assert_eq!(v["verdict"]["pass"], true, "{}", v["verdict"]["line"]);
    let n = &v["nemesis"];
    assert_eq!(n["drawn"], 100, "{n}");
    assert_eq!(n["enough_took_effect"], true, "{n}");
    assert!(n["took_effect"].as_u64().unwrap() >= 90, "{n}");
    // Every kind raft can take was drawn and bit at least once.
    for kind in [
        "kill-leader",
        "kill-follower",
        "kill-stepping-down",
        "pause-leader",
        "partition-leader",
        "partition-leader-resource",
        "partition-leader-both",
        "stepdown",
        "transfer",
    ] {
        let k = &n["by_kind"][kind];
        assert!(
            k["took_effect"].as_u64().unwrap_or(0) >= 1,
            "{kind} never took effect: {n}"
        );
    }
    assert!(n["acked"].as_u64().unwrap() > 1000, "{n}");
    assert!(n["availability"].as_f64().unwrap() > 0.3, "{n}");
    // Durable and unique: every acknowledged ID is in the ledger once, across PostgreSQL kills.
    assert_eq!(v["verdict"]["violations"].as_array().unwrap().len(), 0);
    let results = dir.path().join("results");
    let svg = std::fs::read_to_string(results.join("raft-nemesis.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("took effect"));
    let summary = std::fs::read_to_string(results.join("summary.md")).unwrap();
    assert!(summary.contains("## Nemesis"), "{summary}");
}

#[test]
fn the_same_schedule_with_the_fence_off_fails_the_checker() {
    let _g = serial();
    let (code, stdout, dir) =
        nemesis(&["--fencing", "off", "--faults", "40", "--duration", "120s"]);
    assert_eq!(
        code, 0,
        "the fencing-off run must fail as expected:\n{stdout}"
    );
    let v = run_json(dir.path(), "raft-fencing-off");
    assert_eq!(v["fencing"], "off");
    assert_eq!(v["verdict"]["pass"], false, "{}", v["verdict"]["line"]);
    assert!(
        !v["verdict"]["violations"].as_array().unwrap().is_empty(),
        "{}",
        v["verdict"]
    );
    assert_eq!(v["nemesis"]["enough_took_effect"], true, "{}", v["nemesis"]);
    assert!(
        stdout.contains("nemesis/raft-fencing-off: check: FAIL "),
        "{stdout}"
    );
}
