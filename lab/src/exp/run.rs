//! One run of an experiment: a fresh fleet in a scratch directory, open-loop load on `POST /next`,
//! the fault schedule applied while the load runs, then the checker over the ledger and the client
//! history, and everything the results need. The fleet is always stopped and its directory
//! removed (unless `--keep`), also on error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Context};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::time::Instant;

use super::analysis::{
    self, Clock0, Election, RejectionBrief, SeqSteps, StaleEvidence, Transition,
};
use super::faults::{self, FaultRecord, Occurrence};
use super::nemesis::{self, NemesisReport};
use super::spec::{ExpSpec, Expect, FaultKind, RunPlan};
use crate::check::{self, CheckInput, Violation};
use crate::fleet::client::NodeClient;
use crate::fleet::meter::RequestMeter;
use crate::fleet::{self, FleetSpec, FleetState};
use crate::load::{self, LoadReport, LoadSpec, Outcome};
use crate::report::Summary;
use crate::unix_ms;
use baton::backends::BackendKind;
use baton::config::{Fencing, NodeConfig};

/// Where and how a run executes.
#[derive(Clone, Debug)]
pub struct RunOpts {
    /// Scratch root; the run's fleet lives in `<state_root>/<label>`.
    pub state_root: PathBuf,
    /// Keep the fleet directory (logs, traces) after the run.
    pub keep: bool,
}

/// The verdict of the checker, as stored.
#[derive(Clone, Debug, Serialize)]
pub struct VerdictOut {
    pub line: String,
    pub pass: bool,
    pub writes: usize,
    pub tokens: usize,
    pub acked: usize,
    pub rejections: usize,
    pub violations: Vec<Violation>,
    pub interleavings: usize,
    /// Acknowledged IDs in no ledger row of their token (lost, e.g. by a promoted standby).
    pub acked_missing: usize,
    /// Acknowledgements that repeat an already acknowledged seq (IDs issued twice).
    pub acked_repeats: usize,
}

