//! `baton bench shard-events`: issue 28's experiment on a sharded fleet. N nodes (9), K shards,
//! a steady `POST /next?shard=S` load on every shard, and a schedule of membership events, each
//! given time to settle before the next:
//!
//! kill -9 of a node · its restart · removal of a node (graceful stop: it drains first) · its
//! return (a join) · a rolling restart of the whole fleet · a stop-the-world pause (SIGSTOP past
//! the lease) of the node leading shard 0 · with `--netns`, a partition of the node leading
//! shard 0 from its backend and peers (each node in its own network namespace).
//!
//! Per event: shards moved (placement before vs after), balance after (max/min shards per live
//! node), per-shard dark time on the resource's clock (for each shard whose term changed inside
//! the event's window: the first `next` commit of the new term − the last of the old one, from
//! `baton.fence_log.committed_at`; the window closes once every shard's led term has served,
//! not when every shard is led, so slow first commits are counted too), and the backend
//! requests/s the fleet sent meanwhile (`baton_backend_requests_total`). Then the history check per shard: each shard's ledger
//! strictly increasing across terms, and every acknowledged `(shard, token, seq)` in that shard's
//! ledger exactly once. With `--fencing off` the same schedule must fail it.
//!
//! With `--out F.json`, two plots beside it: `F-placement.svg` (shards led per node, sampled
//! every second, with the events marked) and `F-dark.svg` (dark time per event).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use super::failover::{connect_admin, redacted_config};
use super::{bench_fleet_spec, machine_info, Summary};
use crate::fleet::{self, client::NodeClient, FleetState};
use crate::load::{self, LoadSpec, Outcome};
use baton::backends::BackendKind;
use baton::config::{parse_duration_ms, Fencing};

#[derive(Args, Clone)]
pub struct ShardEventsArgs {
    /// The election backend: raft, etcd, redis, redis-naive, zk or pg-lease.
    #[arg(long, default_value = "etcd")]
    pub backend: BackendKind,
    /// Nodes in the fleet.
    #[arg(long, default_value_t = 9)]
    pub nodes: usize,
    /// The shard count K.
    #[arg(long, default_value_t = 64)]
    pub shards: u32,
    /// Offered IDs/s per shard.
    #[arg(long, default_value_t = 20.0)]
    pub rate_per_shard: f64,
    /// The most an event is given to settle (every shard led once, balanced).
    #[arg(long, value_parser = parse_duration_ms, default_value = "30s")]
    pub settle: u64,
    /// How long the paused node stays stopped (past its lease).
    #[arg(long, value_parser = parse_duration_ms, default_value = "5s")]
    pub pause: u64,
    /// `off` only to show the check failing without the fence.
    #[arg(long, default_value = "on")]
    pub fencing: Fencing,
    /// Each node in its own network namespace (root, iptables): adds the partition event.
    #[arg(long)]
    pub netns: bool,
    /// A base node config for the fleet (default: config/<backend>.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The fleet's directory (its state file, configs, logs and servers).
    #[arg(long, default_value = "state/bench/shard-events")]
    pub dir: PathBuf,
    /// Write the report here (default: under experiments/results/).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct EventRow {
    pub event: String,
    pub seconds: f64,
    pub shards_moved: usize,
    /// Live nodes' shard counts after the event settled: (max, min).
    pub balance_max_min: (usize, usize),
    pub settled: bool,
    /// Dark time (ms, resource clock) of every shard whose term changed in the event's window:
    /// the new term's first `next` commit − the old term's last (includes the load's own
    /// spacing and its search for the new leader).
    pub dark_ms: Option<Summary>,
    /// Hand-over gap (ms, actor traces, monotonic clock): the new owner's work started − the
    /// old owner's work stopped, for terms that ended gracefully.
    pub handover_gap_ms: Option<Summary>,
    pub backend_requests_per_s: f64,
}

#[derive(Debug, Serialize)]
pub struct ShardEventsReport {
    pub backend: BackendKind,
    pub nodes: usize,
    pub shards: u32,
    pub fencing: Fencing,
    pub events: Vec<EventRow>,
    pub acked: usize,
    pub errors: usize,
    /// Non-increasing steps in any shard's ledger.
    pub ledger_violations: i64,
    /// Acknowledged IDs not in their shard's ledger exactly once.
    pub acked_not_once: usize,
    pub check_passed: bool,
    /// Shards led per live node, sampled about every second: seconds since the start, then
    /// shards led per node.
    pub placement_over_time: Vec<(f64, BTreeMap<String, usize>)>,
    /// When each event began, in the same seconds.
    pub event_starts: Vec<(String, f64)>,
    pub config: serde_json::Value,
    pub machine: serde_json::Value,
}

