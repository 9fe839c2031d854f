//! `baton bench next`: sequencer throughput, open loop, beside a baseline measured in the same
//! invocation on the same machine.
//!
//! ```text
//! baton bench next --rate 50000 --duration 60s --out experiments/results/bench-next/raft-50k.json
//! ```
//!
//! * **baton**: `POST /next` (one ID per request, no `?n=` blocks) at a fixed offered rate over
//!   keep-alive connections, from [`crate::load`]: requests are scheduled at `t0 + i/rate` whatever
//!   the server does, and latency counts from the *scheduled* time, so a stall shows as latency
//!   instead of silently lowering the rate (no coordinated omission). Every ID is fenced and durable
//!   (group commit through `baton.seq_commit`, `synchronous_commit = on`) before its response.
//! * **baseline**: the same fenced resource with one round trip per ID and no batching
//!   (`baton.seq_next`, allocation inside PostgreSQL), closed loop over `--baseline-connections`
//!   connections for `--baseline-duration`. PostgreSQL still groups concurrent WAL flushes, so this
//!   is the strongest batch-free design, not a strawman.
//!
//! Reports achieved rate, p50/p99/p999 and errors for both, the ratio, and the group-commit batch
//! sizes read back from `baton.fence_log`; checks the ledger has no non-increasing step.

use crate::load::neighbour::Neighbour;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use hdrhistogram::Histogram;
use serde::Serialize;

use super::failover::{connect_admin, ledger_pos, ledger_violations, redacted_config, terms_since};
use super::{bench_fleet_spec, cpu_window, loadavg, machine_cpu, machine_info, CpuWindow};
use crate::fleet::{self, FleetState, StandbyMode};
use crate::load::cpu::{self, ProcessThreads};
use crate::load::sizing::{self, ConnectionChoice, RunFacts, SizingLimits, Verdict};
use crate::load::{self, LoadSpec};
use baton::backends::{BackendKind, FenceToken};
use baton::config::{parse_duration_ms, NodeConfig, ResourceConfig};
use baton::work::Fence;

const BASELINE_RESOURCE: &str = "bench-baseline";

#[derive(clap::Args, Clone, Debug)]
pub struct NextArgs {
    /// The election backend: raft, etcd, redis, redis-naive, zk or pg-lease.
    #[arg(long, default_value = "raft")]
    pub backend: BackendKind,
    /// Nodes in the fleet.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Fleet directory (scratch; default state/bench/next-<backend>).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Base node config; defaults to config/<backend>.toml.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Offered rate, requests (= IDs) per second.
    #[arg(long, default_value_t = 50_000.0)]
    pub rate: f64,
    /// How long to measure, e.g. 20s.
    #[arg(long, value_parser = parse_duration_ms, default_value = "60s")]
    pub duration: u64,
    /// Keep-alive connections (the most requests in flight at once). Default: Little's law on
    /// the warm-up's service time (offered rate x mean service time x --connection-headroom), at
    /// least 8, at most 4096, this process's descriptors and the node's connection slots
    /// (`load::sizing`); the report says when the connection count, not the node, capped the run.
    #[arg(long)]
    pub connections: Option<usize>,
    /// Little's law's headroom when sizing the connections.
    #[arg(long, default_value_t = crate::load::sizing::DEFAULT_HEADROOM)]
    pub connection_headroom: f64,
    /// Threads the load generator sends from (one tops out around 50k requests/s on a 2-core
    /// machine). Default: half the cores, at least 1 (the node's client threads take the same
    /// share), so a 16-core run sends from 8.
    #[arg(long)]
    pub load_threads: Option<usize>,
    /// Unmeasured warm-up at the same rate first (it also sizes the connections).
    #[arg(long, value_parser = parse_duration_ms, default_value = "5s")]
    pub warmup: u64,
    /// How long the plain-HTTP baseline runs.
    #[arg(long, value_parser = parse_duration_ms, default_value = "10s")]
    pub baseline_duration: u64,
    /// Connections of the plain-HTTP baseline.
    #[arg(long, default_value_t = 64)]
    pub baseline_connections: usize,
    /// Write the report as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A reproducible neighbour for the measured window: `stress-ng --cpu 2 --cpu-load P` (P % of
    /// each of 2 CPU workers, so about P % of this 2-core machine), started after the warm-up
    /// and stopped with the load. 0 = none.
    #[arg(long, default_value_t = 0)]
    pub neighbour_cpu_percent: u32,
    /// Start the neighbour in a session of its own (`setsid`) instead of this command's. The
    /// kernel (`sched_autogroup_enabled = 1`) shares CPU between sessions first: in ours the
    /// neighbour's share comes out of the load generator's, in its own it competes with every
    /// session alike, as another service on the machine would.
    #[arg(long)]
    pub neighbour_own_session: bool,
    /// The neighbour's busy slice in ms (`stress-ng --cpu-load-slice`). 0 keeps stress-ng's
    /// default: each busy slice lasts a random 0–500 ms, so for up to half a second the neighbour
    /// runs flat out on both cores and then sleeps to average P %. A small slice (10) spreads the
    /// same P % evenly: a steady neighbour instead of a bursty one.
    #[arg(long, default_value_t = 0)]
    pub neighbour_slice_ms: u32,
    /// After the measured window, the same open loop (rate, connections, duration, threads,
    /// neighbour) on the leader's `GET /healthz`: the machine's own HTTP limit with this
    /// generator and server stack, measured in the same run, so the report can say how close
    /// the fenced, durable path comes to plain HTTP.
    #[arg(long)]
    pub plain_http: bool,
    /// The fenced resource's streaming standby: `none`, `async` or `sync` (`fleet up
    /// --resource-standby`), or several, comma-separated: then one fresh fleet per mode, measured
    /// one after another in this run with the same arguments and reported side by side (what
    /// a synchronous standby costs each ID: its commit waits for the standby's disk too).
    #[arg(long, value_delimiter = ',', default_value = "none")]
    pub resource_standby: Vec<StandbyChoice>,
}

