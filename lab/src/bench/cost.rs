//! `baton bench cost`: what a fleet costs as it grows — idle CPU and memory per node, requests to
//! the election backend per second at idle, and election latency after a leader kill — per backend
//! and fleet size, on one machine, in one invocation (issue 14, item 6).
//!
//! ```text
//! baton bench cost --backends raft,etcd --nodes 3,9,27 --idle 30s --trials 10 --out experiments/results/bench-cost
//! ```
//!
//! For each fleet size N, and each backend in turn (sizes outermost, so the backends of one size
//! run back to back under similar machine conditions), the bench starts a fresh fleet
//! (`baton::fleet::up`, base config `config/<backend>.toml`, fencing on), waits until every node
//! answers `/status` and one of them leads, lets it run `--warmup` (5 s), then measures an idle
//! window of `--idle` (30 s) with no client load:
//!
//! 1. **CPU**: each node process's `utime + stime` (`/proc/<pid>/stat`) at the start and the end
//!    of the window, as a percentage of one core; median and max across nodes, and the fleet's
//!    sum. The etcd members (the etcd backend's service; raft has none) are measured the same way
//!    and reported beside the nodes, never inside their numbers.
//! 2. **memory**: each node's `VmRSS` (`/proc/<pid>/status`) at the end of the window.
//! 3. **backend requests**: `baton_backend_requests_total` scraped from every node's `/metrics`
//!    just before and just after the window (`baton exp`'s `RequestMeter`): requests to etcd for
//!    etcd, peer RPCs sent (appends, votes) for raft; per second, for the fleet and per node.
//! 4. **election latency**: then `--trials` (10) kill -9s of the leader on the same fleet, by
//!    `baton bench failover`'s own trial loop (its sequential `POST /next` client runs during the
//!    trials only): kill -9 → the new leader's first `next` write accepted by the fence, measured
//!    as first `next` row of the new leadership − last `next` row of the old one, both
//!    `baton.fence_log.committed_at` (PostgreSQL's clock); p50 and p99 (nearest rank: with fewer
//!    than 100 trials, p99 is the maximum).
//!
//! Other work on the machine shares its cores, so every window also records the load average
//! (`/proc/loadavg`) at its start and end and the whole machine's busy CPU over it (`/proc/stat`).
//! Each fleet is stopped after its measurement, also on error and on Ctrl-C; a fleet that fails is
//! recorded with its error and the bench goes on with the next one (and exits non-zero at the end).
//! `cost.json`, `summary.md` and one SVG per metric (x = N, one line per backend) are rewritten in
//! `--out` after every fleet, so a run cut short keeps what it measured.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::unix_ms;

use anyhow::{anyhow, bail, Context};
use serde::Serialize;

use super::failover::{self, connect_admin, ledger_violations, redacted_config, FailoverArgs};
use super::{bench_fleet_spec, cpu_window, loadavg, machine_cpu, machine_info, CpuTimes, Summary};
use crate::fleet::client::NodeClient;
use crate::fleet::meter::RequestMeter;
use crate::fleet::servers::pid_alive;
use crate::fleet::{self, FleetState};
use crate::plots;
use baton::backends::BackendKind;
use baton::config::parse_duration_ms;

#[derive(clap::Args, Clone, Debug)]
pub struct CostArgs {
    /// Election backends, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "raft,etcd")]
    pub backends: Vec<BackendKind>,
    /// Fleet sizes (node count), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "3,9,27")]
    pub nodes: Vec<usize>,
    /// Idle window (no client load) over which CPU, memory and backend requests are measured.
    #[arg(long = "idle", value_parser = parse_duration_ms, default_value = "30s")]
    pub idle_ms: u64,
    /// Steady state between the first leader and the idle window (start-up is not idle cost).
    #[arg(long = "warmup", value_parser = parse_duration_ms, default_value = "5s")]
    pub warmup_ms: u64,
    /// kill -9 trials of the leader per fleet, after its idle window (0: none).
    #[arg(long, default_value_t = 10)]
    pub trials: usize,
    /// Steady state between trials.
    #[arg(long = "settle", value_parser = parse_duration_ms, default_value = "1s")]
    pub settle_ms: u64,
    /// A trial fails when no new leader serves within this long.
    #[arg(long = "trial-timeout", value_parser = parse_duration_ms, default_value = "60s")]
    pub trial_timeout_ms: u64,
    /// A fleet fails when not every node answers /status, one of them leading, within this long.
    #[arg(long = "start-timeout", value_parser = parse_duration_ms, default_value = "120s")]
    pub start_timeout_ms: u64,
    /// Lease TTL override for every fleet, e.g. 3s (default: each backend's config).
    #[arg(long = "lease-ttl", value_parser = parse_duration_ms)]
    pub lease_ttl_ms: Option<u64>,
    /// Scratch fleet directories go under this one, as <backend>-<N> (an old, stopped fleet there
    /// is wiped).
    #[arg(long, default_value = "state/bench/cost")]
    pub dir: PathBuf,
    /// Output directory: cost.json, summary.md and the SVGs.
    #[arg(long, default_value = "experiments/results/bench-cost")]
    pub out: PathBuf,
}