pub async fn run(args: ShardEventsArgs) -> anyhow::Result<ShardEventsReport> {
    let mut spec = bench_fleet_spec(
        args.dir.clone(),
        args.nodes,
        args.backend,
        args.config.clone(),
        None,
    )?;
    spec.shards = args.shards;
    if args.config.is_none() {
        spec.base_config = fleet::default_base_config_for(args.backend, args.shards);
    }
    spec.fencing = args.fencing;
    let mut state = if args.netns {
        fleet::up_netns(&spec).await
    } else {
        fleet::up(&spec).await
    }
    .context("starting the fleet")?;
    let outcome = experiment(&args, &mut state).await;
    let down = state.clone();
    let _ = tokio::task::spawn_blocking(move || down.down()).await;
    let report = outcome?;
    super::write_report(args.out.as_deref(), &report)?;
    if let Some(out) = &args.out {
        plot(out, &report)?;
    }
    Ok(report)
}

/// `F-placement.svg` and `F-dark.svg` beside the report `F.json` (see the module docs).
fn plot(out: &std::path::Path, report: &ShardEventsReport) -> anyhow::Result<()> {
    use crate::plots::{self, Axes};
    let stem = out.with_extension("");
    let beside = |suffix: &str| PathBuf::from(format!("{}-{suffix}.svg", stem.display()));
    let title = format!(
        "{} · {} nodes · K = {} · fencing {}",
        report.backend,
        report.nodes,
        report.shards,
        if report.fencing == Fencing::Off {
            "off"
        } else {
            "on"
        }
    );
    let mut per_node: BTreeMap<String, Vec<(f64, f64, Option<f64>)>> = BTreeMap::new();
    for (t, counts) in &report.placement_over_time {
        for (node, n) in counts {
            per_node
                .entry(node.clone())
                .or_default()
                .push((*t, *n as f64, None));
        }
    }
    let t_max = report
        .placement_over_time
        .last()
        .map_or(1.0, |(t, _)| *t)
        .max(1.0);
    plots::lines(
        &beside("placement"),
        &Axes {
            title: &format!("shards led per node over time · {title}"),
            x_desc:
                "seconds since the load started (events begin at the markers' times in the JSON)",
            y_desc: "shards led",
            x_range: (0.0, t_max),
            marker: None,
        },
        &per_node,
    )?;
    let mut dark: BTreeMap<String, Vec<(f64, f64, Option<f64>)>> = BTreeMap::new();
    for (i, row) in report.events.iter().enumerate() {
        if let Some(d) = &row.dark_ms {
            let x = i as f64 + 1.0;
            dark.entry("p50".into())
                .or_default()
                .push((x, d.median, None));
            dark.entry("p99 (× = max)".into())
                .or_default()
                .push((x, d.p99, Some(d.max)));
        }
    }
    let names: Vec<String> = (1..)
        .zip(&report.events)
        .map(|(i, r)| format!("{i} {}", r.event))
        .collect();
    plots::lines(
        &beside("dark"),
        &Axes {
            title: &format!("per-shard dark time per event · {title}"),
            x_desc: &format!("event: {}", names.join(" · ")),
            y_desc: "dark time, ms (resource clock)",
            x_range: (0.5, report.events.len() as f64 + 0.5),
            marker: None,
        },
        &dark,
    )
}