/// `--resource-standby`: none, or a [`StandbyMode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum StandbyChoice {
    None,
    Async,
    Sync,
}

impl StandbyChoice {
    fn mode(self) -> Option<StandbyMode> {
        match self {
            StandbyChoice::None => None,
            StandbyChoice::Async => Some(StandbyMode::Async),
            StandbyChoice::Sync => Some(StandbyMode::Sync),
        }
    }
}

/// `--resource-standby` with more than one mode: every mode's report, in the order run.
#[derive(Debug, Serialize)]
pub struct ByStandbyReport {
    pub runs: Vec<NextReport>,
}

#[derive(Debug, Serialize)]
pub struct SideReport {
    pub ids: u64,
    pub seconds: f64,
    pub ids_per_s: f64,
    pub errors: u64,
    /// Latency from each request's *scheduled* time (open loop: queueing anywhere shows here).
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// From the request's actual send to its answer (the server's share, without the load
    /// generator's own queueing); absent for the closed-loop baseline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_p99_ms: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct NextReport {
    pub backend: BackendKind,
    /// The fenced resource's standby during this measurement (`none`, `async`, `sync`).
    pub resource_standby: StandbyChoice,
    pub offered_rate: f64,
    pub connections: usize,
    /// How `connections` was chosen: the flag, or Little's law on the warm-up.
    pub connection_choice: ConnectionChoice,
    /// What limited the measured window (`none`: it carried the offered rate), and of the
    /// plain HTTP window when there was one.
    pub limited_by: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plain_http_limited_by: Option<Verdict>,
    /// The leader's busiest threads and the generator's own over the measured window.
    pub threads: Vec<ProcessThreads>,
    pub baton: SideReport,
    pub baseline: SideReport,
    pub ratio: f64,
    pub commits: i64,
    pub mean_batch_ids: f64,
    /// The leader's commit threads' CPU per acknowledged ID, µs (`None`: the commits ran on
    /// client threads, as on a machine under 8 cores): the serial stage from thread counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_thread_us_per_id: Option<f64>,
    pub max_batch_ids: i64,
    pub ledger_violations: Option<i64>,
    /// New terms that claimed during the measured window (0 = no leadership change; a term
    /// claims the sequence and the work-set, so terms are counted, not claim rows), and every
    /// token that wrote in it.
    pub leadership_changes: i64,
    pub tokens: Vec<i64>,
    /// `stress-ng --cpu 2 --cpu-load N` beside the measured window (0 = none).
    pub neighbour_cpu_percent: u32,
    /// `--neighbour-own-session`: the neighbour ran in a session of its own, not the generator's.
    pub neighbour_own_session: bool,
    /// `--neighbour-slice-ms`: the neighbour's busy slice (0 = stress-ng's random 0–500 ms).
    pub neighbour_slice_ms: u32,
    /// `--plain-http`: the same open loop on `GET /healthz` (no ID), beside the same neighbour.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plain_http: Option<SideReport>,
    /// `POST /next`'s p99 from schedule over plain HTTP's (1.0 = the sequencer adds no tail).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_over_plain_http: Option<f64>,
    /// The whole machine over the plain HTTP window: beside `machine_cpu`, what the fenced,
    /// durable path costs the machine over a trivial answer at the same rate, neighbour and
    /// host (FINDINGS §11.12).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plain_http_machine_cpu: Option<CpuWindow>,
    /// `/proc/loadavg` (1, 5, 15 min) when the measured window began and when it ended.
    pub loadavg_start: Option<[f64; 3]>,
    pub loadavg_end: Option<[f64; 3]>,
    /// The whole machine over the measured window (`/proc/stat`): busy cores, and the steal the
    /// hypervisor's other guests took.
    pub machine_cpu: Option<CpuWindow>,
    pub config: serde_json::Value,
    pub machine: serde_json::Value,
}

