//! `baton bench read`: what a lease read buys. For every backend, one fleet, and on it
//! `GET /read` in each mode at a fixed offered rate (open loop, from [`crate::load`], latency
//! counted from each request's scheduled time): `lease` (from the leader's memory inside the
//! lease window), `quorum` (a linearizable leadership check with the backend first) and
//! `resource` (one read of PostgreSQL), side by side, with the share of lease reads that found
//! their window closed and fell back to quorum.
//!
//! After the modes, the same open loop (rate, connections, threads) on the leader's
//! `GET /healthz`: plain HTTP on the same generator and server stack, in the same run, so each
//! mode's answered rate is also given as a ratio to it. `--rounds N` repeats modes and plain
//! HTTP N times, alternating, on the one fleet, and reports the medians.
//!
//! The generator must not be what limits the run: it sends from `--load-threads` threads (half
//! the cores by default) over as many connections as Little's law asks for the offered rate at
//! the warm-up's measured service time (`--connections` overrides it; see
//! [`crate::load::sizing`]), and every row says what limited it: nothing, the connections, the
//! node, or the generator, from the connections busy, the node's service time against its
//! unloaded one, and each side's busiest thread ([`crate::load::cpu`]).
//!
//! ```text
//! baton bench read --backends raft,etcd,pg-lease,redis,zk --rate 2000 --duration 10s \
//!     --out experiments/results/bench-read/all.json
//! baton bench read --backends raft --modes lease --rate 150000 --duration 10s --rounds 5
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde::Serialize;

use super::{bench_fleet_spec, cpu_window, loadavg, machine_cpu, machine_info, CpuWindow};
use crate::fleet::{self, client::NodeClient, FleetNode, FleetState};
use crate::load::cpu::{self, ProcessThreads};
use crate::load::sizing::{self, ConnectionChoice, RunFacts, SizingLimits, Verdict};
use crate::load::{self, LoadSpec};
use baton::backends::BackendKind;
use baton::config::{parse_duration_ms, NodeConfig};

/// The row name of plain HTTP (`GET /healthz`).
pub const PLAIN_HTTP: &str = "healthz";

#[derive(clap::Args, Clone, Debug)]
pub struct ReadArgs {
    /// Backends, one fleet each (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "raft,etcd,pg-lease,redis,zk"
    )]
    pub backends: Vec<BackendKind>,
    /// Nodes in the fleet.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Read modes, measured one after another on each fleet.
    #[arg(long, value_delimiter = ',', default_value = "lease,quorum,resource")]
    pub modes: Vec<String>,
    /// Offered reads per second.
    #[arg(long, default_value_t = 2000.0)]
    pub rate: f64,
    /// How long to measure, e.g. 20s.
    #[arg(long, value_parser = parse_duration_ms, default_value = "10s")]
    pub duration: u64,
    /// Keep-alive connections. Default: Little's law on the warm-up's service time (offered
    /// rate x mean service time x --connection-headroom), at least 8, at most 4096, this
    /// process's descriptors and the node's connection slots (`load::sizing`).
    #[arg(long)]
    pub connections: Option<usize>,
    /// Little's law's headroom when sizing the connections.
    #[arg(long, default_value_t = sizing::DEFAULT_HEADROOM)]
    pub connection_headroom: f64,
    /// Threads the load generator sends from. Default: half the cores, at least 1.
    #[arg(long)]
    pub load_threads: Option<usize>,
    /// Unmeasured warm-up before each mode (it also sizes the connections).
    #[arg(long, value_parser = parse_duration_ms, default_value = "2s")]
    pub warmup: u64,
    /// Measure every mode and plain HTTP this many times, alternating, on one fleet.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Skip plain HTTP (`GET /healthz`) after the modes.
    #[arg(long)]
    pub no_plain_http: bool,
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
    /// A read mode, or `healthz` for plain HTTP.
    pub mode: String,
    /// 1-based round.
    pub round: usize,
    pub offered_rate: f64,
    /// Answered reads per second.
    pub ok_per_s: f64,
    pub ok: usize,
    /// Refused or unknown answers.
    pub errors: usize,
    /// Slots never sent (past the drain deadline): an open loop offered more than was carried.
    pub unsent: u64,
    /// From each read's scheduled time (open loop).
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// From its actual send (the server's share).
    pub service_p50_ms: f64,
    pub service_p99_ms: f64,
    /// Lease reads answered by quorum because the window was closed, of the answered ones.
    pub fell_back_fraction: Option<f64>,
    pub connections: usize,
    /// Requests in flight on average (Little's law on the run).
    pub busy_connections_mean: f64,
    /// What limited the run (`none` when it carried the offered rate).
    pub limited_by: Verdict,
    /// The leader's busiest threads and the generator's own over the window.
    pub threads: Vec<ProcessThreads>,
    /// CPU per answered request, µs: the leader's busiest thread (its HTTP thread under this
    /// load), the leader's threads together, and the generator's threads together. Less
    /// sensitive than the rate to what else the machine runs.
    pub node_busiest_thread_us_per_request: Option<f64>,
    pub node_us_per_request: Option<f64>,
    pub generator_us_per_request: Option<f64>,
    /// The whole machine over the window.
    pub machine_cpu: Option<CpuWindow>,
}