/// Samples shards led per answering node about every second until `stop` (the placement
/// timeline). Asked by address, not by pid: the experiment restarts nodes under new pids.
fn sample_placement(
    state: &FleetState,
    t_start: Instant,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<(f64, BTreeMap<String, usize>)>> {
    let nodes: Vec<(String, String)> = state
        .nodes
        .iter()
        .map(|n| (n.id.clone(), n.http_addr.clone()))
        .collect();
    let client = NodeClient::new(Duration::from_millis(800));
    tokio::spawn(async move {
        let mut seen = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let asks = nodes.iter().map(|(id, addr)| {
                let client = client.clone();
                async move {
                    let st = client.get(addr, "/status").await.ok()?.json();
                    Some((id.clone(), fleet::shards_led(&st).len()))
                }
            });
            let per_node: BTreeMap<String, usize> = futures::future::join_all(asks)
                .await
                .into_iter()
                .flatten()
                .collect();
            seen.push((t_start.elapsed().as_secs_f64(), per_node));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        seen
    })
}

/// Shard → node of every shard some live node leads.
/// The node that leads shard 0, or (when an earlier event left shard 0 unled) the lowest shard
/// that has a leader: the pause and the partition need a node that leads something.
fn a_shard_leader(placed: &BTreeMap<u32, String>) -> anyhow::Result<String> {
    placed
        .get(&0)
        .or_else(|| placed.values().next())
        .cloned()
        .context("no shard has a leader")
}

async fn placement(state: &FleetState) -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    for r in fleet::status(state).await.iter().filter(|r| r.alive) {
        for (s, _) in &r.shards_led {
            out.insert(*s, r.id.clone());
        }
    }
    out
}