/// `baton bench next`: one measurement, or one per `--resource-standby` mode side by side.
pub async fn run(args: NextArgs) -> anyhow::Result<()> {
    // Checked before the fleet starts: the report compares against the baseline, so a run
    // without one would fail only after the whole measurement.
    if args.baseline_duration == 0 || args.baseline_connections == 0 {
        anyhow::bail!("--baseline-duration and --baseline-connections must be > 0: the report compares against the baseline");
    }
    if args.resource_standby.len() <= 1 {
        let report = run_one(&args).await?;
        return super::write_report(args.out.as_deref(), &report);
    }
    let mut runs = Vec::new();
    for mode in &args.resource_standby {
        println!("== resource standby: {mode:?}");
        let one = NextArgs {
            resource_standby: vec![*mode],
            ..args.clone()
        };
        runs.push(run_one(&one).await?);
    }
    println!();
    println!(
        "| standby | baton IDs/s | p50 ms | p99 ms | p999 ms | errors | baseline IDs/s | baseline p50 ms | baseline p99 ms | leadership changes |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &runs {
        println!(
            "| {:?} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {:.0} | {:.2} | {:.2} | {} |",
            r.resource_standby,
            r.baton.ids_per_s,
            r.baton.p50_ms,
            r.baton.p99_ms,
            r.baton.p999_ms,
            r.baton.errors,
            r.baseline.ids_per_s,
            r.baseline.p50_ms,
            r.baseline.p99_ms,
            r.leadership_changes
        );
    }
    super::write_report(args.out.as_deref(), &ByStandbyReport { runs })
}

/// One fleet (with `args.resource_standby[0]`'s standby), measured.
async fn run_one(args: &NextArgs) -> anyhow::Result<NextReport> {
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("state/bench/next-{}", args.backend)));
    let mut spec = bench_fleet_spec(dir, args.nodes, args.backend, args.config.clone(), None)?;
    spec.resource_standby = args.resource_standby.first().and_then(|m| m.mode());
    let state = fleet::up(&spec).await.context("starting the fleet")?;
    let outcome = tokio::select! {
        r = measure(args, &state) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted (Ctrl-C)")),
    };
    let down = state.clone();
    let _ = tokio::task::spawn_blocking(move || down.down()).await;
    outcome
}