/// A mode's answered rate over plain HTTP's in the same round.
#[derive(Debug, Serialize)]
pub struct RatioRow {
    pub backend: BackendKind,
    pub mode: String,
    pub round: usize,
    pub ok_per_s: f64,
    pub plain_http_ok_per_s: f64,
    pub ratio: f64,
    /// The mode's p99 from schedule over plain HTTP's.
    pub p99_over_plain_http: f64,
    /// µs of the leader's busiest thread per answer, plain HTTP's over the mode's: the rate
    /// ratio that thread's CPU alone would allow (1.0 = a read costs it what `/healthz` does).
    pub node_thread_cpu_ratio: Option<f64>,
}

/// Medians over the rounds, per backend and mode.
#[derive(Debug, Serialize)]
pub struct RatioSummary {
    pub backend: BackendKind,
    pub mode: String,
    pub rounds: usize,
    pub ratio_median: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    pub ok_per_s_median: f64,
    pub plain_http_ok_per_s_median: f64,
    pub p99_ms_median: f64,
    pub plain_http_p99_ms_median: f64,
    /// Medians of [`RatioRow::node_thread_cpu_ratio`] and of the leader's busiest thread's µs
    /// per answer, the mode's and plain HTTP's.
    pub node_thread_cpu_ratio_median: Option<f64>,
    pub node_thread_us_median: Option<f64>,
    pub plain_http_node_thread_us_median: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct ConnectionsUsed {
    pub backend: BackendKind,
    pub mode: String,
    pub choice: ConnectionChoice,
}

#[derive(Debug, Serialize)]
pub struct ReadReport {
    pub rows: Vec<ReadRow>,
    pub ratios: Vec<RatioRow>,
    pub ratio_medians: Vec<RatioSummary>,
    /// How each mode's connections were chosen (plain HTTP uses the first mode's).
    pub connections: Vec<ConnectionsUsed>,
    pub load_threads: usize,
    pub duration_ms: u64,
    pub rounds: usize,
    pub errors: Vec<String>,
    pub loadavg_start: Option<[f64; 3]>,
    pub loadavg_end: Option<[f64; 3]>,
    pub machine: serde_json::Value,
}

pub async fn run(args: ReadArgs) -> anyhow::Result<ReadReport> {
    for m in &args.modes {
        if !["lease", "quorum", "resource"].contains(&m.as_str()) {
            bail!("read mode must be lease, quorum or resource, not {m:?}");
        }
    }
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if args.connections == Some(0) {
        bail!("--connections must be at least 1");
    }
    let loadavg_start = loadavg();
    let mut rows = Vec::new();
    let mut used = Vec::new();
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
            Ok((r, u)) => {
                rows.extend(r);
                used.extend(u);
            }
            Err(e) => errors.push(format!("{backend}: {e:#}")),
        }
    }
    let ratios = ratios(&rows);
    let ratio_medians = ratio_medians(&ratios, &rows);
    println!("{}", render(&rows));
    if !ratios.is_empty() {
        println!("{}", render_ratios(&ratio_medians));
    }
    for e in &errors {
        println!("error: {e}");
    }
    let report = ReadReport {
        rows,
        ratios,
        ratio_medians,
        connections: used,
        load_threads: threads(&args),
        duration_ms: args.duration,
        rounds: args.rounds,
        errors,
        loadavg_start,
        loadavg_end: loadavg(),
        machine: machine_info(),
    };
    super::write_report(args.out.as_deref(), &report)?;
    Ok(report)
}

