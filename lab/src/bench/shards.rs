//! `baton bench shards`: aggregate `POST /next` throughput against the shard count K, each K
//! on a fresh fleet, one after the other in the same run so the ratios against the first K
//! compare like with like. The load generator pins each connection to one shard (`?shard=S`,
//! following that shard's leader), so K shards on N nodes run K sequencers, each committing on
//! its own connection.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use super::failover::{connect_admin, ledger_violations, redacted_config};
use super::{bench_fleet_spec, machine_info};
use crate::fleet::{self, FleetState};
use crate::load::{self, LoadSpec};
use baton::backends::BackendKind;
use baton::config::parse_duration_ms;

#[derive(Args, Clone)]
pub struct ShardsArgs {
    /// Any backend (raft with K > 1 and no --config runs on config/raft-shards.toml).
    #[arg(long, default_value = "etcd")]
    pub backend: BackendKind,
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// The shard counts to run, in order; ratios are against the first.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub shards: Vec<u32>,
    /// Offered rate in total, IDs per second (spread evenly over the shards).
    #[arg(long, default_value_t = 40_000.0)]
    pub rate: f64,
    #[arg(long, value_parser = parse_duration_ms, default_value = "20s")]
    pub duration: u64,
    #[arg(long, value_parser = parse_duration_ms, default_value = "3s")]
    pub warmup: u64,
    /// Keep-alive connections in total (rounded up to a multiple of K, at least one per shard).
    #[arg(long, default_value_t = 256)]
    pub connections: usize,
    /// Load generator threads (default: half the cores, at least 1).
    #[arg(long)]
    pub load_threads: Option<usize>,
    /// Base node config; defaults to config/<backend>.toml (config/raft-shards.toml for raft
    /// with K > 1).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Fleet directory (scratch).
    #[arg(long, default_value = "state/bench/shards")]
    pub dir: PathBuf,
    /// Write the report as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Before the load: an idle window this long in which the backend requests the whole
    /// fleet sends (renewals, campaigns, observation) are counted. 0 = skip.
    #[arg(long, value_parser = parse_duration_ms, default_value = "10s")]
    pub idle: u64,
    /// How long the fleet is left alone between every shard being led and the idle window
    /// (a large K keeps moving shards for a while after the first full placement).
    #[arg(long, value_parser = parse_duration_ms, default_value = "10s")]
    pub idle_settle: u64,
    /// Only the idle window (no load): for the cost of K alone.
    #[arg(long)]
    pub idle_only: bool,
}

#[derive(Debug, Serialize)]
pub struct ShardRun {
    pub shards: u32,
    pub connections: usize,
    pub ids: u64,
    pub ids_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub service_p50_ms: f64,
    pub errors: u64,
    /// Group commits in the window, all shards together, and their mean size.
    pub commits: i64,
    pub mean_batch_ids: f64,
    /// Non-increasing steps in any shard's ledger (0 for a correct run).
    pub ledger_violations: i64,
    /// Aggregate IDs/s over the first K's.
    pub ratio: f64,
    /// Shards led per node when the window began (node id, count).
    pub placement: Vec<(String, usize)>,
    /// Backend requests per second from the whole fleet in the idle window before the load.
    pub idle_backend_requests_per_s: Option<f64>,
    /// The same, per operation (`renew`/`keepalive` are the renewals).
    pub idle_backend_requests_by_op: BTreeMap<String, f64>,
}

#[derive(Debug, Serialize)]
pub struct ShardsReport {
    pub backend: BackendKind,
    pub nodes: usize,
    pub offered_rate: f64,
    pub duration_ms: u64,
    pub runs: Vec<ShardRun>,
    pub config: serde_json::Value,
    pub machine: serde_json::Value,
}

pub async fn run(args: ShardsArgs) -> anyhow::Result<ShardsReport> {
    anyhow::ensure!(!args.shards.is_empty(), "--shards needs at least one count");
    let mut runs: Vec<ShardRun> = Vec::new();
    let mut config = serde_json::Value::Null;
    for &k in &args.shards {
        let mut spec = bench_fleet_spec(
            args.dir.clone(),
            args.nodes,
            args.backend,
            args.config.clone(),
            None,
        )?;
        spec.shards = k;
        if args.config.is_none() {
            spec.base_config = fleet::default_base_config_for(args.backend, k);
        }
        let state = fleet::up(&spec)
            .await
            .with_context(|| format!("starting a fleet of {k} shards"))?;
        let outcome = measure(&args, &state, k).await;
        config = redacted_config(&state);
        let down = state.clone();
        let _ = tokio::task::spawn_blocking(move || down.down()).await;
        let mut r = outcome?;
        r.ratio = runs
            .first()
            .map_or(1.0, |f| r.ids_per_s / f.ids_per_s.max(1.0));
        println!(
            "K={:<5} {:>9.0} IDs/s  ratio {:.2}  p50 {:.2} ms  p99 {:.2} ms  errors {}  commits {} (mean {:.1} IDs)  violations {}",
            r.shards, r.ids_per_s, r.ratio, r.p50_ms, r.p99_ms, r.errors, r.commits, r.mean_batch_ids, r.ledger_violations
        );
        runs.push(r);
    }
    let report = ShardsReport {
        backend: args.backend,
        nodes: args.nodes,
        offered_rate: args.rate,
        duration_ms: args.duration,
        runs,
        config,
        machine: machine_info(),
    };
    println!(
        "\n| K | connections | IDs/s | ratio vs K={} | p50 ms | p99 ms | errors | group commits (mean IDs) | ledger violations | idle backend req/s (fleet) |",
        args.shards[0]
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &report.runs {
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} ({:.1}) | {} | {:.1} |",
            r.shards,
            r.connections,
            r.ids_per_s,
            r.ratio,
            r.p50_ms,
            r.p99_ms,
            r.errors,
            r.commits,
            r.mean_batch_ids,
            r.ledger_violations,
            r.idle_backend_requests_per_s.unwrap_or(f64::NAN)
        );
    }
    super::write_report(args.out.as_deref(), &report)?;
    Ok(report)
}

