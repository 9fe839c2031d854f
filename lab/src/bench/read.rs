//! `baton bench read`: what a lease read buys. For every backend, one fleet, and on it
//! `GET /read` in each mode at a fixed offered rate (open loop, from [`crate::load`], latency
//! counted from each request's scheduled time): `lease` (from the leader's memory inside the
//! lease window), `quorum` (a linearizable leadership check with the backend first) and
//! `resource` (one read of PostgreSQL), side by side, with the share of lease reads that found
//! their window closed and fell back to quorum.
//!
//! ```text
//! baton bench read --backends raft,etcd,pg-lease,redis,zk --rate 2000 --duration 10s \
//!     --out experiments/results/bench-read/all.json
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde::Serialize;

use super::{bench_fleet_spec, machine_info};
use crate::fleet::{self, client::NodeClient, FleetState};
use crate::load::{self, LoadSpec};
use baton::backends::BackendKind;
use baton::config::parse_duration_ms;

#[derive(clap::Args, Clone, Debug)]
pub struct ReadArgs {
    /// Backends, one fleet each (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "raft,etcd,pg-lease,redis,zk"
    )]
    pub backends: Vec<BackendKind>,
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Read modes, measured one after another on each fleet.
    #[arg(long, value_delimiter = ',', default_value = "lease,quorum,resource")]
    pub modes: Vec<String>,
    /// Offered reads per second.
    #[arg(long, default_value_t = 2000.0)]
    pub rate: f64,
    #[arg(long, value_parser = parse_duration_ms, default_value = "10s")]
    pub duration: u64,
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// Unmeasured warm-up before each mode.
    #[arg(long, value_parser = parse_duration_ms, default_value = "2s")]
    pub warmup: u64,
    /// Scratch root (each backend's fleet in `<dir>/read-<backend>`).
    #[arg(long, default_value = "state/bench")]
    pub dir: PathBuf,
    /// Write the report as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct ReadRow {
    pub backend: BackendKind,
    pub mode: String,
    pub offered_rate: f64,
    /// Answered reads per second.
    pub ok_per_s: f64,
    pub ok: usize,
    pub errors: usize,
    /// From each read's scheduled time (open loop).
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// From its actual send (the server's share).
    pub service_p50_ms: f64,
    pub service_p99_ms: f64,
    /// Lease reads answered by quorum because the window was closed, of the answered ones.
    pub fell_back_fraction: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct ReadReport {
    pub rows: Vec<ReadRow>,
    pub connections: usize,
    pub duration_ms: u64,
    pub errors: Vec<String>,
    pub machine: serde_json::Value,
}

pub async fn run(args: ReadArgs) -> anyhow::Result<ReadReport> {
    for m in &args.modes {
        if !["lease", "quorum", "resource"].contains(&m.as_str()) {
            bail!("read mode must be lease, quorum or resource, not {m:?}");
        }
    }
    let mut rows = Vec::new();
    let mut errors = Vec::new();
    for &backend in &args.backends {
        let dir = args.dir.join(format!("read-{backend}"));
        let spec = bench_fleet_spec(dir, args.nodes, backend, None, None)?;
        let state = match fleet::up(&spec).await {
            Ok(s) => s,
            Err(e) => {
                errors.push(format!("{backend}: fleet up: {e:#}"));
                continue;
            }
        };
        let outcome = tokio::select! {
            r = measure(&args, backend, &state) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted (Ctrl-C)")),
        };
        let down = state.clone();
        let _ = tokio::task::spawn_blocking(move || down.down()).await;
        match outcome {
            Ok(r) => rows.extend(r),
            Err(e) => errors.push(format!("{backend}: {e:#}")),
        }
    }
    println!("{}", render(&rows));
    for e in &errors {
        println!("error: {e}");
    }
    let report = ReadReport {
        rows,
        connections: args.connections,
        duration_ms: args.duration,
        errors,
        machine: machine_info(),
    };
    super::write_report(args.out.as_deref(), &report)?;
    Ok(report)
}

/// Waits until some node answers a read (a leader whose work has claimed its state).
async fn wait_for_reads(state: &FleetState) -> anyhow::Result<()> {
    let client = NodeClient::new(Duration::from_secs(2));
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        for n in &state.nodes {
            if let Ok(r) = client.get(&n.http_addr, "/read?mode=quorum").await {
                if r.status == 200 {
                    return Ok(());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("no node answered a read within 60 s")
}

async fn measure(
    args: &ReadArgs,
    backend: BackendKind,
    state: &FleetState,
) -> anyhow::Result<Vec<ReadRow>> {
    wait_for_reads(state)
        .await
        .context("waiting for a leader")?;
    let targets: Vec<String> = state.nodes.iter().map(|n| n.http_addr.clone()).collect();
    let spec = |mode: &str, ms: u64| {
        let mut s = LoadSpec::new(targets.clone(), args.rate, Duration::from_millis(ms));
        s.connections = args.connections;
        s.read_fraction = 1.0;
        s.read_modes = vec![mode.to_owned()];
        s
    };
    let mut rows = Vec::new();
    for mode in &args.modes {
        if args.warmup > 0 {
            load::run(spec(mode, args.warmup)).await?;
        }
        let report = load::run(spec(mode, args.duration)).await?;
        let s = report.summary();
        println!("{backend} {mode}:\n{}", report.render());
        rows.push(ReadRow {
            backend,
            mode: mode.clone(),
            offered_rate: args.rate,
            ok_per_s: s.ok_rate,
            ok: s.ok,
            errors: s.rejected + s.unknown + s.unsent as usize,
            p50_ms: s.latency_ms.p50,
            p99_ms: s.latency_ms.p99,
            service_p50_ms: s.service_ms.p50,
            service_p99_ms: s.service_ms.p99,
            fell_back_fraction: (mode == "lease" && s.reads_ok > 0)
                .then(|| s.reads_fell_back as f64 / s.reads_ok as f64),
        });
    }
    Ok(rows)
}

/// The side-by-side table (markdown).
pub fn render(rows: &[ReadRow]) -> String {
    let mut out = String::from(
        "| backend | mode | offered/s | answered/s | errors | p50 / p99 ms (from schedule) | service p50 / p99 ms | lease fell back |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {} | {:.2} / {:.2} | {:.2} / {:.2} | {} |\n",
            r.backend,
            r.mode,
            r.offered_rate,
            r.ok_per_s,
            r.errors,
            r.p50_ms,
            r.p99_ms,
            r.service_p50_ms,
            r.service_p99_ms,
            r.fell_back_fraction
                .map(|f| format!("{:.1}%", f * 100.0))
                .unwrap_or_else(|| "-".into()),
        ));
    }
    out
}
