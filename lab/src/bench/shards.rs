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
use super::{bench_fleet_spec, cpu_window, loadavg, machine_cpu, machine_info, CpuWindow};
use crate::fleet::{self, FleetState};
use crate::load::{self, LoadSpec};
use baton::backends::BackendKind;
use baton::config::parse_duration_ms;

#[derive(Args, Clone)]
pub struct ShardsArgs {
    /// Any backend (raft with K > 1 and no --config runs on config/raft-shards.toml).
    #[arg(long, default_value = "etcd")]
    pub backend: BackendKind,
    /// Nodes in the fleet.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// The shard counts to run, in order; ratios are against the first.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub shards: Vec<u32>,
    /// Offered rate in total, IDs per second (spread evenly over the shards).
    #[arg(long, default_value_t = 40_000.0)]
    pub rate: f64,
    /// Offered rate per shard instead: K shards are offered K times this in total, each shard
    /// as much as K = 1 is. Mutually exclusive with `--rate`.
    #[arg(long, conflicts_with = "rate")]
    pub rate_per_shard: Option<f64>,
    /// How long to measure, e.g. 20s.
    #[arg(long, value_parser = parse_duration_ms, default_value = "20s")]
    pub duration: u64,
    /// Load before measuring begins, not counted.
    #[arg(long, value_parser = parse_duration_ms, default_value = "3s")]
    pub warmup: u64,
    /// Keep-alive connections in total (rounded up to a multiple of K, at least one per shard).
    #[arg(long, default_value_t = 256)]
    pub connections: usize,
    /// Keep-alive connections per shard instead: K shards get K times this many in total, so
    /// every shard's sequencer has as many callers waiting as K = 1's (a fixed total gives a
    /// shard 1/K of them, which caps its group commits). Mutually exclusive with
    /// `--connections`.
    #[arg(long, conflicts_with = "connections")]
    pub connections_per_shard: Option<usize>,
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
    /// The offered rate of this K's load, IDs per second in total.
    pub offered_rate: f64,
    pub ids: u64,
    pub ids_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// From the request's send (the time a client holding a connection waits), not its
    /// schedule: past capacity the open loop's schedule-to-answer grows with the run.
    pub service_p50_ms: f64,
    pub service_p99_ms: f64,
    pub errors: u64,
    /// Group commits in the window, all shards together, and their mean size.
    pub commits: i64,
    pub mean_batch_ids: f64,
    /// Non-increasing steps in any shard's ledger (0 for a correct run).
    pub ledger_violations: i64,
    /// Aggregate IDs/s over the first K's.
    pub ratio: f64,
    /// Busy cores in the measured window by process group: `nodes` (the fleet's baton
    /// processes), `postgres` (every PostgreSQL process on the machine), `etcd`, `load` (this
    /// process: the generator), `other` (anything else, other people's work included).
    pub cpu_cores_by_group: BTreeMap<String, f64>,
    /// The whole machine over the window (steal included), and the load average at its end.
    pub machine_cpu: Option<CpuWindow>,
    pub loadavg_after: Option<[f64; 3]>,
    /// The load generator's whole summary (outcomes: ok, rejected, unknown, unsent; busy
    /// connections; its threads' CPU). `None` for an idle-only or unsettled run.
    pub load: Option<load::Summary>,
    /// The requests that were not `ok`, by what they got (status and error code, or the
    /// transport error's first words).
    pub not_ok_by_reason: BTreeMap<String, usize>,
    /// Why this K has no figures (it did not settle: not every shard led in time), with the
    /// PostgreSQL connections then; the run goes on to the next K.
    pub error: Option<String>,
    /// Shards led per node when every shard first had a leader (node id, count): before the
    /// idle settle, so a large K may still be moving.
    pub placement: Vec<(String, usize)>,
    /// Shards led per node at the end of the idle window (`None` when it was skipped): the
    /// balance the idle cost was measured at.
    pub idle_placement: Option<Vec<(String, usize)>>,
    /// PostgreSQL client connections at the end of the idle window (before any load): every
    /// one the fleet's resource server holds, and those of the sequencers alone
    /// (`application_name = baton-sequencer`). `None` when the window was skipped.
    pub idle_pg_connections: Option<i64>,
    pub idle_pg_sequencer_connections: Option<i64>,
    /// Backend requests per second from the whole fleet in the idle window before the load.
    pub idle_backend_requests_per_s: Option<f64>,
    /// The same, per operation (`renew`/`keepalive` are the renewals).
    pub idle_backend_requests_by_op: BTreeMap<String, f64>,
}

