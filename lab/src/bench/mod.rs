//! `baton bench`: measurements against a real local fleet, timed on the resource's clock
//! (`baton.fence_log.committed_at`), never on a test's wall clock.
//!
//! * [`failover`] — `baton bench failover --backend B --trials N [--stepdown]`: kill -9 (or step
//!   down) the leader under a steady sequential `POST /next` load, N times; failover = first
//!   `next` write of the new leadership − last `next` write of the old one.
//! * [`read`] — `baton bench read`: `GET /read` per mode and backend, side by side.
//! * [`shards`] — `baton bench shards --shards 1,4,16`: aggregate `POST /next` IDs/s against K.
//! * [`cost`] — `baton bench cost`: idle CPU, memory and backend requests per node, and election
//!   latency after a leader kill, against fleet size, per backend.

pub use crate::report::{machine_info, percentile, Summary};

pub mod cost;
pub mod failover;
pub mod next;
pub mod read;
pub mod shard_events;
pub mod shards;

use std::path::PathBuf;

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
        shards: 1,
        resource_standby: None,
        redis_topology: Default::default(),
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
    /// Aggregate POST /next throughput against the shard count K (a fresh fleet per K).
    Shards(shards::ShardsArgs),
    /// Membership events on a sharded fleet under load (moves, dark
    /// time per shard, balance, backend load, the history check per shard).
    ShardEvents(shard_events::ShardEventsArgs),
}

pub async fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Cost(args) => cost::run(args).await.map(|_| ()),
        BenchCmd::Failover(args) => failover::run(args).await.map(|_| ()),
        BenchCmd::Next(args) => next::run(args).await.map(|_| ()),
        BenchCmd::Read(args) => read::run(args).await.map(|_| ()),
        BenchCmd::Shards(args) => shards::run(args).await.map(|_| ()),
        BenchCmd::ShardEvents(args) => shard_events::run(args).await.map(|_| ()),
    }
}

/// Writes a bench's report as pretty JSON to `out` (creating its directory), if one is given.
pub(crate) fn write_report(
    out: Option<&std::path::Path>,
    report: &impl Serialize,
) -> anyhow::Result<()> {
    if let Some(out) = out {
        if let Some(parent) = out.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(out, serde_json::to_vec_pretty(report)?)?;
        println!("wrote {}", out.display());
    }
    Ok(())
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

/// Jiffies of all CPUs from `/proc/stat`, and the CPU count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CpuTimes {
    /// Neither idle nor iowait (steal included: time this guest wanted and did not get).
    pub busy: u64,
    /// Taken by the hypervisor for other guests while this one was runnable.
    pub steal: u64,
    pub total: u64,
    pub cpus: usize,
}

pub(crate) fn parse_proc_stat(text: &str) -> Option<CpuTimes> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|s| s.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice, already in user/nice].
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    let cpus = text
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    Some(CpuTimes {
        busy: total - idle,
        steal: v.get(7).copied().unwrap_or(0),
        total,
        cpus,
    })
}

/// The whole machine's CPU times now.
pub(crate) fn machine_cpu() -> Option<CpuTimes> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// The whole machine over a window, beside a figure: what it did, and what the hypervisor's
/// other guests took from it (a shared host's neighbour that no process list shows).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct CpuWindow {
    /// Busy cores, steal included.
    pub busy_cores: f64,
    /// Steal as a share of all CPU time in the window, in percent.
    pub steal_percent: f64,
}

/// The machine between two [`machine_cpu`] samples (`None` if either is missing or the clock
/// did not move).
pub(crate) fn cpu_window(a: Option<CpuTimes>, b: Option<CpuTimes>) -> Option<CpuWindow> {
    let (a, b) = (a?, b?);
    let total = b.total.checked_sub(a.total).filter(|t| *t > 0)? as f64;
    Some(CpuWindow {
        busy_cores: b.busy.checked_sub(a.busy)? as f64 / total * a.cpus as f64,
        steal_percent: b.steal.checked_sub(a.steal)? as f64 / total * 100.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_gives_busy_steal_and_the_window_between_two_samples() {
        let stat = "cpu  100 5 50 1000 20 1 2 3 0 0\ncpu0 50 2 25 500 10 1 1 1 0 0\ncpu1 50 3 25 500 10 0 1 2 0 0\nintr 1\n";
        let a = parse_proc_stat(stat).unwrap();
        assert_eq!(
            a,
            CpuTimes {
                busy: 161,
                steal: 3,
                total: 1181,
                cpus: 2
            }
        );
        // 100 more jiffies: 60 busy, of which 10 steal.
        let b = CpuTimes {
            busy: 221,
            steal: 13,
            total: 1281,
            cpus: 2,
        };
        let w = cpu_window(Some(a), Some(b)).unwrap();
        assert!((w.busy_cores - 1.2).abs() < 1e-9, "{w:?}");
        assert!((w.steal_percent - 10.0).abs() < 1e-9, "{w:?}");
        assert_eq!(cpu_window(Some(b), Some(b)), None, "no time passed");
        assert_eq!(cpu_window(None, Some(b)), None);
    }

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