/// One process's cost over the idle window.
#[derive(Clone, Debug, Serialize)]
pub struct ProcCost {
    pub id: String,
    pub pid: u32,
    /// utime + stime over the window, % of one core.
    pub cpu_percent: f64,
    /// VmRSS at the end of the window.
    pub rss_mib: f64,
    /// `baton_backend_requests_total` this node added over the window, per second (nodes only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend_requests_per_s: Option<f64>,
}

/// The leader-kill trials on one fleet.
#[derive(Clone, Debug, Serialize)]
pub struct ElectionCost {
    pub trials_requested: usize,
    /// kill -9 → first `next` write of the new leadership accepted by the fence (resource clock).
    pub failover_ms: Option<Summary>,
    /// kill -9 → first 200 from the new leader (the client's monotonic clock).
    pub detect_ms: Option<Summary>,
    /// Requests the surviving nodes sent to the backend per election.
    pub backend_requests_per_election: Option<Summary>,
    pub client_violations: Vec<String>,
    pub ledger_violations: Option<i64>,
    pub trials: Vec<failover::Trial>,
    /// `/proc/loadavg` before and after the trials, and the whole machine's busy CPU over them
    /// (in cores): election latency is what CPU contention shows in first.
    pub loadavg_start: Option<[f64; 3]>,
    pub loadavg_end: Option<[f64; 3]>,
    pub machine_busy_cores: Option<f64>,
    pub error: Option<String>,
}

/// One fleet's measurement.
#[derive(Clone, Debug, Serialize)]
pub struct FleetCost {
    pub backend: BackendKind,
    pub nodes: usize,
    pub dir: String,
    pub base_config_file: Option<String>,
    pub config: serde_json::Value,
    pub started_at_unix_ms: u64,
    /// `/proc/loadavg` (1, 5, 15 min) at the start and at the end of the idle window.
    pub loadavg_start: Option<[f64; 3]>,
    pub loadavg_end: Option<[f64; 3]>,
    /// The whole machine's busy CPU over the idle window (`/proc/stat`), in cores, and what is
    /// left of it after this fleet's nodes and backend servers: everything else that ran
    /// (PostgreSQL, this bench, other work on the machine).
    pub machine_busy_cores: Option<f64>,
    pub other_busy_cores: Option<f64>,
    /// The CPU window (between the two /proc samples) and the request-counter window.
    pub idle_window_s: f64,
    pub request_window_s: f64,
    /// (node, token) leading at the start and at the end of the window, from `/status`.
    pub leader_start: Option<(String, i64)>,
    pub leader_end: Option<(String, i64)>,
    /// Terms that claimed the fenced resource during the window (0: no leadership change).
    pub leadership_changes_during_idle: Option<i64>,
    pub cpu_percent_per_node: Option<Summary>,
    pub cpu_percent_fleet: Option<f64>,
    pub rss_mib_per_node: Option<Summary>,
    pub rss_mib_fleet: Option<f64>,
    pub backend_requests_per_s_fleet: Option<f64>,
    pub backend_requests_per_s_per_node: Option<Summary>,
    pub backend_requests_per_s_by_op: BTreeMap<String, f64>,
    /// The backend's own servers (the etcd members; none for raft).
    pub backend_servers: Vec<ProcCost>,
    pub backend_servers_cpu_percent: Option<f64>,
    pub node_costs: Vec<ProcCost>,
    pub election: Option<ElectionCost>,
    pub error: Option<String>,
}

/// `utime + stime` (clock ticks) from a `/proc/<pid>/stat` line. The command name (field 2) is in
/// parentheses and may itself hold spaces and parentheses, so fields are counted after the last
/// `)`: that rest starts at field 3 (state); utime and stime are fields 14 and 15.
fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// `VmRSS` in KiB from a `/proc/<pid>/status` text (the kernel writes it in kB).
fn parse_status_rss_kib(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let mut parts = line.split_whitespace();
    let value = parts.next()?.parse().ok()?;
    (parts.next() == Some("kB")).then_some(value)
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf reads a constant; no memory is touched.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_stat_cpu_ticks(&text).with_context(|| format!("parsing {path}: {text:?}"))
}

fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let kib = parse_status_rss_kib(&text).with_context(|| format!("no VmRSS in {path}"))?;
    Ok(kib as f64 / 1024.0)
}

/// The whole machine's busy CPU between two `/proc/stat` samples, in cores.
fn busy_cores(a: Option<CpuTimes>, b: Option<CpuTimes>) -> Option<f64> {
    cpu_window(a, b).map(|w| w.busy_cores)
}

/// CPU ticks of every (id, pid) at one instant (the middle of the reads).
fn sample_cpu(procs: &[(String, u32)]) -> anyhow::Result<(Instant, Vec<u64>)> {
    let before = Instant::now();
    let ticks = procs
        .iter()
        .map(|(id, pid)| cpu_ticks(*pid).with_context(|| format!("{id} (pid {pid})")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((before + before.elapsed() / 2, ticks))
}

/// The node leading now with the highest token (if any), and the nodes answering `/status`.
async fn status_now(state: &FleetState) -> (Option<(String, i64)>, Vec<String>) {
    let rows = fleet::status(state).await;
    let leader = fleet::leader_row(&rows).map(|r| (r.id.clone(), r.token.unwrap_or(0)));
    let answering = rows
        .into_iter()
        .filter(|r| r.role.is_some())
        .map(|r| r.id)
        .collect();
    (leader, answering)
}

/// Waits until every node answers `/status` and one of them leads.
async fn wait_ready(state: &FleetState, within: Duration) -> anyhow::Result<(String, i64)> {
    let until = Instant::now() + within;
    loop {
        let rows = fleet::status(state).await;
        let answering = rows.iter().filter(|r| r.role.is_some()).count();
        if let Some(dead) = rows.iter().find(|r| !r.alive) {
            bail!(
                "node {} (pid {}) exited while the fleet started; see {}",
                dead.id,
                dead.pid,
                state.node(&dead.id)?.log.display()
            );
        }
        let leader = fleet::leader_row(&rows);
        if let (true, Some(l)) = (answering == rows.len(), leader) {
            return Ok((l.id.clone(), l.token.unwrap_or(0)));
        }
        if Instant::now() > until {
            bail!(
                "after {within:?}: {answering} of {} nodes answer /status, leader {:?}",
                rows.len(),
                leader.map(|l| &l.id)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs the benchmark; writes `cost.json`, `summary.md` and the SVGs to `--out` after every fleet.
pub async fn run(args: CostArgs) -> anyhow::Result<Vec<FleetCost>> {
    if args.backends.is_empty() || args.nodes.is_empty() {
        bail!("--backends and --nodes need at least one value each");
    }
    if let Some(n) = args.nodes.iter().find(|n| **n < 2) {
        bail!(
            "--nodes {n}: a fleet needs at least 2 nodes (a kill needs somebody to fail over to)"
        );
    }
    if args.idle_ms == 0 {
        bail!("--idle must be longer than 0");
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let started_at = unix_ms();
    let machine = machine_info();
    let mut fleets: Vec<FleetCost> = Vec::new();
    let mut interrupted = false;
    'sizes: for &n in &args.nodes {
        for &backend in &args.backends {
            let (cost, stop) = one_fleet(&args, backend, n).await;
            if let Some(e) = &cost.error {
                eprintln!("bench cost: {backend} N={n} FAILED: {e}");
            }
            fleets.push(cost);
            write_outputs(&args, &machine, started_at, &fleets)?;
            if stop {
                interrupted = true;
                break 'sizes;
            }
        }
    }
    println!("{}", summary_table(&fleets));
    println!(
        "wrote {}/{{cost.json,summary.md,*.svg}}",
        args.out.display()
    );
    if interrupted {
        bail!("interrupted (Ctrl-C)");
    }
    let failed: Vec<String> = fleets
        .iter()
        .filter(|f| f.error.is_some() || f.election.as_ref().is_some_and(|e| e.error.is_some()))
        .map(|f| format!("{} N={}", f.backend, f.nodes))
        .collect();
    if !failed.is_empty() {
        bail!("{} fleet(s) failed: {}", failed.len(), failed.join(", "));
    }
    Ok(fleets)
}

/// Starts, measures and stops one fleet. Returns its record and whether Ctrl-C stopped it.
async fn one_fleet(args: &CostArgs, backend: BackendKind, n: usize) -> (FleetCost, bool) {
    let dir = args.dir.join(format!("{backend}-{n}"));
    let mut cost = FleetCost {
        backend,
        nodes: n,
        dir: dir.display().to_string(),
        base_config_file: None,
        config: serde_json::Value::Null,
        started_at_unix_ms: unix_ms(),
        loadavg_start: None,
        loadavg_end: None,
        machine_busy_cores: None,
        other_busy_cores: None,
        idle_window_s: 0.0,
        request_window_s: 0.0,
        leader_start: None,
        leader_end: None,
        leadership_changes_during_idle: None,
        cpu_percent_per_node: None,
        cpu_percent_fleet: None,
        rss_mib_per_node: None,
        rss_mib_fleet: None,
        backend_requests_per_s_fleet: None,
        backend_requests_per_s_per_node: None,
        backend_requests_per_s_by_op: BTreeMap::new(),
        backend_servers: Vec::new(),
        backend_servers_cpu_percent: None,
        node_costs: Vec::new(),
        election: None,
        error: None,
    };
    let spec = match bench_fleet_spec(dir.clone(), n, backend, None, args.lease_ttl_ms) {
        Ok(s) => s,
        Err(e) => {
            cost.error = Some(format!("preparing {}: {e:#}", dir.display()));
            return (cost, false);
        }
    };
    cost.base_config_file = spec.base_config.as_ref().map(|p| p.display().to_string());
    println!(
        "bench cost: {backend} N={n} in {} (idle {} ms after {} ms warm-up, then {} kill trials)",
        dir.display(),
        args.idle_ms,
        args.warmup_ms,
        args.trials
    );
    let mut state = match fleet::up(&spec).await {
        Ok(s) => s,
        Err(e) => {
            cost.error = Some(format!("starting the fleet: {e:#}"));
            return (cost, false);
        }
    };
    cost.config = redacted_config(&state);
    // A backstop over everything the fleet does; each step below has its own, tighter bound.
    let bound = Duration::from_millis(
        args.start_timeout_ms
            + args.warmup_ms
            + args.idle_ms
            + 60_000
            + args.trials as u64 * (args.trial_timeout_ms + args.settle_ms + 60_000),
    );
    let mut stopped = false;
    let outcome = tokio::select! {
        r = tokio::time::timeout(bound, measure(args, &mut state, &mut cost)) => {
            r.unwrap_or_else(|_| Err(anyhow!("the fleet's measurement took longer than {bound:?}")))
        }
        _ = tokio::signal::ctrl_c() => {
            stopped = true;
            Err(anyhow!("interrupted (Ctrl-C)"))
        }
    };
    if let Err(e) = outcome {
        cost.error = Some(format!("{e:#}"));
    }
    let down = state.clone();
    if tokio::task::spawn_blocking(move || down.down())
        .await
        .is_err()
    {
        eprintln!("bench cost: stopping the fleet in {} failed", dir.display());
    }
    println!("fleet {backend} N={n} stopped");
    (cost, stopped)
}

/// The idle window, then the kill trials, filling `cost` as it goes.
async fn measure(
    args: &CostArgs,
    state: &mut FleetState,
    cost: &mut FleetCost,
) -> anyhow::Result<()> {
    let first = wait_ready(state, Duration::from_millis(args.start_timeout_ms))
        .await
        .context("waiting for every node to answer and one to lead")?;
    println!(
        "all {} nodes answer; leader {} (token {}); warm-up {} ms",
        state.nodes.len(),
        first.0,
        first.1,
        args.warmup_ms
    );
    tokio::time::sleep(Duration::from_millis(args.warmup_ms)).await;

    let db = connect_admin(state).await?;
    let pos_before = failover::ledger_pos(&db).await?;
    let (leader, answering0) = status_now(state).await;
    cost.leader_start = leader;
    let nodes: Vec<(String, u32)> = state.nodes.iter().map(|n| (n.id.clone(), n.pid)).collect();
    let servers: Vec<(String, u32)> = state
        .etcd
        .iter()
        .flat_map(|e| e.members.iter().map(|m| (m.name.clone(), m.pid)))
        .collect();
    let all: Vec<(String, u32)> = nodes.iter().chain(&servers).cloned().collect();

    // Counters just outside the CPU window: the scrapes' own work is not idle cost.
    let client = NodeClient::new(Duration::from_secs(2));
    let mut meter = RequestMeter::default();
    let scrape0 = Instant::now();
    meter.scrape(&client, state).await;
    let req_t0 = scrape0 + scrape0.elapsed() / 2;
    meter.baseline();
    let counts0: Vec<f64> = nodes
        .iter()
        .map(|(id, pid)| meter.node_count(id, *pid))
        .collect();

    cost.loadavg_start = loadavg();
    let machine0 = machine_cpu();
    let (t0, ticks0) = sample_cpu(&all).context("CPU sample at the start of the idle window")?;
    println!("idle window: {} ms, no client load", args.idle_ms);
    tokio::time::sleep(Duration::from_millis(args.idle_ms)).await;
    let (t1, ticks1) = sample_cpu(&all).with_context(|| {
        "CPU sample at the end of the idle window (did a process exit during it?)"
    })?;
    let machine1 = machine_cpu();
    cost.loadavg_end = loadavg();
    let rss = all
        .iter()
        .map(|(id, pid)| rss_mib(*pid).with_context(|| format!("{id} (pid {pid})")))
        .collect::<anyhow::Result<Vec<_>>>()
        .context("memory at the end of the idle window")?;

    let scrape1 = Instant::now();
    meter.scrape(&client, state).await;
    let req_t1 = scrape1 + scrape1.elapsed() / 2;
    let (leader, answering1) = status_now(state).await;
    cost.leader_end = leader;
    cost.leadership_changes_during_idle = Some(failover::terms_since(&db, pos_before).await?.0);

    let window_s = (t1 - t0).as_secs_f64();
    let req_window_s = (req_t1 - req_t0).as_secs_f64();
    cost.idle_window_s = window_s;
    cost.request_window_s = req_window_s;
    let hz = clock_ticks_per_s();
    let cpu_percent = |k: usize| ticks1[k].saturating_sub(ticks0[k]) as f64 / hz / window_s * 100.0;
    let mut node_costs = Vec::new();
    for (k, (id, pid)) in nodes.iter().enumerate() {
        // A counter never incremented is not exported (a raft follower sends no peer RPC): 0.
        // A node that did not answer /status right before and after the scrapes has no count,
        // never a false 0.
        let answered = answering0.contains(id) && answering1.contains(id);
        let requests =
            answered.then(|| (meter.node_count(id, *pid) - counts0[k]).max(0.0) / req_window_s);
        node_costs.push(ProcCost {
            id: id.clone(),
            pid: *pid,
            cpu_percent: cpu_percent(k),
            rss_mib: rss[k],
            backend_requests_per_s: requests,
        });
    }
    let server_costs: Vec<ProcCost> = servers
        .iter()
        .enumerate()
        .map(|(j, (id, pid))| ProcCost {
            id: id.clone(),
            pid: *pid,
            cpu_percent: cpu_percent(nodes.len() + j),
            rss_mib: rss[nodes.len() + j],
            backend_requests_per_s: None,
        })
        .collect();
    let cpu: Vec<f64> = node_costs.iter().map(|c| c.cpu_percent).collect();
    let mem: Vec<f64> = node_costs.iter().map(|c| c.rss_mib).collect();
    let req: Vec<f64> = node_costs
        .iter()
        .filter_map(|c| c.backend_requests_per_s)
        .collect();
    cost.cpu_percent_per_node = Summary::of(&cpu);
    cost.cpu_percent_fleet = Some(cpu.iter().sum());
    cost.rss_mib_per_node = Summary::of(&mem);
    cost.rss_mib_fleet = Some(mem.iter().sum());
    cost.backend_requests_per_s_per_node = Summary::of(&req);
    cost.backend_requests_per_s_fleet = (req.len() == nodes.len()).then(|| req.iter().sum());
    cost.backend_requests_per_s_by_op = meter
        .total()
        .iter()
        .map(|(op, v)| (op.clone(), v / req_window_s))
        .collect();
    let servers_cpu: f64 = server_costs.iter().map(|c| c.cpu_percent).sum();
    cost.backend_servers_cpu_percent = (!server_costs.is_empty()).then_some(servers_cpu);
    cost.backend_servers = server_costs;
    if let Some(busy) = busy_cores(machine0, machine1) {
        cost.machine_busy_cores = Some(busy);
        cost.other_busy_cores =
            Some(busy - cost.cpu_percent_fleet.unwrap_or(0.0) / 100.0 - servers_cpu / 100.0);
    }
    cost.node_costs = node_costs;
    println!(
        "idle {window_s:.1} s: CPU/node median {:.2}% max {:.2}%, fleet {:.1}%; RSS/node median {:.1} MiB; backend {:.1} req/s (fleet); load {:?} -> {:?}; leadership changes {:?}",
        cost.cpu_percent_per_node.as_ref().map_or(f64::NAN, |s| s.median),
        cost.cpu_percent_per_node.as_ref().map_or(f64::NAN, |s| s.max),
        cost.cpu_percent_fleet.unwrap_or(f64::NAN),
        cost.rss_mib_per_node.as_ref().map_or(f64::NAN, |s| s.median),
        cost.backend_requests_per_s_fleet.unwrap_or(f64::NAN),
        cost.loadavg_start,
        cost.loadavg_end,
        cost.leadership_changes_during_idle,
    );
    if let Some(dead) = nodes.iter().find(|(_, pid)| !pid_alive(*pid)) {
        bail!(
            "node {} (pid {}) exited during the idle window",
            dead.0,
            dead.1
        );
    }

    if args.trials == 0 {
        return Ok(());
    }
    let fargs = FailoverArgs {
        backend: cost.backend,
        trials: args.trials,
        nodes: cost.nodes,
        dir: Some(PathBuf::from(&cost.dir)),
        config: None,
        lease_ttl: args.lease_ttl_ms,
        stepdown: false,
        settle: args.settle_ms,
        trial_timeout: args.trial_timeout_ms,
        out: None,
    };
    println!("{} kill -9 trials of the leader", args.trials);
    let trials_loadavg_start = loadavg();
    let trials_machine0 = machine_cpu();
    let (trials, outcome, client_violations) = failover::trials_on(&fargs, state).await;
    let trials_machine1 = machine_cpu();
    let trials_loadavg_end = loadavg();
    let ledger_violations = ledger_violations(state).await.ok();
    let failover_ms: Vec<f64> = trials.iter().map(|t| t.failover_ms).collect();
    let detect_ms: Vec<f64> = trials.iter().map(|t| t.detect_ms).collect();
    let per_election: Vec<f64> = trials
        .iter()
        .filter_map(|t| t.backend_requests_per_election.map(|r| r as f64))
        .collect();
    let election = ElectionCost {
        trials_requested: args.trials,
        loadavg_start: trials_loadavg_start,
        loadavg_end: trials_loadavg_end,
        machine_busy_cores: busy_cores(trials_machine0, trials_machine1),
        failover_ms: Summary::of(&failover_ms),
        detect_ms: Summary::of(&detect_ms),
        backend_requests_per_election: Summary::of(&per_election),
        client_violations,
        ledger_violations,
        trials,
        error: outcome.as_ref().err().map(|e| format!("{e:#}")),
    };
    if let Some(s) = &election.failover_ms {
        println!(
            "election after kill -9 ({} N={}, resource clock, ms): n={} p50={:.1} p99={:.1} max={:.1}",
            cost.backend, cost.nodes, s.n, s.median, s.p99, s.max
        );
    }
    cost.election = Some(election);
    Ok(())
}

fn fmt(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.decimals$}"),
        _ => "–".into(),
    }
}

/// The markdown table, one row per fleet.
fn summary_table(fleets: &[FleetCost]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| backend | N | CPU/node median % | CPU/node max % | fleet CPU % | etcd servers CPU % | RSS/node median MiB | RSS/node max MiB | backend req/s (fleet) | req/s/node median | req/s/node max | election p50 ms | election p99 ms | trials | leader changes at idle | load avg start → end | machine busy cores (other) | machine busy cores, trials | error |"
    );
    let _ = writeln!(
        t,
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|--:|---|"
    );
    for f in fleets {
        let cpu = f.cpu_percent_per_node.as_ref();
        let rss = f.rss_mib_per_node.as_ref();
        let req = f.backend_requests_per_s_per_node.as_ref();
        let el = f.election.as_ref().and_then(|e| e.failover_ms.as_ref());
        let load = match (f.loadavg_start, f.loadavg_end) {
            (Some(a), Some(b)) => format!("{:.2} → {:.2}", a[0], b[0]),
            _ => "–".into(),
        };
        let error = f
            .error
            .iter()
            .chain(f.election.iter().flat_map(|e| e.error.iter()))
            .map(|e| e.replace('|', "/"))
            .collect::<Vec<_>>()
            .join("; ");
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} |",
            f.backend,
            f.nodes,
            fmt(cpu.map(|s| s.median), 2),
            fmt(cpu.map(|s| s.max), 2),
            fmt(f.cpu_percent_fleet, 1),
            fmt(f.backend_servers_cpu_percent, 1),
            fmt(rss.map(|s| s.median), 1),
            fmt(rss.map(|s| s.max), 1),
            fmt(f.backend_requests_per_s_fleet, 1),
            fmt(req.map(|s| s.median), 2),
            fmt(req.map(|s| s.max), 1),
            fmt(el.map(|s| s.median), 1),
            fmt(el.map(|s| s.p99), 1),
            el.map_or_else(
                || "0".to_owned(),
                |s| format!("{}/{}", s.n, f.election.as_ref().map_or(0, |e| e.trials_requested))
            ),
            f.leadership_changes_during_idle
                .map_or_else(|| "–".to_owned(), |c| c.to_string()),
            load,
            fmt(f.machine_busy_cores, 2),
            fmt(f.other_busy_cores, 2),
            fmt(f.election.as_ref().and_then(|e| e.machine_busy_cores), 2),
            if error.is_empty() { "" } else { &error },
        );
    }
    t
}

/// A plotted value at one N and its cross (the max or the p99), if any.
type Point = (f64, Option<f64>);
/// Per backend: (N, value, cross).
type Series = BTreeMap<String, Vec<(f64, f64, Option<f64>)>>;

fn write_outputs(
    args: &CostArgs,
    machine: &serde_json::Value,
    started_at: u64,
    fleets: &[FleetCost],
) -> anyhow::Result<()> {
    let out = &args.out;
    let report = serde_json::json!({
        "bench": "cost",
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "started_at_unix_ms": started_at,
        "finished_at_unix_ms": unix_ms(),
        "machine": machine,
        "args": {
            "backends": args.backends.iter().map(|b| b.as_str()).collect::<Vec<_>>(),
            "nodes": args.nodes,
            "idle_ms": args.idle_ms,
            "warmup_ms": args.warmup_ms,
            "trials": args.trials,
            "settle_ms": args.settle_ms,
            "trial_timeout_ms": args.trial_timeout_ms,
            "start_timeout_ms": args.start_timeout_ms,
            "lease_ttl_ms": args.lease_ttl_ms,
        },
        "measure": {
            "cpu": "utime+stime of each node process (/proc/<pid>/stat) over the idle window, % of one core",
            "memory": "VmRSS (/proc/<pid>/status) at the end of the idle window, MiB",
            "backend_requests": "baton_backend_requests_total summed over ops, scraped from /metrics before and after the window (etcd: requests to etcd; raft: peer RPCs sent); a node answering /status with no such series sent none (a counter is exported from its first increment)",
            "election": "kill -9 of the leader -> first committed_at of op='next' under the new (token, holder) - last one under the old, baton.fence_log (PostgreSQL clock_timestamp()); p99 nearest rank",
            "load": "no client load during the idle window; a sequential POST /next client during the kill trials only",
        },
        "fleets": fleets,
    });
    let json = out.join("cost.json");
    std::fs::write(&json, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", json.display()))?;

    // One SVG per metric: x = N, one line per backend (× marks the max or the p99 where given).
    let series = |f: &dyn Fn(&FleetCost) -> Option<Point>| -> Series {
        let mut s = Series::new();
        for fc in fleets {
            if let Some((y, y2)) = f(fc) {
                s.entry(fc.backend.to_string())
                    .or_default()
                    .push((fc.nodes as f64, y, y2));
            }
        }
        s
    };
    let plots: [(&str, &str, &str, Series); 6] = [
        (
            "idle-cpu-per-node.svg",
            "Idle CPU per node (median; × = max)",
            "% of one core",
            series(&|f| {
                f.cpu_percent_per_node
                    .as_ref()
                    .map(|s| (s.median, Some(s.max)))
            }),
        ),
        (
            "idle-cpu-fleet.svg",
            "Idle CPU of the whole fleet (nodes only)",
            "% of one core",
            series(&|f| f.cpu_percent_fleet.map(|v| (v, None))),
        ),
        (
            "rss-per-node.svg",
            "Memory per node, VmRSS (median; × = max)",
            "MiB",
            series(&|f| f.rss_mib_per_node.as_ref().map(|s| (s.median, Some(s.max)))),
        ),
        (
            "backend-requests-fleet.svg",
            "Backend requests at idle, whole fleet (etcd: to etcd; raft: peer RPCs)",
            "requests / s",
            series(&|f| f.backend_requests_per_s_fleet.map(|v| (v, None))),
        ),
        (
            "backend-requests-per-node.svg",
            "Backend requests at idle per node (median; × = max)",
            "requests / s",
            series(&|f| {
                f.backend_requests_per_s_per_node
                    .as_ref()
                    .map(|s| (s.median, Some(s.max)))
            }),
        ),
        (
            "election-latency.svg",
            "kill -9 of the leader → new leader's first fenced write (p50; × = p99)",
            "ms (resource clock)",
            series(&|f| {
                f.election
                    .as_ref()?
                    .failover_ms
                    .as_ref()
                    .map(|s| (s.median, Some(s.p99)))
            }),
        ),
    ];
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# bench cost: idle cost and election latency against fleet size\n"
    );
    let _ = writeln!(
        md,
        "Command: `{}`  \ncommit `{}`, {} build; machine: {} CPUs ({}), kernel {}.\n",
        report["command"].as_str().unwrap_or(""),
        machine["commit"].as_str().unwrap_or("?"),
        machine["build"].as_str().unwrap_or("?"),
        machine["nproc"],
        machine["cpu"].as_str().unwrap_or("?"),
        machine["kernel"].as_str().unwrap_or("?"),
    );
    let _ = writeln!(
        md,
        "Per fleet: fresh fleet, every node answering and one leading, {} ms warm-up, then an idle window of {} ms with no client load. \
CPU = utime+stime of each node process over the window (% of one core); the etcd members are shown apart (raft has no server). \
RSS = VmRSS at the end of the window. Backend requests = `baton_backend_requests_total` over the window (etcd: requests to etcd; raft: peer RPCs sent). \
Election = {} kill -9 trials of the leader on the same fleet afterwards (`baton bench failover`'s loop, a sequential `POST /next` client running): \
kill → the new leader's first `next` write accepted by the fence, on PostgreSQL's clock; p99 is nearest rank (with < 100 trials, the max). \
\"machine busy cores\" is the whole machine over the idle window (/proc/stat); \"other\" is what is left after the fleet's nodes and etcd members (PostgreSQL, this bench, anything else running; ±0.05 is tick rounding); \"trials\" is the whole machine over the kill trials.\n",
        args.warmup_ms, args.idle_ms, args.trials
    );
    md.push_str(&summary_table(fleets));
    md.push('\n');
    for (file, title, y_desc, s) in &plots {
        plot_vs_nodes(&out.join(file), title, y_desc, s)
            .with_context(|| format!("plotting {file}"))?;
        let _ = writeln!(md, "![{title}]({file})\n");
    }
    let summary = out.join("summary.md");
    std::fs::write(&summary, md).with_context(|| format!("writing {}", summary.display()))?;
    Ok(())
}

/// A y-against-N plot, one line per backend through (N, y), crosses at (N, y2) where given.
/// (`plots::xy` draws a drift-bound reference line at x = 0, wrong here; the colors are shared.)
fn plot_vs_nodes(path: &Path, title: &str, y_desc: &str, series: &Series) -> anyhow::Result<()> {
    let x_max = series.values().flatten().map(|p| p.0).fold(0.0, f64::max);
    plots::lines(
        path,
        &plots::Axes {
            title,
            x_desc: "nodes in the fleet (N)",
            y_desc,
            x_range: (0.0, x_max * 1.08 + 1.0),
            marker: None,
        },
        series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::parse_loadavg;

    #[test]
    fn proc_parsers_read_the_right_fields() {
        // comm "(a) b (c)" holds spaces and parentheses; utime 1234, stime 567 (fields 14, 15);
        // field 13 (cmajflt) 999 and field 16 (cutime) 888 must not be picked up.
        let stat = "4242 ((a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 999 1234 567 888 0 20 0 \
                    8 0 12345 1000000 500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(1234 + 567));
        assert_eq!(parse_stat_cpu_ticks("4242 (truncated) S 1 2"), None);
        // The real one of this process parses too.
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(parse_stat_cpu_ticks(&own).is_some());

        let status = "Name:\tbaton\nVmPeak:\t  999999 kB\nVmHWM:\t   55555 kB\nVmRSS:\t   25864 kB\nRssAnon:\t  11111 kB\n";
        assert_eq!(parse_status_rss_kib(status), Some(25864));
        assert_eq!(parse_status_rss_kib("Name:\tkthreadd\n"), None);
        assert_eq!(parse_status_rss_kib("VmRSS:\t 12 MB\n"), None);

        assert_eq!(
            parse_loadavg("0.88 1.68 1.72 1/111 18572\n"),
            Some([0.88, 1.68, 1.72])
        );
    }
}