#[derive(Debug, Serialize)]
pub struct ShardsReport {
    pub backend: BackendKind,
    pub nodes: usize,
    /// `--rate` (the total offered to every K), or `None` with `--rate-per-shard`.
    pub offered_rate: Option<f64>,
    pub rate_per_shard: Option<f64>,
    /// `--connections` (the total for every K), or `None` with `--connections-per-shard`.
    pub connections: Option<usize>,
    pub connections_per_shard: Option<usize>,
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
        let outcome = match measure(&args, &state, k).await {
            Err(e) if e.downcast_ref::<Unsettled>().is_some() => {
                // Recorded, and the next K still runs (a large K may not settle on a small host).
                let pg = pg_connections(&state).await.ok();
                println!("K={k}: {e:#}; PostgreSQL client connections then: {pg:?}");
                Ok(unsettled(k, format!("{e:#}"), pg))
            }
            other => other,
        };
        config = redacted_config(&state);
        let down = state.clone();
        let _ = tokio::task::spawn_blocking(move || down.down()).await;
        let mut r = outcome?;
        r.ratio = runs
            .first()
            .map_or(1.0, |f| r.ids_per_s / f.ids_per_s.max(1.0));
        println!(
            "K={:<5} {} conns, {:.0}/s offered: {:>9.0} IDs/s  ratio {:.2}  p50 {:.2} ms  p99 {:.2} ms  errors {}  commits {} (mean {:.1} IDs)  violations {}",
            r.shards, r.connections, r.offered_rate, r.ids_per_s, r.ratio, r.p50_ms, r.p99_ms, r.errors, r.commits, r.mean_batch_ids, r.ledger_violations
        );
        runs.push(r);
    }
    let report = ShardsReport {
        backend: args.backend,
        nodes: args.nodes,
        offered_rate: args.rate_per_shard.is_none().then_some(args.rate),
        rate_per_shard: args.rate_per_shard,
        connections: args
            .connections_per_shard
            .is_none()
            .then_some(args.connections),
        connections_per_shard: args.connections_per_shard,
        duration_ms: args.duration,
        runs,
        config,
        machine: machine_info(),
    };
    println!(
        "\n| K | connections | offered/s | IDs/s | ratio vs K={} | p50 ms | p99 ms | service p50 / p99 ms | errors | group commits (mean IDs) | ledger violations | idle backend req/s (fleet) | idle PG connections (sequencers) |",
        args.shards[0]
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &report.runs {
        if let Some(e) = &r.error {
            println!(
                "| {} | did not settle: {e}; PostgreSQL connections then {:?} (sequencers' {:?}) |",
                r.shards, r.idle_pg_connections, r.idle_pg_sequencer_connections
            );
            continue;
        }
        let pg = match (r.idle_pg_connections, r.idle_pg_sequencer_connections) {
            (Some(all), Some(seq)) => format!("{all} ({seq})"),
            _ => "-".to_owned(),
        };
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} / {:.2} | {} | {} ({:.1}) | {} | {:.1} | {} |",
            r.shards,
            r.connections,
            r.offered_rate,
            r.ids_per_s,
            r.ratio,
            r.p50_ms,
            r.p99_ms,
            r.service_p50_ms,
            r.service_p99_ms,
            r.errors,
            r.commits,
            r.mean_batch_ids,
            r.ledger_violations,
            r.idle_backend_requests_per_s.unwrap_or(f64::NAN),
            pg
        );
    }
    super::write_report(args.out.as_deref(), &report)?;
    Ok(report)
}

/// [`settled`]'s error: not every shard led within its bound.
#[derive(Debug, thiserror::Error)]
#[error("{led} of the {k} shards led at the last look, not all within {within:?}")]
struct Unsettled {
    k: u32,
    led: usize,
    within: Duration,
}