/// Waits until every shard `0..k` has a leader, then runs the warm-up and the measured window.
async fn measure(args: &ShardsArgs, state: &FleetState, k: u32) -> anyhow::Result<ShardRun> {
    let placement = settled(state, k, Duration::from_secs(120)).await?;
    let mut idle_backend_requests_by_op = BTreeMap::new();
    let idle_backend_requests_per_s = if args.idle > 0 {
        tokio::time::sleep(Duration::from_millis(args.idle_settle)).await;
        let a = super::shard_events::fleet_backend_requests_by_op(state).await;
        tokio::time::sleep(Duration::from_millis(args.idle)).await;
        let b = super::shard_events::fleet_backend_requests_by_op(state).await;
        let secs = args.idle as f64 / 1000.0;
        for (op, v) in &b {
            let per_s = (v - a.get(op).copied().unwrap_or(0.0)).max(0.0) / secs;
            idle_backend_requests_by_op.insert(op.clone(), per_s);
        }
        println!("K={k}: idle backend requests/s by operation: {idle_backend_requests_by_op:?}");
        Some(idle_backend_requests_by_op.values().sum())
    } else {
        None
    };
    if args.idle_only {
        return Ok(ShardRun {
            shards: k,
            connections: 0,
            ids: 0,
            ids_per_s: 0.0,
            p50_ms: 0.0,
            p99_ms: 0.0,
            service_p50_ms: 0.0,
            errors: 0,
            commits: 0,
            mean_batch_ids: 0.0,
            ledger_violations: 0,
            ratio: 1.0,
            placement,
            idle_backend_requests_per_s,
            idle_backend_requests_by_op,
        });
    }
    let targets: Vec<String> = state.nodes.iter().map(|n| n.http_addr.clone()).collect();
    let connections = args.connections.max(k as usize).div_ceil(k as usize) * k as usize;
    let spec = |ms: u64| LoadSpec {
        connections,
        shards: k,
        threads: args.load_threads.unwrap_or_else(load::default_threads),
        ..LoadSpec::new(targets.clone(), args.rate, Duration::from_millis(ms))
    };
    if args.warmup > 0 {
        load::run(spec(args.warmup)).await?;
    }
    let db = connect_admin(state).await?;
    let pos: i64 = db
        .query_one("SELECT coalesce(max(pos), 0) FROM baton.fence_log", &[])
        .await?
        .get(0);
    let report = load::run(spec(args.duration)).await?;
    let s = report.summary();
    let batches = db
        .query_one(
            "SELECT count(*), coalesce(avg(seq_hi - seq_lo + 1), 0)::float8
               FROM baton.fence_log WHERE op = 'next' AND pos > $1",
            &[&pos],
        )
        .await?;
    Ok(ShardRun {
        shards: k,
        connections,
        ids: s.ok as u64,
        ids_per_s: s.ok_rate,
        p50_ms: s.latency_ms.p50,
        p99_ms: s.latency_ms.p99,
        service_p50_ms: s.service_ms.p50,
        errors: (s.rejected + s.unknown) as u64 + s.unsent,
        commits: batches.get(0),
        mean_batch_ids: batches.get(1),
        ledger_violations: ledger_violations(state).await?,
        ratio: 1.0,
        placement,
        idle_backend_requests_per_s,
        idle_backend_requests_by_op,
    })
}

/// Every shard has exactly one leader among the nodes; returns the shards led per node.
async fn settled(
    state: &FleetState,
    k: u32,
    within: Duration,
) -> anyhow::Result<Vec<(String, usize)>> {
    let until = tokio::time::Instant::now() + within;
    loop {
        let rows = fleet::status(state).await;
        let led: Vec<(String, usize)> = rows
            .iter()
            .map(|r| {
                let n = if k == 1 {
                    usize::from(r.role.as_deref() == Some("leader"))
                } else {
                    r.shards_led.len()
                };
                (r.id.clone(), n)
            })
            .collect();
        let covered: std::collections::HashSet<u32> = rows
            .iter()
            .flat_map(|r| r.shards_led.iter().map(|(s, _)| *s))
            .collect();
        let ok = if k == 1 {
            led.iter().map(|(_, n)| n).sum::<usize>() == 1
        } else {
            covered.len() == k as usize && led.iter().map(|(_, n)| n).sum::<usize>() == k as usize
        };
        if ok {
            return Ok(led);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < until,
            "the {k} shards found no leaders within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
