//! What every report records beside its figures: order statistics of a sample, the machine it
//! ran on, and the commit. Shared by `baton bench` and `baton exp`, so neither imports the other.

use std::process::Command;

use serde::Serialize;

/// Order statistics of a sample, in the sample's unit.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub median: f64,
    /// Nearest-rank p99 (with fewer than 100 samples this is the maximum).
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    pub fn of(values: &[f64]) -> Option<Summary> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        Some(Summary {
            n: v.len(),
            min: v[0],
            median: percentile(&v, 50.0),
            p99: percentile(&v, 99.0),
            max: v[v.len() - 1],
            mean: v.iter().sum::<f64>() / v.len() as f64,
        })
    }
}

/// Nearest-rank percentile of an ascending, non-empty slice; the median of an even-sized sample
/// is the mean of the two middle values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    if q == 50.0 && n.is_multiple_of(2) {
        return (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0;
    }
    let rank = ((q / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// `cmd args`'s standard output, trimmed, when it ran and succeeded.
fn command_out(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// What ran the benchmark: `nproc`, `uname -r`, the CPU model, the baton version.
pub fn machine_info() -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|t| {
        t.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
    });
    serde_json::json!({
        "nproc": command_out("nproc", &[]).and_then(|s| s.parse::<u64>().ok()),
        "kernel": command_out("uname", &["-r"]),
        "cpu": cpu,
        "baton_version": env!("CARGO_PKG_VERSION"),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "commit": git_commit(),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
    })
}

/// `git rev-parse HEAD`, with `+dirty` when tracked files differ from it.
pub fn git_commit() -> String {
    let head = command_out("git", &["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = command_out("git", &["status", "--porcelain", "--untracked-files=no"])
        .is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{head}+dirty")
    } else {
        head
    }
}