async fn measure(args: &NextArgs, state: &FleetState) -> anyhow::Result<NextReport> {
    if args.connections == Some(0) {
        bail!("--connections must be at least 1");
    }
    let targets: Vec<String> = state.nodes.iter().map(|n| n.http_addr.clone()).collect();
    let (leader, _) = fleet::current_leader(state, Duration::from_secs(30)).await?;
    let threads = args
        .load_threads
        .unwrap_or_else(crate::load::default_threads);
    let spec = |connections: usize, d: Duration| LoadSpec {
        connections,
        threads,
        ..LoadSpec::new(targets.clone(), args.rate, d)
    };
    let limits = SizingLimits::here(
        NodeConfig::from_file(&leader.config)
            .ok()
            .map(|c| c.http.max_connections),
        sizing::nofile_of(leader.pid),
    );
    let choice = sizing::choose_connections(
        &spec,
        args.rate,
        Duration::from_millis(args.warmup),
        args.connections,
        args.connection_headroom,
        limits,
    )
    .await?;
    if let Some(w) = choice.steps.last() {
        println!("warm-up: {}", w.achieved_rate.round());
    }
    println!("{}", choice.describe());
    let connections = choice.connections;
    let spec = |ms: u64| spec(connections, Duration::from_millis(ms));
    let procs = [(format!("leader node {}", leader.id), leader.pid)];
    let db = connect_admin(state).await?;
    let pos_before = ledger_pos(&db).await?;

    println!(
        "baton: POST /next at {} IDs/s offered, {} connections, {} ms",
        args.rate, connections, args.duration
    );
    let loadavg_start = loadavg();
    let window = cpu::Window::start(&procs);
    let measured = spec(args.duration);
    let (report, machine_cpu_window) = load_beside_neighbour(measured.clone(), args).await?;
    let mut threads_window = window.finish(&[None]);
    threads_window.push({
        let s = report.summary();
        cpu::generator(&s.generator_threads_busy, s.elapsed_s)
    });
    let loadavg_end = loadavg();
    let s = report.summary();
    let baton = open_loop_side(&s);
    let limited_by = verdict(&measured, &report, &choice, &threads_window);
    print!("{}", cpu::render(&threads_window));
    println!("limited by: {:?}: {}", limited_by.limit, limited_by.why);
    let (leadership_changes, tokens) = terms_since(&db, pos_before).await?;
    let batches = db
        .query_one(
            "SELECT count(*), coalesce(avg(seq_hi - seq_lo + 1), 0)::float8, coalesce(max(seq_hi - seq_lo + 1), 0)
               FROM baton.fence_log WHERE op = 'next' AND resource = 'sequence' AND pos > $1",
            &[&pos_before],
        )
        .await?;

    let (plain_http, plain_http_machine_cpu, plain_http_limited_by) = if args.plain_http {
        println!("plain HTTP: GET /healthz, the same open loop and neighbour");
        let mut probe = spec(args.duration);
        probe.path = "/healthz".into();
        probe.probe = true;
        let window = cpu::Window::start(&procs);
        let (report, machine) = load_beside_neighbour(probe.clone(), args).await?;
        let mut threads = window.finish(&[None]);
        threads.push({
            let s = report.summary();
            cpu::generator(&s.generator_threads_busy, s.elapsed_s)
        });
        // Against /next's unloaded service time this would call any /healthz answer fast: no
        // unloaded reference, so only a long service time counts as the node's queue.
        let mut plain_choice = choice.clone();
        plain_choice.unloaded_service_p50_ms = None;
        let v = verdict(&probe, &report, &plain_choice, &threads);
        (Some(open_loop_side(&report.summary())), machine, Some(v))
    } else {
        (None, None, None)
    };
    let p99_over_plain_http = plain_http
        .as_ref()
        .filter(|p| p.p99_ms > 0.0)
        .map(|p| baton.p99_ms / p.p99_ms);

    let baseline = baseline(state, args, &db).await?;
    if baseline.ids == 0 {
        bail!(
            "the baseline issued no IDs ({} errors): it has nothing to compare against",
            baseline.errors
        );
    }
    let violations = ledger_violations(state).await.ok();
    let ratio = if baseline.ids_per_s > 0.0 {
        baton.ids_per_s / baseline.ids_per_s
    } else {
        f64::INFINITY
    };
    println!(
        "baton    {:>9.0} IDs/s  p50 {:.2} ms  p99 {:.2} ms  p999 {:.2} ms  errors {}",
        baton.ids_per_s, baton.p50_ms, baton.p99_ms, baton.p999_ms, baton.errors
    );
    println!(
        "baseline {:>9.0} IDs/s  p50 {:.2} ms  p99 {:.2} ms  p999 {:.2} ms  errors {}  (one fenced round trip per ID, {} connections)",
        baseline.ids_per_s, baseline.p50_ms, baseline.p99_ms, baseline.p999_ms, baseline.errors, args.baseline_connections
    );
    println!(
        "service p99 {:.2} ms; leadership changes during the run {leadership_changes} (tokens {tokens:?}); neighbour {}% CPU, busy slice {}",
        s.service_ms.p99, args.neighbour_cpu_percent, slice_words(args.neighbour_slice_ms)
    );
    if let Some(w) = &machine_cpu_window {
        println!(
            "machine over the window: {:.2} cores busy, steal {:.1}%",
            w.busy_cores, w.steal_percent
        );
    }
    if let (Some(p), Some(r)) = (&plain_http, p99_over_plain_http) {
        println!(
            "plain HTTP {:>9.0} req/s  p50 {:.2} ms  p99 {:.2} ms  service p99 {:.2} ms  errors {}; /next p99 over plain {r:.2}x",
            p.ids_per_s, p.p50_ms, p.p99_ms, p.service_p99_ms.unwrap_or(0.0), p.errors
        );
    }
    if let (Some(w), Some(pw)) = (&machine_cpu_window, &plain_http_machine_cpu) {
        println!(
            "machine over the plain HTTP window: {:.2} cores busy ({:.2} more for /next at the same rate)",
            pw.busy_cores,
            w.busy_cores - pw.busy_cores
        );
    }
    let commit_thread_us_per_id = threads_window
        .iter()
        .find(|p| p.what.starts_with("leader"))
        .and_then(|p| p.commit_us_per_id(baton.ids_per_s));
    if let Some(us) = commit_thread_us_per_id {
        println!("commit threads: {us:.3} µs of CPU per ID");
    }
    println!(
        "ratio {:.1}x; group commits {} (mean {:.1} IDs, max {}); ledger violations {:?}",
        ratio,
        batches.get::<_, i64>(0),
        batches.get::<_, f64>(1),
        batches.get::<_, i64>(2),
        violations
    );
    Ok(NextReport {
        backend: args.backend,
        resource_standby: args
            .resource_standby
            .first()
            .copied()
            .unwrap_or(StandbyChoice::None),
        offered_rate: args.rate,
        connections,
        connection_choice: choice,
        limited_by,
        plain_http_limited_by,
        threads: threads_window,
        baton,
        baseline,
        ratio,
        commits: batches.get(0),
        mean_batch_ids: batches.get(1),
        commit_thread_us_per_id,
        max_batch_ids: batches.get(2),
        ledger_violations: violations,
        leadership_changes,
        tokens,
        neighbour_cpu_percent: args.neighbour_cpu_percent,
        neighbour_own_session: args.neighbour_own_session,
        neighbour_slice_ms: args.neighbour_slice_ms,
        plain_http,
        p99_over_plain_http,
        plain_http_machine_cpu,
        loadavg_start,
        loadavg_end,
        machine_cpu: machine_cpu_window,
        config: redacted_config(state),
        machine: machine_info(),
    })
}

