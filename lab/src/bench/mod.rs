//! `baton bench`: measurements against a real local fleet, timed on the resource's clock
//! (`baton.fence_log.committed_at`), never on a test's wall clock.
//!
//! * [`failover`] — `baton bench failover --backend B --trials N [--stepdown]`: kill -9 (or step
//!   down) the leader under a steady sequential `POST /next` load, N times; failover = first
//!   `next` write of the new leadership − last `next` write of the old one.
//! * [`read`] — `baton bench read`: `GET /read` per mode and backend, side by side.
//! * [`cost`] — `baton bench cost`: idle CPU, memory and backend requests per node, and election
//!   latency after a leader kill, against fleet size, per backend.

pub mod cost;
pub mod failover;
pub mod next;
pub mod read;

use std::path::PathBuf;
use std::process::Command;

use serde::Serialize;

use crate::fleet::{self, FleetSpec};
use baton::backends::BackendKind;
use baton::config::Fencing;

/// A bench's fleet: `dir` made ready for it (a stopped fleet there is wiped), fencing on, and
/// `config/<backend>.toml` as the base config unless one is given.
pub(crate) fn bench_fleet_spec(
    dir: PathBuf,
    nodes: usize,
    backend: BackendKind,
    config: Option<PathBuf>,
    lease_ttl_ms: Option<u64>,
) -> anyhow::Result<FleetSpec> {
    fleet::prepare_scratch_dir(&dir)?;
    Ok(FleetSpec {
        nodes,
        backend,
        dir,
        base_config: config.or_else(|| fleet::default_base_config(backend)),
        fencing: Fencing::On,
        lease_ttl_ms,
        node_args: Vec::new(),
    })
}

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// Cost against fleet size: idle CPU, RSS and backend requests per node, election latency.
    Cost(cost::CostArgs),
    /// Failover (kill -9 of the leader) or step-down dark time, from the resource's ledger.
    Failover(failover::FailoverArgs),
    /// Sequencer throughput: open-loop POST /next at a fixed rate, beside a no-batching baseline.
    Next(next::NextArgs),
    /// GET /read per mode (lease, quorum, resource) per backend: throughput, p50/p99, fallbacks.
    Read(read::ReadArgs),
}

pub async fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Cost(args) => cost::run(args).await.map(|_| ()),
        BenchCmd::Failover(args) => failover::run(args).await.map(|_| ()),
        BenchCmd::Next(args) => next::run(args).await.map(|_| ()),
        BenchCmd::Read(args) => read::run(args).await.map(|_| ()),
    }
}

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
    if q == 50.0 && n % 2 == 0 {
        return (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0;
    }
    let rank = ((q / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

fn command_line(cmd: &str, args: &[&str]) -> Option<String> {
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
        "nproc": command_line("nproc", &[]).and_then(|s| s.parse::<u64>().ok()),
        "kernel": command_line("uname", &["-r"]),
        "cpu": cpu,
        "baton_version": env!("CARGO_PKG_VERSION"),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "commit": crate::exp::git_commit(),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
    })
}

/// The three load averages of `/proc/loadavg` (1, 5, 15 min).
pub(crate) fn parse_loadavg(text: &str) -> Option<[f64; 3]> {
    let mut f = text.split_whitespace().map(|s| s.parse::<f64>().ok());
    Some([f.next()??, f.next()??, f.next()??])
}

/// This machine's load averages now: what else was running, recorded beside every figure.
pub(crate) fn loadavg() -> Option<[f64; 3]> {
    parse_loadavg(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_uses_nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        let s = Summary::of(&v).unwrap();
        assert_eq!(s.median, 10.5);
        assert_eq!(s.p99, 20.0);
        assert_eq!(s.max, 20.0);
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(Summary::of(&v).unwrap().p99, 198.0);
        assert_eq!(Summary::of(&[3.0, 1.0, 2.0]).unwrap().median, 2.0);
        assert!(Summary::of(&[]).is_none());
    }
}