/// One leader's span of accepted writes, in run time.
#[derive(Clone, Debug, Serialize)]
pub struct IntervalOut {
    pub token: i64,
    pub holder: String,
    pub first_s: f64,
    pub last_s: f64,
    pub writes: usize,
    pub rejected: usize,
    /// Dark time to the next leader's first write (negative: overlap), ms.
    pub dark_after_ms: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FaultOut {
    #[serde(flatten)]
    pub record: FaultRecord,
    pub applied_s: f64,
    pub healed_s: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RequestCounts {
    /// `baton_backend_requests_total` summed over nodes during the load, by `op`.
    pub by_op: BTreeMap<String, u64>,
    pub total: u64,
    /// Won elections during the load.
    pub elections: usize,
    /// Requests per election (all ops / only campaign-type ops).
    pub per_election: Option<f64>,
    pub campaign_ops_per_election: Option<f64>,
}

/// Everything one run produced (written as `<label>.json`).
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    pub experiment: String,
    pub label: String,
    pub backend: BackendKind,
    /// The effective lease TTL of the nodes.
    pub lease_ttl_ms: u64,
    pub ttl_swept: bool,
    pub fencing: Fencing,
    /// Every node's clock drift, and the clock-rate error bound they were configured with.
    pub clock_drift: f64,
    /// Every node's libfaketime clock rate (`None`: the real clock), and each node's rate as
    /// observed through its `/status` after its restart under it.
    pub faketime_rate: Option<f64>,
    pub faketime_observed_rates: Vec<f64>,
    pub clock_rate_error: f64,
    /// Every node's `[sequencer] mode` (`durable`, `window`).
    pub sequencer_mode: String,
    /// Every node's `[detector] kind` (`lease`, `swim`).
    #[serde(default)]
    pub detector: baton::config::DetectorKind,
    /// The CPU neighbour beside the load (`None`: none).
    #[serde(default)]
    pub neighbour: Option<super::spec::NeighbourCfg>,
    /// `kill -9` of the leader → the first survivor's confirmation of it (actor traces,
    /// `peer-dead`), ms: the failure detector's detection latency (`None` with the lease).
    #[serde(default)]
    pub detection_ms: Option<Summary>,
    /// The detector's counters summed over every node process during the load:
    /// `baton_detector_confirmed_dead_total` (each observer's confirmations) and
    /// `baton_detector_declared_self_dead_total` (live nodes that learned the others had
    /// declared them dead: false positives they survived).
    #[serde(default)]
    pub detector_counts: BTreeMap<String, u64>,
    /// UDP datagrams per node per second during the load, from each node's namespace
    /// (`netns` runs; only the detector speaks UDP there).
    #[serde(default)]
    pub detector_packets: Option<DetectorPackets>,
    /// `GET /read`s answered, by the mode that answered, with the stale ones counted.
    pub reads: BTreeMap<String, check::reads::ModeCounts>,
    pub nodes: usize,
    pub workset_rows: u64,
    pub seed: u64,
    pub quick: bool,
    pub duration_s: f64,
    pub started_unix_ms: u64,
    pub wall_s: f64,
    pub config: serde_json::Value,
    pub clock0: Clock0,
    pub load: load::Summary,
    pub faults: Vec<FaultOut>,
    pub restarts: Vec<(String, f64)>,
    pub verdict: VerdictOut,
    pub expect: Expect,
    pub expectation_met: bool,
    pub timeline: Vec<IntervalOut>,
    pub transitions: Vec<Transition>,
    /// Kill → new leader, from the ledger: last old `next` → first new `next`, ms.
    pub failover_ms: Option<Summary>,
    /// Step-down dark time, same measure, ms.
    pub stepdown_dark_ms: Option<Summary>,
    /// Leadership changes nothing justified: no fault, or a pause / partition shorter than the TTL.
    pub false_failovers: usize,
    pub elections: Vec<Election>,
    pub wins_per_node: BTreeMap<String, usize>,
    /// `{winners: rounds}` between consecutive kills / step-downs.
    pub winners_per_round: BTreeMap<usize, usize>,
    pub campaign_ms: Option<Summary>,
    /// Seat vacant → won (the winner's view), ms: the election without the queueing.
    #[serde(default)]
    pub election_ms: Option<Summary>,
    /// Kill → the successor's `won` (actor traces, monotonic clock), ms.
    pub kill_to_won_ms: Option<Summary>,
    pub stale: Vec<StaleEvidence>,
    pub rejections_total: usize,
    /// The first refusals (at most 50).
    pub rejections: Vec<RejectionBrief>,
    pub seq_steps: SeqSteps,
    pub backend_requests: RequestCounts,
    pub workset_seed_ms: Option<f64>,
    /// The nemesis's faults by kind, availability, acknowledged IDs (nemesis runs only).
    pub nemesis: Option<NemesisReport>,
    pub error: Option<String>,
    /// Series for the plots and CSVs (not serialized into the JSON).
    #[serde(skip)]
    pub series: Series,
}

/// The failure detector's datagrams during the load, per node and second.
#[derive(Clone, Debug, Serialize)]
pub struct DetectorPackets {
    pub sent_per_node_s: f64,
    pub received_per_node_s: f64,
    /// The busiest node's sent datagrams per second.
    pub max_sent_node_s: f64,
    /// Namespaces measured (one per node).
    pub nodes: usize,
}

impl DetectorPackets {
    /// From each node namespace's `(in, out)` UDP counters before and after `secs` of load.
    pub fn of(before: &[(u64, u64)], after: &[(u64, u64)], secs: f64) -> Option<DetectorPackets> {
        if before.len() != after.len() || before.is_empty() || secs <= 0.0 {
            return None;
        }
        let n = before.len() as f64;
        let deltas: Vec<(f64, f64)> = before
            .iter()
            .zip(after)
            .map(|(b, a)| {
                (
                    a.0.saturating_sub(b.0) as f64 / secs,
                    a.1.saturating_sub(b.1) as f64 / secs,
                )
            })
            .collect();
        Some(DetectorPackets {
            sent_per_node_s: deltas.iter().map(|d| d.1).sum::<f64>() / n,
            received_per_node_s: deltas.iter().map(|d| d.0).sum::<f64>() / n,
            max_sent_node_s: deltas.iter().map(|d| d.1).fold(0.0, f64::max),
            nodes: before.len(),
        })
    }
}

/// Every node namespace's UDP `(in, out)` counters, in node order (`None` without netns or
/// when one cannot be read).
fn udp_counters(state: &FleetState) -> Option<Vec<(u64, u64)>> {
    let net = state.netns.as_ref()?;
    state
        .nodes
        .iter()
        .map(|n| crate::fleet::netns::udp_datagrams(net.ns_of(&n.id)?).ok())
        .collect()
}

#[derive(Clone, Debug, Default)]
pub struct Series {
    pub acting: Vec<(f64, i32)>,
    /// (run time, seq_hi, token) of `next` rows.
    pub seq: Vec<(f64, i64, i64)>,
    /// Per second of the load: (second, ok, rejected, unknown).
    pub client: Vec<(u64, u64, u64, u64)>,
}

/// The node config the run uses: `config/<backend>.toml` with the TTL override (renewal at TTL/4,
/// so the usable lease holds three renewals and slack, retries below that) and the spec's raft
/// election timeout.
pub fn base_config(spec: &ExpSpec, plan: &RunPlan) -> anyhow::Result<NodeConfig> {
    let mut cfg = match fleet::default_base_config(plan.backend) {
        Some(p) => NodeConfig::from_file(&p)?,
        None => NodeConfig::for_backend(plan.backend),
    };
    cfg.backend = plan.backend;
    cfg.fencing = plan.fencing;
    if let Some(ttl) = plan.ttl_ms {
        fleet::override_lease_ttl(&mut cfg, ttl);
    }
    if let Some(d) = plan.clock_drift.or(spec.clock_drift) {
        cfg.clock_drift = d;
    }
    if let Some(b) = spec.clock_rate_error {
        cfg.clock_rate_error = b;
    }
    if let Some(mode) = plan.sequencer_mode {
        cfg.sequencer.mode = mode;
    }
    if let Some(ids) = spec.window_ids {
        cfg.sequencer.window_ids = ids;
    }
    if let Some(kind) = plan.detector {
        cfg.detector.kind = kind;
    }
    // The fleet fills in each node's detector peers and bind address; checked here with a
    // placeholder, as `fleet up` checks its base config.
    let mut check = cfg.clone();
    if check.detector.kind == baton::config::DetectorKind::Swim && check.detector.peers.is_empty() {
        check.detector.bind = Some("127.0.0.1:0".parse()?);
    }
    check.validate().context("experiment node config")?;
    if plan.backend == BackendKind::Raft {
        if let Some(et) = &spec.election_timeout {
            cfg.election_timeout_ms = et.clone();
        }
    }
    Ok(cfg)
}

/// Readers that read from every node regardless of who leads (a client whose idea of the leader
/// is stale): `per_node` sequential readers per node and mode. Each returns its reads as history
/// records (`kind = read`), answered or not.
fn start_read_probes(
    probe: &crate::exp::spec::ReadProbe,
    addrs: &[(String, String)],
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<load::Op>>> {
    let mut tasks = Vec::new();
    let mut next_id = 0u64;
    for (_, addr) in addrs {
        for mode in &probe.modes {
            for _ in 0..probe.per_node.max(1) {
                let (addr, mode, stop) = (addr.clone(), mode.clone(), stop.clone());
                let interval = Duration::from_millis(probe.interval_ms);
                let timeout = Duration::from_millis(probe.timeout_ms.max(1));
                let base = next_id << 32;
                next_id += 1;
                tasks.push(tokio::spawn(async move {
                    let client = NodeClient::new(timeout);
                    // `next`: an ID asked of every node, as a client with a stale leader cache
                    // would; the answer is an acknowledged ID like the load's.
                    let asks_id = mode == "next";
                    let path = format!("/read?mode={mode}");
                    let mut ops = Vec::new();
                    let mut i = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let invoke_ns = baton::clock::monotonic_ns();
                        let reply = if asks_id {
                            client.post(&addr, "/next").await
                        } else {
                            client.get(&addr, &path).await
                        };
                        let complete_ns = baton::clock::monotonic_ns();
                        let mut op = load::Op {
                            id: base + i,
                            conn: (base >> 32) as u32,
                            sched_ns: invoke_ns,
                            invoke_ns,
                            complete_ns,
                            outcome: load::Outcome::Rejected,
                            node: addr.clone(),
                            status: None,
                            token: None,
                            seq: None,
                            attempts: 1,
                            error: None,
                            kind: (!asks_id).then(|| "read".into()),
                            mode: None,
                            fell_back: None,
                            shard: None,
                        };
                        i += 1;
                        if let Ok(r) = reply {
                            op.status = Some(r.status.as_u16());
                            if r.status == 200 {
                                let v = r.json();
                                op.outcome = load::Outcome::Ok;
                                op.token = v["token"].as_i64();
                                op.seq = v["seq"].as_i64();
                                op.mode = v["mode"].as_str().map(str::to_owned);
                                op.fell_back = v["fell_back"].as_bool();
                            }
                        }
                        ops.push(op);
                        tokio::time::sleep(interval).await;
                    }
                    ops
                }));
            }
        }
    }
    tasks
}

fn node_addrs(state: &FleetState) -> Vec<(String, String)> {
    state
        .nodes
        .iter()
        .map(|n| (n.id.clone(), n.http_addr.clone()))
        .collect()
}

async fn wait_leader(state: &FleetState, within: Duration) -> anyhow::Result<(String, i64)> {
    fleet::current_leader(state, within)
        .await
        .map(|(node, token)| (node.id, token))
        .context("waiting for the fleet's first leader")
}

async fn admin(state: &FleetState) -> anyhow::Result<tokio_postgres::Client> {
    let (client, conn) =
        tokio_postgres::connect(&state.postgres.admin_url(), tokio_postgres::NoTls)
            .await
            .context("connecting to the fleet's PostgreSQL")?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// Seeds `rows` pending jobs in one statement, as the fleet's admin; returns how long it took.
async fn seed_workset(state: &FleetState, rows: u64) -> anyhow::Result<f64> {
    let db = admin(state).await?;
    let t = std::time::Instant::now();
    db.batch_execute("SET statement_timeout = 0").await?;
    db.execute(
        "INSERT INTO baton.jobs (job_id, scheduled_at) SELECT g, now() FROM generate_series(1, $1::bigint) g ON CONFLICT DO NOTHING",
        &[&(rows as i64)],
    )
    .await
    .context("seeding baton.jobs")?;
    // Settle the table before measuring: otherwise an insert-triggered autovacuum and the
    // checkpoint of ~1 GB of dirty pages run during the measurement and compete for the 2 cores.
    db.batch_execute("VACUUM (ANALYZE) baton.jobs").await?;
    db.batch_execute("CHECKPOINT").await?;
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

/// The Redis layout a run's fleet gets: the spec's for the redis backends, none otherwise.
fn fspec_topology(spec: &ExpSpec, backend: BackendKind) -> crate::fleet::RedisTopology {
    if matches!(backend, BackendKind::Redis | BackendKind::RedisNaive) {
        spec.redis_topology
    } else {
        Default::default()
    }
}

/// Runs one plan end to end. The fleet is stopped and (without `keep`) removed whatever happens.
pub async fn run_one(
    spec: &ExpSpec,
    plan: &RunPlan,
    quick: bool,
    opts: &RunOpts,
) -> anyhow::Result<RunResult> {
    let dir = opts.state_root.join(&plan.label);
    fleet::prepare_scratch_dir(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let cfg = base_config(spec, plan)?;
    let base_path = dir.join("base.toml");
    std::fs::write(&base_path, toml::to_string(&cfg)?)?;
    let nodes = spec.nodes;
    let fspec = FleetSpec {
        nodes,
        backend: plan.backend,
        dir: dir.clone(),
        base_config: Some(base_path),
        fencing: plan.fencing,
        lease_ttl_ms: Some(cfg.lease_ttl_ms),
        node_args: Vec::new(),
        shards: 1,
        resource_standby: spec.resource_standby,
        redis_topology: fspec_topology(spec, plan.backend),
    };
    let up = if spec.netns {
        fleet::up_netns(&fspec).await
    } else {
        fleet::up(&fspec).await
    };
    let state = up.context("starting the fleet")?;
    let shared = Arc::new(Mutex::new(state));
    let outcome = tokio::select! {
        r = drive(spec, plan, quick, &cfg, shared.clone(), &dir) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted (Ctrl-C)")),
    };
    let state = shared.lock().unwrap_or_else(|p| p.into_inner()).clone();
    tokio::task::spawn_blocking(move || state.down())
        .await
        .context("stopping the fleet")?;
    if !opts.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome
}

async fn drive(
    spec: &ExpSpec,
    plan: &RunPlan,
    quick: bool,
    cfg: &NodeConfig,
    state: Arc<Mutex<FleetState>>,
    dir: &Path,
) -> anyhow::Result<RunResult> {
    let started_unix_ms = unix_ms();
    let t_start = std::time::Instant::now();
    let mut snapshot = state.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let node_ids: Vec<String> = snapshot.nodes.iter().map(|n| n.id.clone()).collect();
    let addrs = node_addrs(&snapshot);
    wait_leader(&snapshot, Duration::from_secs(60)).await?;
    let faketime_observed = match plan.faketime_rate {
        Some(rate) => {
            let rates = nemesis::restart_all_under_faketime(&state, rate).await?;
            // New pids: the old snapshot would find every node dead.
            snapshot = state.lock().unwrap_or_else(|p| p.into_inner()).clone();
            rates
        }
        None => Vec::new(),
    };
    let workset_seed_ms = if plan.workset_rows > 0 {
        Some(seed_workset(&snapshot, plan.workset_rows).await?)
    } else {
        None
    };
    // A second of steady state before the clock starts.
    tokio::time::sleep(Duration::from_secs(1)).await;
    wait_leader(&snapshot, Duration::from_secs(60)).await?;

    let ttl = cfg.lease_ttl_ms;
    let duration = spec.duration.eval(ttl);
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let schedule: Vec<Occurrence> = faults::schedule(&spec.faults, ttl, duration, &mut rng);
    let nemesis_steps = match &spec.nemesis {
        Some(n) => {
            let seed = nemesis::seed_for(spec.seed, plan.backend);
            let mut nrng = StdRng::seed_from_u64(seed);
            // A Sentinel failover needs the fleet behind Sentinel: off the mix otherwise (a
            // spec that sweeps backends keeps one mix for all).
            let mut n = n.clone();
            if fspec_topology(spec, plan.backend) != crate::fleet::RedisTopology::Sentinel {
                n.mix.remove(&FaultKind::SentinelFailover);
            }
            if spec.resource_standby.is_none() {
                n.mix.remove(&FaultKind::PgPromote);
            }
            Some(nemesis::draw(&n, plan.backend, spec.netns, ttl, &mut nrng)?)
        }
        None => None,
    };
    let mut lspec = LoadSpec::new(
        addrs.iter().map(|a| a.1.clone()).collect(),
        spec.load.rate,
        duration,
    );
    lspec.connections = spec.load.connections;
    lspec.timeout = Duration::from_millis(spec.load.timeout_ms);
    let stop_load = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if nemesis_steps.is_some() {
        lspec.stop = Some(stop_load.clone());
    }
    lspec.read_fraction = spec.load.read_fraction;
    lspec.read_modes = spec.load.read_modes.clone();
    // Seeded pacing offset: where the load's slots fall relative to the faults.
    let offset = Duration::from_micros(rng.gen_range(0..(1e6 / spec.load.rate).max(1.0) as u64));
    tokio::time::sleep(offset).await;

    let client = NodeClient::new(Duration::from_secs(2));
    let mut meter = RequestMeter::default();
    meter.scrape(&client, &snapshot).await;
    meter.baseline();
    let neighbour = match plan.neighbour {
        // In a session of its own: it competes with every process here, not only with this one.
        Some(n) => Some(crate::load::neighbour::Neighbour::spawn(
            n.cpu_percent,
            n.slice_ms,
            true,
        )?),
        None => None,
    };
    let udp_before = udp_counters(&snapshot);

    let clock = Clock0::now();
    let start = Instant::now();
    let load_task = tokio::spawn(load::run(lspec));
    let probe_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probes = spec
        .read_probe
        .as_ref()
        .map(|p| start_read_probes(p, &addrs, probe_stop.clone()))
        .unwrap_or_default();
    let mut records: Vec<FaultRecord> = Vec::new();
    let mut restarts = Vec::new();
    let mut errors = Vec::new();
    if let Some(steps) = &nemesis_steps {
        let (r, e) = nemesis::run_steps(&state, steps, start, start + duration).await;
        records = r;
        errors = e;
        // Every fault has healed: settle, then end the load (`duration` is a bound, not a goal).
        tokio::time::sleep(spec.settle.eval(ttl)).await;
        stop_load.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    for occ in &schedule {
        tokio::time::sleep_until(start + occ.at).await;
        let scheduled_ms = occ.at.as_secs_f64() * 1000.0;
        let r = match occ.kind {
            FaultKind::KillLeader => {
                let now = state.lock().unwrap_or_else(|p| p.into_inner()).clone();
                meter.scrape(&client, &now).await;
                faults::kill_leader(&state, scheduled_ms).await
            }
            FaultKind::PauseLeader => {
                faults::pause_leader(&state, occ.length.unwrap_or_default(), scheduled_ms).await
            }
            FaultKind::PartitionLeader => {
                faults::partition_leader(&state, occ.length.unwrap_or_default(), scheduled_ms).await
            }
            FaultKind::Stepdown => faults::stepdown_leader(&state, scheduled_ms).await,
            // The nemesis's kinds, scheduled: one step with the occurrence's length.
            _ => nemesis::apply(&state, &nemesis::Step::of(occ), scheduled_ms).await,
        };
        match r {
            Ok(rec) => {
                if let (FaultKind::KillLeader, Some(after)) = (occ.kind, occ.restart_after) {
                    let (st, node) = (state.clone(), rec.node.clone());
                    restarts.push(tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        let at = faults::restart(&st, &node).await?;
                        Ok::<_, anyhow::Error>((node, at))
                    }));
                }
                records.push(rec);
            }
            Err(e) => errors.push(format!(
                "{} at {scheduled_ms:.0} ms: {e:#}",
                occ.kind.as_str()
            )),
        }
    }
    let report: LoadReport = load_task.await.context("load task")??;
    let load_s = start.elapsed().as_secs_f64();
    drop(neighbour);
    let udp_after = udp_counters(&state.lock().unwrap_or_else(|p| p.into_inner()).clone());
    probe_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut probe_ops = Vec::new();
    for p in probes {
        probe_ops.extend(p.await.context("read probe")?);
    }
    if !probe_ops.is_empty() {
        // Kept with the fleet's directory (`baton exp --keep`), for `baton check --history`.
        let _ = load::write_history(&dir.join("probe-history.jsonl"), &probe_ops);
        let _ = load::write_history(&dir.join("load-history.jsonl"), &report.ops);
    }
    let mut restarted = Vec::new();
    for h in restarts {
        match h.await {
            Ok(Ok((node, at))) => restarted.push((node, clock.mono_s(at))),
            Ok(Err(e)) => errors.push(format!("restart: {e:#}")),
            Err(e) => errors.push(format!("restart task: {e}")),
        }
    }
    let snapshot = state.lock().unwrap_or_else(|p| p.into_inner()).clone();
    meter.scrape(&client, &snapshot).await;
    tokio::time::sleep(spec.settle.eval(ttl)).await;

    // The ledger, the refusals, and the client's acknowledgements: the checker's input.
    let db = admin(&snapshot).await?;
    let mut input: CheckInput = check::load::read(&db, None).await?;
    input.acks = check::load::acks_from_ops(&format!("{}.history", plan.label), &report.ops);
    // The probe's `POST /next`s (mode `next`) are acknowledged IDs like the load's.
    input.acks.extend(check::load::acks_from_ops(
        &format!("{}.probe", plan.label),
        &probe_ops,
    ));
    input.reads = check::load::reads_from_ops(&format!("{}.history", plan.label), &report.ops);
    input.reads.extend(check::load::reads_from_ops(
        &format!("{}.probe", plan.label),
        &probe_ops,
    ));
    // The resource's own record of accepted tokens (PostgreSQL runs on this machine: its clock
    // maps onto the monotonic one through the pair of readings taken at the start).
    input.accepted =
        check::reads::accepted_from_ledger(&input.ledger, clock.mono0_ns, clock.wall0_us);
    let verdict = check::run(&input);
    let events = analysis::read_traces(&dir.join("nodes"));

    let records_copy = records.clone();
    let result = assemble(
        spec,
        plan,
        quick,
        cfg,
        &input,
        &verdict,
        &report,
        records,
        restarted,
        &events,
        &clock,
        &node_ids,
        meter,
        started_unix_ms,
    );
    let mut result = result;
    result.faketime_observed_rates = faketime_observed;
    if let (Some(b), Some(a)) = (&udp_before, &udp_after) {
        result.detector_packets = DetectorPackets::of(b, a, load_s);
    }
    if let (Some(n), Some(steps)) = (&spec.nemesis, &nemesis_steps) {
        let rep = nemesis::report(
            n,
            nemesis::seed_for(spec.seed, plan.backend),
            steps.len(),
            &records_copy,
            &result.transitions,
            &result.load,
            errors.len(),
        );
        // A run whose faults did not bite proves nothing, whatever the checker says.
        if !rep.enough_took_effect {
            result.expectation_met = false;
        }
        result.nemesis = Some(rep);
    }
    result.wall_s = t_start.elapsed().as_secs_f64();
    result.workset_seed_ms = workset_seed_ms;
    if !errors.is_empty() {
        result.error = Some(errors.join("; "));
    }
    Ok(result)
}

#[allow(clippy::too_many_arguments)]
fn assemble(
    spec: &ExpSpec,
    plan: &RunPlan,
    quick: bool,
    cfg: &NodeConfig,
    input: &CheckInput,
    verdict: &check::Verdict,
    report: &LoadReport,
    records: Vec<FaultRecord>,
    restarts: Vec<(String, f64)>,
    events: &[analysis::TraceEvent],
    clock: &Clock0,
    node_ids: &[String],
    meter: RequestMeter,
    started_unix_ms: u64,
) -> RunResult {
    let transitions = analysis::transitions(&input.ledger, &records, clock);
    let kills: Vec<f64> = transitions
        .iter()
        .filter(|t| t.cause_kind == Some(FaultKind::KillLeader))
        .map(|t| t.gap_ms)
        .collect();
    let stepdowns: Vec<f64> = transitions
        .iter()
        .filter(|t| t.cause_kind == Some(FaultKind::Stepdown))
        .map(|t| t.gap_ms)
        .collect();
    // Elections during the load window only (the fleet's first election is not part of it).
    let elections: Vec<Election> = analysis::elections(events, &records, clock)
        .into_iter()
        .filter(|e| e.won_s >= 0.0)
        .collect();
    let wins = analysis::wins_per_node(&elections, node_ids);
    let campaign: Vec<f64> = elections.iter().filter_map(|e| e.campaign_ms).collect();
    let election: Vec<f64> = elections.iter().filter_map(|e| e.election_ms).collect();
    let kill_to_won: Vec<f64> = elections.iter().filter_map(|e| e.after_fault_ms).collect();
    let detection = analysis::detections(events, &records);
    let stale = analysis::stale_evidence(input, &records, events, clock);
    let expect = spec.expectation(plan);
    let expectation_met = match expect {
        Expect::Pass => verdict.pass,
        Expect::Fail => !verdict.pass,
        Expect::Any => true,
    };
    let tl = &verdict.timeline;
    let timeline: Vec<IntervalOut> = tl
        .intervals
        .iter()
        .enumerate()
        .map(|(k, iv)| IntervalOut {
            token: iv.token,
            holder: iv.holder.clone(),
            first_s: clock.wall_s(iv.first_us),
            last_s: clock.wall_s(iv.last_us),
            writes: iv.writes,
            rejected: iv.rejected,
            dark_after_ms: tl
                .intervals
                .get(k + 1)
                .map(|n| (n.first_us - iv.last_us) as f64 / 1000.0),
        })
        .collect();
    let faults_out: Vec<FaultOut> = records
        .iter()
        .map(|r| FaultOut {
            applied_s: clock.mono_s(r.applied_at_mono_ns),
            healed_s: r.healed_at_mono_ns.map(|h| clock.mono_s(h)),
            record: r.clone(),
        })
        .collect();
    let mut by_op: BTreeMap<String, u64> = BTreeMap::new();
    for (op, v) in meter.total() {
        by_op.insert(op.clone(), v.round() as u64);
    }
    let total: u64 = by_op.values().sum();
    let campaign_ops: u64 = by_op
        .iter()
        // Election traffic: everything but lease upkeep (raft: appends and snapshots, its
        // heartbeats) and the leader look-ups `/status` makes.
        .filter(|(op, _)| {
            !(op.starts_with("keepalive")
                || op.starts_with("renew")
                || op.starts_with("read-")
                || matches!(op.as_str(), "leader" | "append" | "snapshot"))
        })
        .map(|(_, v)| *v)
        .sum();
    let n_el = elections.len();
    let backend_requests = RequestCounts {
        per_election: (n_el > 0 && total > 0).then(|| total as f64 / n_el as f64),
        campaign_ops_per_election: (n_el > 0 && total > 0)
            .then(|| campaign_ops as f64 / n_el as f64),
        by_op,
        total,
        elections: n_el,
    };
    // Per-second client outcomes.
    let mut per_sec: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
    for op in &report.ops {
        let s = op.sched_ns.saturating_sub(report.t0_ns) / 1_000_000_000;
        let e = per_sec.entry(s).or_default();
        match op.outcome {
            Outcome::Ok => e.0 += 1,
            Outcome::Rejected => e.1 += 1,
            Outcome::Unknown => e.2 += 1,
        }
    }
    let series = Series {
        acting: analysis::acting_steps(input, clock),
        seq: input
            .ledger
            .iter()
            .filter(|r| r.op == "next")
            .filter_map(|r| Some((clock.wall_s(r.committed_us), r.seq_hi?, r.token)))
            .collect(),
        client: per_sec
            .into_iter()
            .map(|(s, (a, b, c))| (s, a, b, c))
            .collect(),
    };
    RunResult {
        experiment: spec.name.clone(),
        label: plan.label.clone(),
        backend: plan.backend,
        lease_ttl_ms: cfg.lease_ttl_ms,
        ttl_swept: plan.ttl_ms.is_some(),
        fencing: plan.fencing,
        clock_drift: cfg.clock_drift,
        faketime_rate: plan.faketime_rate,
        faketime_observed_rates: Vec::new(),
        clock_rate_error: cfg.clock_rate_error,
        sequencer_mode: cfg.sequencer.mode.as_str().to_owned(),
        detector: cfg.detector.kind,
        neighbour: plan.neighbour,
        detection_ms: Summary::of(&detection),
        detector_counts: meter.detector_total(),
        detector_packets: None,
        reads: check::reads::stale_reads(input),
        nodes: node_ids.len(),
        workset_rows: plan.workset_rows,
        seed: plan.seed,
        quick,
        // A nemesis run ends its load early (see `stop_load`): report what ran.
        duration_s: if spec.nemesis.is_some() {
            report.elapsed.as_secs_f64()
        } else {
            report.spec.duration.as_secs_f64()
        },
        started_unix_ms,
        wall_s: 0.0,
        config: cfg.redacted_json(),
        clock0: *clock,
        load: report.summary(),
        faults: faults_out,
        restarts,
        verdict: VerdictOut {
            line: verdict.line(),
            pass: verdict.pass,
            writes: verdict.writes,
            tokens: verdict.tokens,
            acked: verdict.acked,
            rejections: verdict.rejections,
            violations: verdict.violations.clone(),
            interleavings: tl.interleavings.len(),
            acked_missing: check::acked_in_ledger::count_missing(input),
            acked_repeats: check::acked_unique::count_repeats(input),
        },
        expect,
        expectation_met,
        timeline,
        false_failovers: analysis::false_failovers(&transitions, &records, cfg.lease_ttl_ms),
        transitions,
        failover_ms: Summary::of(&kills),
        stepdown_dark_ms: Summary::of(&stepdowns),
        wins_per_node: wins,
        winners_per_round: analysis::winners_per_round(&elections, &records, clock),
        campaign_ms: Summary::of(&campaign),
        election_ms: Summary::of(&election),
        kill_to_won_ms: Summary::of(&kill_to_won),
        elections,
        stale,
        rejections_total: input.rejections.len(),
        rejections: input
            .rejections
            .iter()
            .take(50)
            .map(|r| RejectionBrief::of(r, clock))
            .collect(),
        seq_steps: analysis::seq_steps(&input.ledger),
        backend_requests,
        workset_seed_ms: None,
        nemesis: None,
        error: None,
        series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detector_packets_are_per_node_and_second() {
        let before = [(100, 200), (0, 0), (50, 60)];
        let after = [(300, 400), (100, 100), (50, 660)];
        let p = DetectorPackets::of(&before, &after, 2.0).unwrap();
        // Sent: (200 + 100 + 600) / 2 s / 3 nodes; received: (200 + 100 + 0) / 2 / 3.
        assert!((p.sent_per_node_s - 150.0).abs() < 1e-9, "{p:?}");
        assert!((p.received_per_node_s - 50.0).abs() < 1e-9, "{p:?}");
        assert!((p.max_sent_node_s - 300.0).abs() < 1e-9, "{p:?}");
        assert_eq!(p.nodes, 3);
        assert!(DetectorPackets::of(&before, &after[..2], 2.0).is_none());
        assert!(DetectorPackets::of(&before, &after, 0.0).is_none());
    }

    /// A swim run of the detector experiment gets a node config with the detector on (moved
    /// here from spec.rs's tests).
    #[test]
    fn a_swim_run_of_the_detector_experiment_turns_the_detector_on() {
        use baton::config::DetectorKind;
        let (spec, _) = ExpSpec::load("detector").unwrap();
        let runs = spec.plan(Some(&[BackendKind::PgLease]), None).unwrap();
        assert_eq!(runs[1].detector, Some(DetectorKind::Swim));
        let cfg = base_config(&spec, &runs[1]).unwrap();
        assert_eq!(cfg.detector.kind, DetectorKind::Swim);
    }
}