/// A row with no load figures: an idle-only window's, or (with `error`) a K that did not settle.
fn without_load(k: u32, pg: (Option<i64>, Option<i64>)) -> ShardRun {
    ShardRun {
        shards: k,
        connections: 0,
        offered_rate: 0.0,
        ids: 0,
        ids_per_s: 0.0,
        p50_ms: 0.0,
        p99_ms: 0.0,
        service_p50_ms: 0.0,
        service_p99_ms: 0.0,
        errors: 0,
        commits: 0,
        mean_batch_ids: 0.0,
        ledger_violations: 0,
        ratio: 0.0,
        cpu_cores_by_group: BTreeMap::new(),
        machine_cpu: None,
        loadavg_after: loadavg(),
        load: None,
        not_ok_by_reason: BTreeMap::new(),
        error: None,
        placement: Vec::new(),
        idle_placement: None,
        idle_pg_connections: pg.0,
        idle_pg_sequencer_connections: pg.1,
        idle_backend_requests_per_s: None,
        idle_backend_requests_by_op: BTreeMap::new(),
    }
}

/// The row of a K that did not settle: no figures, the reason and the connections.
fn unsettled(k: u32, why: String, pg: Option<(i64, i64)>) -> ShardRun {
    ShardRun {
        error: Some(why),
        ..without_load(k, (pg.map(|p| p.0), pg.map(|p| p.1)))
    }
}

/// Waits until every shard `0..k` has a leader, then runs the warm-up and the measured window.
async fn measure(args: &ShardsArgs, state: &FleetState, k: u32) -> anyhow::Result<ShardRun> {
    let placement = settled(state, k, Duration::from_secs(120)).await?;
    let mut idle_backend_requests_by_op = BTreeMap::new();
    let mut idle_pg = (None, None);
    let mut idle_placement = None;
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
        let (all, seq) = pg_connections(state).await?;
        idle_pg = (Some(all), Some(seq));
        let led = led_per_node(&fleet::status(state).await, k);
        println!("K={k}: shards led per node at the window's end: {led:?}");
        idle_placement = Some(led);
        println!(
            "K={k}: PostgreSQL client connections at the window's end: {all} ({seq} sequencers')"
        );
        Some(idle_backend_requests_by_op.values().sum())
    } else {
        None
    };
    if args.idle_only {
        return Ok(ShardRun {
            ratio: 1.0,
            placement,
            idle_placement,
            idle_backend_requests_per_s,
            idle_backend_requests_by_op,
            ..without_load(k, idle_pg)
        });
    }
    let targets: Vec<String> = state.nodes.iter().map(|n| n.http_addr.clone()).collect();
    let connections = match args.connections_per_shard {
        Some(n) => n.max(1) * k as usize,
        None => args.connections.max(k as usize).div_ceil(k as usize) * k as usize,
    };
    let rate = args.rate_per_shard.map_or(args.rate, |r| r * f64::from(k));
    let spec = |ms: u64| LoadSpec {
        connections,
        shards: k,
        threads: args.load_threads.unwrap_or_else(load::default_threads),
        ..LoadSpec::new(targets.clone(), rate, Duration::from_millis(ms))
    };
    if args.warmup > 0 {
        load::run(spec(args.warmup)).await?;
    }
    let db = connect_admin(state).await?;
    let pos: i64 = db
        .query_one("SELECT coalesce(max(pos), 0) FROM baton.fence_log", &[])
        .await?
        .get(0);
    let node_pids: Vec<u32> = state.nodes.iter().map(|n| n.pid).collect();
    let (cpu_a, ticks_a) = (machine_cpu(), ticks_by_group(&node_pids));
    let t0 = std::time::Instant::now();
    let report = load::run(spec(args.duration)).await?;
    let (cpu_b, ticks_b) = (machine_cpu(), ticks_by_group(&node_pids));
    let secs = t0.elapsed().as_secs_f64();
    let hz = load::cpu::ticks_per_second();
    let cpu_cores_by_group: BTreeMap<String, f64> = ticks_b
        .iter()
        .map(|(g, b)| {
            let a = ticks_a.get(g).copied().unwrap_or(0);
            (g.clone(), b.saturating_sub(a) as f64 / hz / secs)
        })
        .collect();
    let machine_cpu = cpu_window(cpu_a, cpu_b);
    println!("K={k}: busy cores by process in the window: {cpu_cores_by_group:.2?}, machine {machine_cpu:?}");
    let s = report.summary();
    let mut not_ok_by_reason: BTreeMap<String, usize> = BTreeMap::new();
    for op in report.ops.iter().filter(|o| o.outcome != load::Outcome::Ok) {
        let why = op.error.as_deref().unwrap_or("-");
        let why: String = why
            .split(':')
            .next()
            .unwrap_or(why)
            .chars()
            .take(48)
            .collect();
        *not_ok_by_reason
            .entry(format!("{:?} {why}", op.outcome))
            .or_default() += 1;
    }
    if !not_ok_by_reason.is_empty() {
        println!("K={k}: requests not ok, by reason: {not_ok_by_reason:?}");
    }
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
        offered_rate: rate,
        ids: s.ok as u64,
        ids_per_s: s.ok_rate,
        p50_ms: s.latency_ms.p50,
        p99_ms: s.latency_ms.p99,
        service_p50_ms: s.service_ms.p50,
        service_p99_ms: s.service_ms.p99,
        errors: (s.rejected + s.unknown) as u64 + s.unsent,
        commits: batches.get(0),
        mean_batch_ids: batches.get(1),
        ledger_violations: ledger_violations(state).await?,
        ratio: 1.0,
        cpu_cores_by_group,
        machine_cpu,
        loadavg_after: loadavg(),
        load: Some(s.clone()),
        not_ok_by_reason,
        error: None,
        placement,
        idle_placement,
        idle_pg_connections: idle_pg.0,
        idle_pg_sequencer_connections: idle_pg.1,
        idle_backend_requests_per_s,
        idle_backend_requests_by_op,
    })
}