fn threads(args: &ReadArgs) -> usize {
    args.load_threads.unwrap_or_else(load::default_threads)
}

/// Waits until some node answers a read (a leader whose work has claimed its state), and
/// returns that node.
async fn wait_for_reads(state: &FleetState) -> anyhow::Result<FleetNode> {
    let client = NodeClient::new(Duration::from_secs(2));
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        for n in &state.nodes {
            if let Ok(r) = client.get(&n.http_addr, "/read?mode=quorum").await {
                if r.status == 200 {
                    return Ok(n.clone());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("no node answered a read within 60 s")
}

/// The bounds on the connection count against `leader`.
fn limits_for(leader: &FleetNode) -> SizingLimits {
    let node_max = NodeConfig::from_file(&leader.config)
        .ok()
        .map(|c| c.http.max_connections);
    SizingLimits::here(node_max, sizing::nofile_of(leader.pid))
}

async fn measure(
    args: &ReadArgs,
    backend: BackendKind,
    state: &FleetState,
) -> anyhow::Result<(Vec<ReadRow>, Vec<ConnectionsUsed>)> {
    let leader = wait_for_reads(state)
        .await
        .context("waiting for a leader")?;
    let targets: Vec<String> = state.nodes.iter().map(|n| n.http_addr.clone()).collect();
    let load_threads = threads(args);
    let spec = |mode: &str, connections: usize, d: Duration| {
        let mut s = LoadSpec::new(targets.clone(), args.rate, d);
        s.connections = connections;
        s.threads = load_threads;
        if mode == PLAIN_HTTP {
            // Plain HTTP goes to the leader, as the reads do once redirected.
            s.targets = vec![leader.http_addr.clone()];
            s.path = "/healthz".into();
            s.probe = true;
        } else {
            s.read_fraction = 1.0;
            s.read_modes = vec![mode.to_owned()];
        }
        s
    };
    let limits = limits_for(&leader);
    let mut chosen: Vec<(String, ConnectionChoice)> = Vec::new();
    for mode in &args.modes {
        println!("{backend} {mode}: sizing the connections and warming up");
        let choice = sizing::choose_connections(
            |c, d| spec(mode, c, d),
            args.rate,
            Duration::from_millis(args.warmup),
            args.connections,
            args.connection_headroom,
            limits.clone(),
        )
        .await?;
        println!("{backend} {mode}: {}", choice.describe());
        chosen.push((mode.clone(), choice));
    }
    // Plain HTTP runs with the first mode's connections (a same-stack comparison), after its
    // own unloaded probe (the reference for "the node queued").
    let mut measured: Vec<(String, usize, Option<f64>)> = chosen
        .iter()
        .map(|(m, c)| (m.clone(), c.connections, c.unloaded_service_p50_ms))
        .collect();
    if !args.no_plain_http {
        let c = chosen
            .first()
            .map_or(args.connections.unwrap_or(32), |(_, c)| c.connections);
        let plain = sizing::choose_connections(
            |c, d| spec(PLAIN_HTTP, c, d),
            args.rate,
            Duration::from_millis(args.warmup.min(1000)),
            Some(c),
            args.connection_headroom,
            limits.clone(),
        )
        .await?;
        measured.push((PLAIN_HTTP.into(), c, plain.unloaded_service_p50_ms));
    }
    let procs = [(format!("leader node {}", leader.id), leader.pid)];
    let mut rows = Vec::new();
    for round in 1..=args.rounds {
        for (mode, connections, unloaded) in &measured {
            let s = spec(mode, *connections, Duration::from_millis(args.duration));
            let cpu_start = machine_cpu();
            let window = cpu::Window::start(&procs);
            let report = load::run(s.clone()).await?;
            let mut threads = window.finish(&[None]);
            threads.push({
                let s = report.summary();
                cpu::generator(&s.generator_threads_busy, s.elapsed_s)
            });
            let machine = cpu_window(cpu_start, machine_cpu());
            println!(
                "{backend} {mode}, round {round}:\n{}{}",
                report.render(),
                cpu::render(&threads)
            );
            rows.push(row(
                backend, mode, round, &s, &report, *unloaded, threads, machine,
            ));
        }
    }
    let used = chosen
        .into_iter()
        .map(|(mode, choice)| ConnectionsUsed {
            backend,
            mode,
            choice,
        })
        .collect();
    Ok((rows, used))
}

#[allow(clippy::too_many_arguments)]
fn row(
    backend: BackendKind,
    mode: &str,
    round: usize,
    spec: &LoadSpec,
    report: &load::LoadReport,
    unloaded: Option<f64>,
    threads: Vec<ProcessThreads>,
    machine_cpu: Option<CpuWindow>,
) -> ReadRow {
    let s = report.summary();
    let generator_busiest = threads
        .iter()
        .find(|p| p.what == "generator")
        .and_then(|p| p.busiest.first())
        .map(|t| t.busy);
    let node = threads.iter().find(|p| p.what.starts_with("leader"));
    let node_busiest = node.and_then(|p| p.busiest.first()).map(|t| t.busy);
    let limited_by = sizing::classify(&RunFacts {
        unloaded_service_p50_ms: unloaded,
        generator_busiest,
        node_busiest,
        ..sizing::facts(spec, report)
    });
    // Shares of a window, back to CPU seconds, over the answered requests.
    let per_request = |p: Option<&ProcessThreads>, share: Option<f64>| {
        let secs = p?.seconds;
        share
            .filter(|_| s.ok > 0)
            .map(|c| c * secs / s.ok as f64 * 1e6)
    };
    let generator = threads.iter().find(|p| p.what == "generator");
    ReadRow {
        backend,
        mode: mode.to_owned(),
        round,
        offered_rate: spec.rate,
        ok_per_s: s.ok_rate,
        ok: s.ok,
        errors: s.rejected + s.unknown,
        unsent: s.unsent,
        p50_ms: s.latency_ms.p50,
        p99_ms: s.latency_ms.p99,
        service_p50_ms: s.service_ms.p50,
        service_p99_ms: s.service_ms.p99,
        fell_back_fraction: (mode == "lease" && s.reads_ok > 0)
            .then(|| s.reads_fell_back as f64 / s.reads_ok as f64),
        connections: spec.connections,
        busy_connections_mean: s.busy_connections_mean,
        limited_by,
        node_busiest_thread_us_per_request: per_request(node, node_busiest),
        node_us_per_request: per_request(node, node.map(|p| p.total_cores)),
        generator_us_per_request: per_request(generator, generator.map(|p| p.total_cores)),
        threads,
        machine_cpu,
    }
}

/// Each mode's rate over plain HTTP's, per backend and round.
pub fn ratios(rows: &[ReadRow]) -> Vec<RatioRow> {
    rows.iter()
        .filter(|r| r.mode != PLAIN_HTTP)
        .filter_map(|r| {
            let plain = rows
                .iter()
                .find(|p| p.mode == PLAIN_HTTP && p.backend == r.backend && p.round == r.round)?;
            (plain.ok_per_s > 0.0).then(|| RatioRow {
                backend: r.backend,
                mode: r.mode.clone(),
                round: r.round,
                ok_per_s: r.ok_per_s,
                plain_http_ok_per_s: plain.ok_per_s,
                ratio: r.ok_per_s / plain.ok_per_s,
                p99_over_plain_http: if plain.p99_ms > 0.0 {
                    r.p99_ms / plain.p99_ms
                } else {
                    f64::NAN
                },
                node_thread_cpu_ratio: match (
                    plain.node_busiest_thread_us_per_request,
                    r.node_busiest_thread_us_per_request,
                ) {
                    (Some(p), Some(m)) if m > 0.0 => Some(p / m),
                    _ => None,
                },
            })
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    super::percentile(&v, 50.0)
}

fn some_median(v: Vec<f64>) -> Option<f64> {
    (!v.is_empty()).then(|| median(v))
}

/// Medians over the rounds of [`ratios`], per backend and mode.
pub fn ratio_medians(ratios: &[RatioRow], rows: &[ReadRow]) -> Vec<RatioSummary> {
    let mut keys: Vec<(BackendKind, String)> = Vec::new();
    for r in ratios {
        if !keys.iter().any(|(b, m)| *b == r.backend && *m == r.mode) {
            keys.push((r.backend, r.mode.clone()));
        }
    }
    keys.into_iter()
        .map(|(backend, mode)| {
            let of: Vec<&RatioRow> = ratios
                .iter()
                .filter(|r| r.backend == backend && r.mode == mode)
                .collect();
            let p99 = |m: &str| {
                median(
                    rows.iter()
                        .filter(|r| r.backend == backend && r.mode == m)
                        .map(|r| r.p99_ms)
                        .collect(),
                )
            };
            let us = |m: &str| {
                some_median(
                    rows.iter()
                        .filter(|r| r.backend == backend && r.mode == m)
                        .filter_map(|r| r.node_busiest_thread_us_per_request)
                        .collect(),
                )
            };
            let rs: Vec<f64> = of.iter().map(|r| r.ratio).collect();
            RatioSummary {
                backend,
                mode: mode.clone(),
                rounds: of.len(),
                ratio_median: median(rs.clone()),
                ratio_min: rs.iter().copied().fold(f64::INFINITY, f64::min),
                ratio_max: rs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                ok_per_s_median: median(of.iter().map(|r| r.ok_per_s).collect()),
                plain_http_ok_per_s_median: median(
                    of.iter().map(|r| r.plain_http_ok_per_s).collect(),
                ),
                p99_ms_median: p99(&mode),
                plain_http_p99_ms_median: p99(PLAIN_HTTP),
                node_thread_cpu_ratio_median: some_median(
                    of.iter().filter_map(|r| r.node_thread_cpu_ratio).collect(),
                ),
                node_thread_us_median: us(&mode),
                plain_http_node_thread_us_median: us(PLAIN_HTTP),
            }
        })
        .collect()
}

fn us(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into())
}

/// The side-by-side table (markdown).
pub fn render(rows: &[ReadRow]) -> String {
    let mut out = String::from(
        "| backend | mode | round | offered/s | answered/s | errors / unsent | p50 / p99 ms (from schedule) | service p50 / p99 ms | lease fell back | connections (busy) | limited by | busiest node thread / generator thread | µs per answer: node thread / node / generator |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let busiest = |what: &str| {
            r.threads
                .iter()
                .find(|p| p.what.starts_with(what))
                .and_then(|p| p.busiest.first())
                .map(|t| format!("{} {:.0}%", t.name, t.busy * 100.0))
                .unwrap_or_else(|| "-".into())
        };
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.0} | {} / {} | {:.2} / {:.2} | {:.2} / {:.2} | {} | {} ({:.0}) | {} | {} / {} | {} / {} / {} |\n",
            r.backend,
            r.mode,
            r.round,
            r.offered_rate,
            r.ok_per_s,
            r.errors,
            r.unsent,
            r.p50_ms,
            r.p99_ms,
            r.service_p50_ms,
            r.service_p99_ms,
            r.fell_back_fraction
                .map(|f| format!("{:.1}%", f * 100.0))
                .unwrap_or_else(|| "-".into()),
            r.connections,
            r.busy_connections_mean,
            serde_json::to_value(r.limited_by.limit)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            busiest("leader"),
            busiest("generator"),
            us(r.node_busiest_thread_us_per_request),
            us(r.node_us_per_request),
            us(r.generator_us_per_request),
        ));
    }
    for r in rows
        .iter()
        .filter(|r| r.limited_by.limit != sizing::Limit::None)
    {
        out.push_str(&format!(
            "\n{} {} round {}: {}",
            r.backend, r.mode, r.round, r.limited_by.why
        ));
    }
    out
}