/// What limited a run: [`sizing::classify`] on it, with the route's unloaded service time and
/// the generator's busiest thread.
fn verdict(
    spec: &LoadSpec,
    report: &load::LoadReport,
    choice: &ConnectionChoice,
    threads: &[ProcessThreads],
) -> Verdict {
    sizing::classify(&RunFacts {
        unloaded_service_p50_ms: choice.unloaded_service_p50_ms,
        node_busiest: threads
            .iter()
            .find(|p| p.what.starts_with("leader"))
            .and_then(|p| p.busiest.first())
            .map(|t| t.busy),
        generator_busiest: threads
            .iter()
            .find(|p| p.what == "generator")
            .and_then(|p| p.busiest.first())
            .map(|t| t.busy),
        ..sizing::facts(spec, report)
    })
}

/// One open-loop run with its own neighbour process beside it (stopped as the run ends, before
/// anything else is measured), and the whole machine over the run (`/proc/stat`); prints the
/// run's summary.
async fn load_beside_neighbour(
    spec: LoadSpec,
    args: &NextArgs,
) -> anyhow::Result<(load::LoadReport, Option<CpuWindow>)> {
    let neighbour = neighbour_for(args)?;
    let cpu_start = machine_cpu();
    let report = load::run(spec).await;
    let window = cpu_window(cpu_start, machine_cpu());
    drop(neighbour);
    let report = report?;
    println!("{}", report.render());
    Ok((report, window))
}