/// CPU time so far (clock ticks, user + system) of every process on the machine, summed by
/// group (see [`ShardRun::cpu_cores_by_group`]); a process that ends inside the window loses
/// its share, one that starts counts whole (its ticks since its start).
fn ticks_by_group(node_pids: &[u32]) -> BTreeMap<String, u64> {
    let me = std::process::id();
    let mut out: BTreeMap<String, u64> = ["nodes", "postgres", "etcd", "load", "other"]
        .into_iter()
        .map(|g| (g.to_owned(), 0))
        .collect();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Some(t) = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|s| load::cpu::parse_stat(pid, &s))
        else {
            continue;
        };
        let group = if pid == me {
            "load"
        } else if node_pids.contains(&pid) {
            "nodes"
        } else if t.name == "postgres" {
            "postgres"
        } else if t.name == "etcd" {
            "etcd"
        } else {
            "other"
        };
        *out.entry(group.to_owned()).or_default() += t.ticks;
    }
    out
}

/// Client connections the fleet's PostgreSQL holds now, all of them and the sequencers' alone
/// (theirs carry `application_name = baton-sequencer`); the admin connection asking is not
/// counted.
async fn pg_connections(state: &FleetState) -> anyhow::Result<(i64, i64)> {
    let db = connect_admin(state).await?;
    let row = db
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE application_name = $1)
               FROM pg_stat_activity
              WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
            &[&baton::work::fence::SEQ_APPLICATION_NAME],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Shards led per node (node id, count), from one `/status` sweep.
fn led_per_node(rows: &[fleet::NodeRow], k: u32) -> Vec<(String, usize)> {
    rows.iter()
        .map(|r| {
            let n = if k == 1 {
                usize::from(r.role.as_deref() == Some("leader"))
            } else {
                r.shards_led.len()
            };
            (r.id.clone(), n)
        })
        .collect()
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
        let led = led_per_node(&rows, k);
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
        if tokio::time::Instant::now() >= until {
            return Err(Unsettled {
                k,
                led: covered.len(),
                within,
            }
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