/// Medians of the ratios to plain HTTP (markdown).
pub fn render_ratios(medians: &[RatioSummary]) -> String {
    let mut out = String::from(
        "| backend | mode | rounds | answered/s median | /healthz median | ratio median (min-max) | p99 ms median, mode / healthz | node thread µs per answer, mode / healthz (ratio) |\n|---|---|---|---|---|---|---|---|\n",
    );
    for m in medians {
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.2} ({:.2}-{:.2}) | {:.2} / {:.2} | {} / {} ({}) |\n",
            m.backend,
            m.mode,
            m.rounds,
            m.ok_per_s_median,
            m.plain_http_ok_per_s_median,
            m.ratio_median,
            m.ratio_min,
            m.ratio_max,
            m.p99_ms_median,
            m.plain_http_p99_ms_median,
            us(m.node_thread_us_median),
            us(m.plain_http_node_thread_us_median),
            m.node_thread_cpu_ratio_median
                .map(|x| format!("{x:.2}"))
                .unwrap_or_else(|| "-".into()),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mode: &str, round: usize, ok_per_s: f64, p99_ms: f64, thread_us: f64) -> ReadRow {
        ReadRow {
            backend: BackendKind::Raft,
            mode: mode.into(),
            round,
            offered_rate: 100_000.0,
            ok_per_s,
            ok: ok_per_s as usize,
            errors: 0,
            unsent: 0,
            p50_ms: p99_ms / 2.0,
            p99_ms,
            service_p50_ms: 0.1,
            service_p99_ms: 0.2,
            fell_back_fraction: None,
            connections: 64,
            busy_connections_mean: 64.0,
            limited_by: Verdict {
                limit: sizing::Limit::Node,
                why: String::new(),
            },
            threads: Vec::new(),
            node_busiest_thread_us_per_request: Some(thread_us),
            node_us_per_request: None,
            generator_us_per_request: None,
            machine_cpu: None,
        }
    }

    /// Each mode is set against plain HTTP of its own round only, and the medians are over
    /// the rounds (an odd count: the middle one).
    #[test]
    fn ratios_pair_each_round_with_its_own_plain_http_and_take_medians() {
        let rows = vec![
            row("lease", 1, 40_000.0, 4.0, 25.0),
            row(PLAIN_HTTP, 1, 50_000.0, 2.0, 20.0),
            row("lease", 2, 30_000.0, 6.0, 30.0),
            row(PLAIN_HTTP, 2, 20_000.0, 3.0, 24.0),
            row("lease", 3, 45_000.0, 5.0, 22.0),
            row(PLAIN_HTTP, 3, 50_000.0, 1.0, 22.0),
            // A round without plain HTTP has no ratio.
            row("lease", 4, 10_000.0, 9.0, 40.0),
        ];
        let r = ratios(&rows);
        let got: Vec<(usize, f64)> = r.iter().map(|x| (x.round, x.ratio)).collect();
        assert_eq!(got, vec![(1, 0.8), (2, 1.5), (3, 0.9)]);
        assert_eq!(r[0].node_thread_cpu_ratio, Some(0.8));
        let m = ratio_medians(&r, &rows);
        assert_eq!(m.len(), 1);
        let m = &m[0];
        assert_eq!((m.rounds, m.ratio_median), (3, 0.9));
        assert_eq!((m.ratio_min, m.ratio_max), (0.8, 1.5));
        assert_eq!(m.plain_http_ok_per_s_median, 50_000.0);
        // p99 medians are over every row of the mode, the round without plain HTTP included.
        assert_eq!((m.p99_ms_median, m.plain_http_p99_ms_median), (5.5, 2.0));
        assert_eq!(m.node_thread_us_median, Some(27.5));
        assert_eq!(m.plain_http_node_thread_us_median, Some(22.0));
    }
}