/// Waits (up to `within`) until every shard is led and the live nodes' counts differ by ≤ 1.
/// One `/status` sweep per look: the placement and the counts come from the same rows.
async fn settle(state: &FleetState, k: u32, within: Duration) -> (BTreeMap<u32, String>, bool) {
    let until = Instant::now() + within;
    loop {
        let rows = fleet::status(state).await;
        let mut p = BTreeMap::new();
        for r in rows.iter().filter(|r| r.alive) {
            for (s, _) in &r.shards_led {
                p.insert(*s, r.id.clone());
            }
        }
        let counts: Vec<usize> = rows
            .iter()
            .filter(|r| r.alive && r.role.is_some())
            .map(|r| r.shards_led.len())
            .collect();
        let balanced = counts
            .iter()
            .max()
            .zip(counts.iter().min())
            .is_some_and(|(a, b)| a - b <= 1);
        if p.len() == k as usize && balanced {
            return (p, true);
        }
        if Instant::now() >= until {
            return (p, false);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `baton_backend_requests_total` of each live node (keyed by node and pid: a restarted node's
/// counter starts again from 0).
async fn backend_requests(state: &FleetState) -> BTreeMap<(String, u32), f64> {
    backend_requests_by_op(state)
        .await
        .into_iter()
        .map(|(node, ops)| (node, ops.values().sum()))
        .collect()
}

/// [`backend_requests`], per operation (`renew`, `keepalive`, `acquire`, `observe`, ...).
async fn backend_requests_by_op(
    state: &FleetState,
) -> BTreeMap<(String, u32), BTreeMap<String, f64>> {
    let client = NodeClient::new(Duration::from_secs(2));
    let mut out = BTreeMap::new();
    for n in state
        .nodes
        .iter()
        .filter(|n| fleet::servers::pid_alive(n.pid))
    {
        if let Ok(r) = client.get(&n.http_addr, "/metrics").await {
            let mut ops: BTreeMap<String, f64> = BTreeMap::new();
            for l in String::from_utf8_lossy(&r.body)
                .lines()
                .filter(|l| l.starts_with("baton_backend_requests_total{"))
            {
                let op = l
                    .split("op=\"")
                    .nth(1)
                    .and_then(|rest| rest.split('"').next())
                    .unwrap_or("?");
                if let Some(v) = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
                    *ops.entry(op.to_owned()).or_default() += v;
                }
            }
            out.insert((n.id.clone(), n.pid), ops);
        }
    }
    out
}

/// The fleet's live nodes' `baton_backend_requests_total`, summed per operation.
pub(crate) async fn fleet_backend_requests_by_op(state: &FleetState) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for ops in backend_requests_by_op(state).await.into_values() {
        for (op, v) in ops {
            *out.entry(op).or_default() += v;
        }
    }
    out
}

/// Requests sent between two readings: per process, its growth (all of it for a process that
/// started in between). A process that ended in between is missed: a lower bound then.
fn requests_between(a: &BTreeMap<(String, u32), f64>, b: &BTreeMap<(String, u32), f64>) -> f64 {
    b.iter()
        .map(|(k, v)| v - a.get(k).copied().unwrap_or(0.0))
        .filter(|d| *d > 0.0)
        .sum()
}

/// Hand-over gaps (ms) from the actor traces: for every term that began inside `[m0, m1]`
/// (monotonic ns) after a term of the same shard that stopped its work gracefully, new
/// `work-started` − old `work-stopped`. Killed terms have no `work-stopped` and are left out.
fn handover_gaps(state: &FleetState, m0: u64, m1: u64) -> Vec<f64> {
    let mut lines: Vec<serde_json::Value> = Vec::new();
    for n in &state.nodes {
        let path = n.config.parent().map(|d| d.join("actor-trace.jsonl"));
        let text = path
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default();
        lines.extend(
            text.lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()),
        );
    }
    lines.retain(|l| {
        l["actor"] == "supervisor" && (l["event"] == "work-started" || l["event"] == "work-stopped")
    });
    lines.sort_by_key(|l| l["mono_ns"].as_u64().unwrap_or(0));
    let mut last_stop: BTreeMap<u64, u64> = BTreeMap::new();
    let mut gaps = Vec::new();
    for l in &lines {
        let (shard, at) = (
            l["shard"].as_u64().unwrap_or(0),
            l["mono_ns"].as_u64().unwrap_or(0),
        );
        if l["event"] == "work-stopped" {
            last_stop.insert(shard, at);
        } else if let Some(stop) = last_stop.remove(&shard) {
            if (m0..=m1).contains(&at) {
                gaps.push(at.saturating_sub(stop) as f64 / 1e6);
            }
        }
    }
    gaps
}

fn wall_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

async fn experiment(
    args: &ShardEventsArgs,
    state: &mut FleetState,
) -> anyhow::Result<ShardEventsReport> {
    let k = args.shards;
    let settle_bound = Duration::from_millis(args.settle);
    let t_start = Instant::now();
    let mut event_starts: Vec<(String, f64)> = Vec::new();
    let (first, ok) = settle(state, k, Duration::from_secs(90)).await;
    anyhow::ensure!(
        ok,
        "the fleet did not settle: {} of {k} shards led",
        first.len()
    );
    let targets: Vec<String> = state.nodes.iter().map(|n| n.http_addr.clone()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let load_spec = LoadSpec {
        connections: k as usize,
        shards: k,
        stop: Some(stop.clone()),
        ..LoadSpec::new(
            targets,
            args.rate_per_shard * f64::from(k),
            Duration::from_secs(3600),
        )
    };
    let load = tokio::spawn(load::run(load_spec));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let db = connect_admin(state).await?;
    let sequences: Vec<String> = (0..k)
        .map(|s| baton::shard::ShardId(s).resource("sequence"))
        .collect();
    // Every shard serving before the first event: a shard whose term has committed nothing
    // has no dark time to measure (there is no last commit before the event), so a kill just
    // after the load began counted only the shards moved by hand-over.
    let unserved = await_first_commits(state, &db, &sequences, settle_bound).await?;
    if unserved > 0 {
        println!("before the first event: {unserved} shards had served nothing yet");
    }

    let victim = state.nodes[0].id.clone();
    let spare = state.nodes[state.nodes.len() - 1].id.clone();
    let mut events = vec![
        "kill-9",
        "restart",
        "remove",
        "add",
        "rolling-restart",
        "pause-leader",
    ];
    if args.netns {
        events.push("partition-leader");
    }
    let sampler = sample_placement(state, t_start, stop.clone());
    let mut rows = Vec::new();
    let mut windows = Vec::new();
    for event in events {
        let before = placement(state).await;
        let req0 = backend_requests(state).await;
        let (t0, w0, m0) = (Instant::now(), wall_now(), baton::clock::monotonic_ns());
        event_starts.push((event.to_owned(), t_start.elapsed().as_secs_f64()));
        match event {
            "kill-9" => state.kill_node(&victim)?,
            "restart" => {
                state.start_node(&victim)?;
            }
            "remove" => {
                let s = state.clone();
                let id = spare.clone();
                tokio::task::spawn_blocking(move || s.stop_node(&id, Duration::from_secs(15)))
                    .await??;
            }
            "add" => {
                state.start_node(&spare)?;
            }
            "rolling-restart" => state.restart_rolling(Duration::from_secs(3)).await?,
            "pause-leader" => {
                let leader = a_shard_leader(&before)?;
                let pid = state.node(&leader)?.pid as i32;
                // SAFETY: signals to the pid of a node this fleet started (checked alive above).
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                tokio::time::sleep(Duration::from_millis(args.pause)).await;
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
            "partition-leader" => {
                let leader = a_shard_leader(&before)?;
                crate::chaos::partition_node(state, &leader, Duration::from_millis(args.pause))
                    .await?;
            }
            _ => unreachable!(),
        }
        // A join is only seen after the node has answered probes for a while: give it time
        // to be counted before judging the settled placement.
        if matches!(event, "restart" | "add") {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let (after, settled) = settle(state, k, settle_bound).await;
        // Every shard led is not every shard serving: a new term's first commit can come
        // seconds later (at a few IDs/s per shard, and after the claim). The event's window
        // runs until each shard's led term has served, so its dark time counts every moved
        // shard.
        let unserved = await_first_commits(state, &db, &sequences, settle_bound).await?;
        if unserved > 0 {
            println!("{event}: {unserved} claimed terms had served nothing when the window closed");
        }
        let secs = t0.elapsed().as_secs_f64();
        let req1 = backend_requests(state).await;
        let gaps = handover_gaps(state, m0, baton::clock::monotonic_ns());
        let moved = (0..k).filter(|s| before.get(s) != after.get(s)).count();
        let rows_now = fleet::status(state).await;
        let counts: Vec<usize> = rows_now
            .iter()
            .filter(|r| r.alive && r.role.is_some())
            .map(|r| r.shards_led.len())
            .collect();
        println!(
            "{event:<16} {secs:>6.1} s  moved {moved:>3}  balance {:?}/{:?}  settled {settled}",
            counts.iter().max(),
            counts.iter().min()
        );
        windows.push((w0, wall_now()));
        rows.push(EventRow {
            event: event.into(),
            seconds: secs,
            shards_moved: moved,
            balance_max_min: (
                counts.iter().copied().max().unwrap_or(0),
                counts.iter().copied().min().unwrap_or(0),
            ),
            settled,
            dark_ms: None,
            handover_gap_ms: Summary::of(&gaps),
            backend_requests_per_s: requests_between(&req0, &req1) / secs.max(1e-3),
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let report = load.await??;
    let timeline = sampler.await?;

    for (row, (w0, w1)) in rows.iter_mut().zip(&windows) {
        row.dark_ms = dark_times(&db, *w0, *w1)
            .await?
            .and_then(|v| Summary::of(&v));
    }
    // Per shard: IDs strictly increasing across terms, and (every op: claims, ticks,
    // checkpoints, IDs) no token after a higher one in the shard's commit order — a stale
    // leader's accepted write, which only a fence that is off lets in.
    let ledger_violations: i64 = db
        .query_one(
            "SELECT (SELECT count(*) FROM (SELECT seq_lo, lag(seq_hi) OVER w AS prev_hi
                       FROM baton.fence_log WHERE op = 'next' WINDOW w AS (PARTITION BY resource ORDER BY pos)) x
                     WHERE seq_lo <= prev_hi)
                  + (SELECT count(*) FROM (SELECT token, max(token) OVER w AS max_before
                       FROM baton.fence_log
                       WINDOW w AS (PARTITION BY baton.fence_domain(resource) ORDER BY pos
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)) y
                     WHERE token < max_before)",
            &[],
        )
        .await?
        .get(0);
    let mut acked_not_once = 0;
    let acked: Vec<_> = report
        .ops
        .iter()
        .filter(|o| o.outcome == Outcome::Ok)
        .filter_map(|o| Some((o.shard?, o.token?, o.seq?)))
        .collect();
    let stmt = db
        .prepare("SELECT count(*) FROM baton.fence_log WHERE op = 'next' AND resource = $1 AND token = $2 AND $3 BETWEEN seq_lo AND seq_hi")
        .await?;
    for (s, t, q) in &acked {
        let resource = baton::shard::ShardId(*s).resource("sequence");
        let n: i64 = db.query_one(&stmt, &[&resource, t, q]).await?.get(0);
        if n != 1 {
            acked_not_once += 1;
        }
    }
    let errors = report
        .ops
        .iter()
        .filter(|o| o.outcome != Outcome::Ok)
        .count();
    let check_passed = ledger_violations == 0 && acked_not_once == 0;
    println!("\n| event | s | shards moved | balance max/min | dark ms, resource clock: p50 / p99 / max (n) | hand-over gap ms: p50 / p99 / max (n) | backend req/s |");
    println!("|---|---|---|---|---|---|---|");
    let fmt = |d: &Option<Summary>| {
        d.as_ref().map_or("-".to_owned(), |d| {
            format!("{:.0} / {:.0} / {:.0} ({})", d.median, d.p99, d.max, d.n)
        })
    };
    for r in &rows {
        println!(
            "| {} | {:.1} | {} | {}/{} | {} | {} | {:.0} |",
            r.event,
            r.seconds,
            r.shards_moved,
            r.balance_max_min.0,
            r.balance_max_min.1,
            fmt(&r.dark_ms),
            fmt(&r.handover_gap_ms),
            r.backend_requests_per_s
        );
    }
    println!(
        "acked {} errors {}; ledger violations {ledger_violations}; acknowledged IDs not in their shard's ledger exactly once: {acked_not_once}; check {}",
        acked.len(),
        errors,
        if check_passed { "PASS" } else { "FAIL" }
    );
    Ok(ShardEventsReport {
        backend: args.backend,
        nodes: args.nodes,
        shards: k,
        fencing: args.fencing,
        events: rows,
        acked: acked.len(),
        errors,
        ledger_violations,
        acked_not_once,
        check_passed,
        placement_over_time: timeline,
        event_starts,
        config: redacted_config(state),
        machine: machine_info(),
    })
}

/// Waits (up to `within`) until every shard's current term, as its leader's `/status` gives
/// it, has committed a `next`; returns how many had not when it stopped waiting. The term that
/// counts is the *led* one, not the newest claimed one: a shard whose new owner has won but not
/// yet claimed (a killed node's shards, won as its leases run out, seconds after the kill)
/// would otherwise close the event's window before its dark time could be taken.
async fn await_first_commits(
    state: &FleetState,
    db: &tokio_postgres::Client,
    sequences: &[String],
    within: Duration,
) -> anyhow::Result<i64> {
    let until = Instant::now() + within;
    loop {
        let mut led: BTreeMap<u32, i64> = BTreeMap::new();
        for r in fleet::status(state).await.iter().filter(|r| r.alive) {
            for &(s, token) in &r.shards_led {
                let t = led.entry(s).or_insert(token);
                *t = (*t).max(token);
            }
        }
        let served: BTreeMap<String, i64> = db
            .query(
                "SELECT resource, max(token) FROM baton.fence_log
                  WHERE op = 'next' AND resource = ANY($1) GROUP BY resource",
                &[&sequences],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let unserved = (0..sequences.len())
            .filter(|&s| {
                let served = served.get(&sequences[s]).copied().unwrap_or(0);
                led.get(&(s as u32)).is_none_or(|&token| token > served)
            })
            .count() as i64;
        if unserved == 0 || Instant::now() >= until {
            return Ok(unserved);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Dark time (ms) of every shard whose term changed between wall times `w0` and `w1` (seconds):
/// the first `next` commit of the new term − the last `next` commit of the term before, on
/// PostgreSQL's clock. `None` when no term changed.
async fn dark_times(
    db: &tokio_postgres::Client,
    w0: f64,
    w1: f64,
) -> anyhow::Result<Option<Vec<f64>>> {
    let rows = db
        .query(
            "WITH firsts AS (
                 SELECT resource, token, min(pos) AS first_pos, min(committed_at) AS first_at
                   FROM baton.fence_log WHERE op = 'next' GROUP BY resource, token)
             SELECT f.resource,
                    extract(epoch FROM f.first_at - (SELECT max(p.committed_at) FROM baton.fence_log p
                         WHERE p.op = 'next' AND p.resource = f.resource AND p.pos < f.first_pos))::float8 * 1000.0
               FROM firsts f
              WHERE f.first_at BETWEEN to_timestamp($1) AND to_timestamp($2)
                AND EXISTS (SELECT 1 FROM baton.fence_log p WHERE p.op = 'next' AND p.resource = f.resource AND p.pos < f.first_pos)",
            &[&w0, &w1],
        )
        .await?;
    let v: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.get::<_, Option<f64>>(1))
        .collect();
    Ok((!v.is_empty()).then_some(v))
}