/// An open-loop run's side of the report (`ids` = requests answered 200).
fn open_loop_side(s: &load::Summary) -> SideReport {
    SideReport {
        ids: s.ok as u64,
        seconds: s.elapsed_s,
        ids_per_s: s.ok_rate,
        errors: (s.rejected + s.unknown) as u64 + s.unsent,
        p50_ms: s.latency_ms.p50,
        p99_ms: s.latency_ms.p99,
        p999_ms: s.latency_ms.p999,
        max_ms: s.latency_ms.max,
        service_p99_ms: Some(s.service_ms.p99),
    }
}

/// The token and holder the fence row holds now (the current leader's).
async fn leader_identity(db: &tokio_postgres::Client) -> anyhow::Result<(FenceToken, String)> {
    let row = db
        .query_one(
            "SELECT max_token, holder FROM baton.fenced_resource WHERE name = baton.fence_domain()",
            &[],
        )
        .await
        .context("reading the fence row")?;
    Ok((FenceToken(row.get(0)), row.get(1)))
}

/// One fenced, durable ID per round trip, closed loop over N connections.
async fn baseline(
    state: &FleetState,
    args: &NextArgs,
    db: &tokio_postgres::Client,
) -> anyhow::Result<SideReport> {
    // One fence domain guards every resource, so the baseline writes as the current leader
    // (its token, and its database role, which is its holder name) to its own sequence row; any
    // other identity is refused.
    let (token, holder) = leader_identity(db).await?;
    let cfg = ResourceConfig {
        database_url: state
            .postgres
            .url_as(&baton::work::fence::node_role(&holder), "127.0.0.1"),
        pool_size: args.baseline_connections,
        statement_timeout_ms: 5000,
        tls_ca_file: None,
    };
    let fence = Fence::new(&cfg, &holder).context("baseline pool")?;
    let until = Instant::now() + Duration::from_millis(args.baseline_duration);
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.baseline_connections)
        .map(|_| {
            let fence = fence.clone();
            tokio::spawn(async move {
                let mut hist =
                    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
                let (mut ok, mut errors) = (0u64, 0u64);
                while Instant::now() < until {
                    let t = Instant::now();
                    match fence.seq_next(BASELINE_RESOURCE, token).await {
                        Ok(_) => {
                            ok += 1;
                            let _ = hist.record(t.elapsed().as_micros().max(1) as u64);
                        }
                        Err(_) => errors += 1,
                    }
                }
                (hist, ok, errors)
            })
        })
        .collect();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
    let (mut ok, mut errors) = (0u64, 0u64);
    for t in tasks {
        let (h, o, e) = t.await?;
        hist.add(&h).ok();
        ok += o;
        errors += e;
    }
    let seconds = started.elapsed().as_secs_f64();
    let pct = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(SideReport {
        ids: ok,
        seconds,
        ids_per_s: ok as f64 / seconds,
        errors,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        p999_ms: pct(0.999),
        max_ms: hist.max() as f64 / 1000.0,
        service_p99_ms: None,
    })
}

/// How the report names the neighbour's busy slice.
fn slice_words(slice_ms: u32) -> String {
    match slice_ms {
        0 => "random 0-500 ms".into(),
        ms => format!("{ms} ms"),
    }
}

/// The neighbour `baton bench next`'s flags ask for.
fn neighbour_for(args: &NextArgs) -> anyhow::Result<Neighbour> {
    Neighbour::spawn(
        args.neighbour_cpu_percent,
        args.neighbour_slice_ms,
        args.neighbour_own_session,
    )
}
