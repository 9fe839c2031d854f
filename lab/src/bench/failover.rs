//! `baton bench failover`: how long the fleet is dark when its leader dies (or steps down),
//! measured on the resource's own clock.
//!
//! ```text
//! baton bench failover --backend raft --trials 20 --out experiments/results/failover/raft-kill.json
//! baton bench failover --backend raft --trials 20 --stepdown --out experiments/results/failover/raft-stepdown.json
//! ```
//!
//! The bench starts a fresh fleet (`baton::fleet::up`, base config `config/<backend>.toml` unless
//! `--config`), drives one sequential client that keeps calling `POST /next` (following `409`
//! redirects, retrying every 5 ms when nobody serves), and per trial:
//!
//! 1. waits for the client to be served, and takes the node that served it as the leader;
//! 2. `kill -9`s it (or, with `--stepdown`, `POST /stepdown` to it);
//! 3. waits until the client is served by a new leadership (another node, or another token);
//! 4. (kill mode) restarts the killed node with its state, so the fleet stays at N, waits for it
//!    to answer `/status`, then lets the fleet run `--settle` (1 s) of steady state;
//! 5. reads `baton.fence_log`: **failover = first `next` row of the new (token, holder) − last
//!    `next` row of the old (token, holder)**, both `committed_at` (`clock_timestamp()` inside
//!    PostgreSQL). It includes detection, election, the new leader's start-up and the client's
//!    retry granularity (≤ 5 ms) — the dark time a real client sees, on a clock no node controls.
//!
//! Prints each trial and median / p99 (nearest rank) / max, writes JSON with the trials, the
//! redacted node config and the machine (`nproc`, `uname -r`), and stops the fleet at the end, on
//! error and on Ctrl-C. The fleet directory is scratch: an old, stopped fleet there is wiped.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::unix_ms;

use anyhow::{anyhow, bail, Context};
use serde::Serialize;
use tokio::sync::watch;

use super::{bench_fleet_spec, machine_info, Summary};
use crate::fleet::client::NodeClient;
use crate::fleet::servers::pid_alive;
use crate::fleet::{self, FleetState};
use baton::backends::BackendKind;
use baton::config::{parse_duration_ms, NodeConfig};
use baton::tasks::AbortOnDrop;

#[derive(clap::Args, Clone, Debug)]
pub struct FailoverArgs {
    /// The fleet's election backend.
    #[arg(long, default_value = "raft")]
    pub backend: BackendKind,
    /// Number of kill (or step-down) trials.
    #[arg(long, default_value_t = 20)]
    pub trials: usize,
    /// Fleet size.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Fleet directory (scratch; default state/bench/failover-<backend>-<mode>).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Base node config; defaults to config/<backend>.toml when present.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Lease TTL override, e.g. 3s.
    #[arg(long, value_parser = parse_duration_ms)]
    pub lease_ttl: Option<u64>,
    /// POST /stepdown to the leader instead of kill -9: measures the hand-over dark time.
    #[arg(long)]
    pub stepdown: bool,
    /// Steady state between trials, e.g. 1s.
    #[arg(long, value_parser = parse_duration_ms, default_value = "1s")]
    pub settle: u64,
    /// A trial fails when no new leader serves within this long.
    #[arg(long, value_parser = parse_duration_ms, default_value = "60s")]
    pub trial_timeout: u64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One `200` to `POST /next`, as the bench's client saw it.
#[derive(Clone, Debug)]
struct Served {
    at: Instant,
    node: String,
    token: i64,
    seq: i64,
}

impl Served {
    fn same_leadership(&self, other: &Served) -> bool {
        self.node == other.node && self.token == other.token
    }
}

/// Counters and observations of the load driver.
#[derive(Default)]
struct LoadStats {
    served: AtomicU64,
    /// Rounds in which no node answered 200.
    dark_rounds: AtomicU64,
    /// Client-visible violations: seq not strictly increasing, or token going back.
    violations: Mutex<Vec<String>>,
    /// (last served by the old leadership, first served by the next one), in order.
    transitions: Mutex<Vec<(Served, Served)>>,
}

/// One trial's measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Trial {
    pub trial: usize,
    pub old_leader: String,
    pub old_token: i64,
    pub new_leader: String,
    pub new_token: i64,
    /// Resource clock: first `next` row of the new leadership − last `next` row of the old one.
    pub failover_ms: f64,
    /// The client's monotonic clock: last 200 from the old leader → first 200 from the new one.
    pub client_gap_ms: f64,
    /// The client's monotonic clock: kill / step-down request sent → first 200 from the new leader.
    pub detect_ms: f64,
    /// Requests the surviving nodes sent to the election backend from just before the kill until
    /// the new leader served (`baton_backend_requests_total`; raft counts none: no external service).
    pub backend_requests_per_election: Option<u64>,
    /// The step-down report (`--stepdown` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stepdown: Option<serde_json::Value>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs the benchmark; returns the trials (also printed and, with `--out`, written as JSON).
pub async fn run(args: FailoverArgs) -> anyhow::Result<Vec<Trial>> {
    if args.trials == 0 {
        bail!("--trials must be at least 1");
    }
    if args.nodes < 2 {
        bail!("--nodes must be at least 2 (a failover needs somebody to fail over to)");
    }
    let mode = if args.stepdown { "stepdown" } else { "kill" };
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("state/bench/failover-{}-{mode}", args.backend)));
    let spec = bench_fleet_spec(
        dir.clone(),
        args.nodes,
        args.backend,
        args.config.clone(),
        args.lease_ttl,
    )?;
    let base_config = spec.base_config.clone();
    let started_at = unix_ms();
    println!(
        "bench failover: {} x {mode} on a {}-node {} fleet in {} (base config {})",
        args.trials,
        args.nodes,
        args.backend,
        dir.display(),
        base_config
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "built-in defaults".into())
    );
    let mut state = fleet::up(&spec).await.context("starting the fleet")?;
    let config = redacted_config(&state);
    let stats = Arc::new(LoadStats::default());
    let mut trials = Vec::new();
    let outcome = tokio::select! {
        r = run_trials(&args, &mut state, stats.clone(), &mut trials) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted (Ctrl-C)")),
    };
    let ledger_violations = match &outcome {
        Ok(()) => ledger_violations(&state).await.ok(),
        Err(_) => None,
    };
    let down = state.clone();
    tokio::task::spawn_blocking(move || down.down())
        .await
        .context("stopping the fleet")?;
    println!("fleet stopped");

    let failover: Vec<f64> = trials.iter().map(|t| t.failover_ms).collect();
    let gap: Vec<f64> = trials.iter().map(|t| t.client_gap_ms).collect();
    let detect: Vec<f64> = trials.iter().map(|t| t.detect_ms).collect();
    let summary = Summary::of(&failover);
    if let Some(s) = &summary {
        let what = if args.stepdown {
            "step-down dark time"
        } else {
            "failover after kill -9"
        };
        println!(
            "{what} ({}, resource clock, ms): n={} median={:.1} p99={:.1} max={:.1} min={:.1} mean={:.1}",
            args.backend, s.n, s.median, s.p99, s.max, s.min, s.mean
        );
    }
    let violations = stats
        .violations
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    if !violations.is_empty() {
        println!("CLIENT-VISIBLE VIOLATIONS: {violations:?}");
    }
    if let Some(n) = ledger_violations.filter(|n| *n > 0) {
        println!("LEDGER VIOLATIONS: {n} non-increasing steps in baton.fence_log");
    }
    let report = serde_json::json!({
        "bench": "failover",
        "mode": mode,
        "backend": args.backend.as_str(),
        "nodes": args.nodes,
        "trials_requested": args.trials,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "started_at_unix_ms": started_at,
        "finished_at_unix_ms": unix_ms(),
        "base_config_file": base_config.map(|p| p.display().to_string()),
        "config": config,
        "settle_ms": args.settle,
        "machine": machine_info(),
        "measure": "failover_ms = first committed_at of op='next' under the new (token, holder) - last committed_at of op='next' under the old one, from baton.fence_log (PostgreSQL clock_timestamp()); client retries every 5 ms while nobody serves",
        "summary_ms": {
            "failover": summary,
            "client_gap": Summary::of(&gap),
            "detect": Summary::of(&detect),
        },
        "load": {
            "served": stats.served.load(Ordering::Relaxed),
            "dark_rounds": stats.dark_rounds.load(Ordering::Relaxed),
            "client_violations": violations,
            "ledger_violations": ledger_violations,
        },
        "trials": trials,
        "error": outcome.as_ref().err().map(|e| format!("{e:#}")),
    });
    if let Some(out) = &args.out {
        if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(out, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", out.display()))?;
        println!("wrote {}", out.display());
    }
    outcome?;
    Ok(trials)
}

/// The fleet's node config, redacted ([`NodeConfig::redacted_json`]).
pub(crate) fn redacted_config(state: &FleetState) -> serde_json::Value {
    state
        .nodes
        .first()
        .and_then(|n| NodeConfig::from_file(&n.config).ok())
        .map(|cfg| cfg.redacted_json())
        .unwrap_or(serde_json::Value::Null)
}

pub(crate) async fn connect_admin(state: &FleetState) -> anyhow::Result<tokio_postgres::Client> {
    let (client, conn) =
        tokio_postgres::connect(&state.postgres.admin_url(), tokio_postgres::NoTls)
            .await
            .context("connecting to the fleet's PostgreSQL")?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// Non-increasing steps in the ledger, in commit order (0 for a correct run).
pub(crate) async fn ledger_violations(state: &FleetState) -> anyhow::Result<i64> {
    let db = connect_admin(state).await?;
    let row = db
        .query_one(
            "SELECT count(*) FROM (SELECT token, seq_lo, lag(seq_hi) OVER w AS prev_hi, lag(token) OVER w AS prev_token
               FROM baton.fence_log WHERE op = 'next' WINDOW w AS (PARTITION BY resource ORDER BY pos)) x
             WHERE seq_lo <= prev_hi OR token < prev_token",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// The ledger's last position now: what a measured window's rows come after.
pub(crate) async fn ledger_pos(db: &tokio_postgres::Client) -> anyhow::Result<i64> {
    Ok(db
        .query_one("SELECT coalesce(max(pos), 0) FROM baton.fence_log", &[])
        .await
        .context("reading baton.fence_log")?
        .get(0))
}

/// Terms that claimed the fence after ledger position `pos` (a term claims the sequence and the
/// work-set, so terms are counted, not claim rows), and every token that wrote after it.
pub(crate) async fn terms_since(
    db: &tokio_postgres::Client,
    pos: i64,
) -> anyhow::Result<(i64, Vec<i64>)> {
    let row = db
        .query_one(
            "SELECT count(DISTINCT token) FILTER (WHERE op = 'claim'), coalesce(array_agg(DISTINCT token), '{}')
               FROM baton.fence_log WHERE pos > $1",
            &[&pos],
        )
        .await
        .context("reading baton.fence_log")?;
    Ok((row.get(0), row.get(1)))
}

/// `args.trials` kill -9 (or step-down) trials, as [`run`] does them, on a fleet that is already
/// up (for `baton bench cost`): the trials done, how the loop ended, and the client-visible
/// violations. The caller owns the fleet and takes it down.
pub(crate) async fn trials_on(
    args: &FailoverArgs,
    state: &mut FleetState,
) -> (Vec<Trial>, anyhow::Result<()>, Vec<String>) {
    let stats = Arc::new(LoadStats::default());
    let mut trials = Vec::new();
    let outcome = run_trials(args, state, stats.clone(), &mut trials).await;
    let violations = stats
        .violations
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    (trials, outcome, violations)
}

async fn run_trials(
    args: &FailoverArgs,
    state: &mut FleetState,
    stats: Arc<LoadStats>,
    trials: &mut Vec<Trial>,
) -> anyhow::Result<()> {
    let timeout = Duration::from_millis(args.trial_timeout);
    let nodes: Vec<(String, String)> = state
        .nodes
        .iter()
        .map(|n| (n.id.clone(), n.http_addr.clone()))
        .collect();
    let client = NodeClient::new(Duration::from_secs(2));
    let (tx, mut rx) = watch::channel(None::<Served>);
    let _load = AbortOnDrop(tokio::spawn(drive(
        nodes.clone(),
        client.clone(),
        tx,
        stats.clone(),
    )));
    let db = connect_admin(state).await?;
    // The step-down call returns once the old leader has released (bounded by the node at 30 s).
    let admin = state.admin_client(Duration::from_secs(40));

    let first = wait_served(&mut rx, timeout, |_| true)
        .await
        .context("waiting for the first leader to serve")?;
    println!("leader {} (token {}) serving", first.node, first.token);
    tokio::time::sleep(Duration::from_millis(args.settle)).await;

    let mut n = 0;
    let mut refused = 0;
    while n < args.trials {
        let since = Instant::now();
        let old = wait_served(&mut rx, timeout, |s| s.at >= since)
            .await
            .with_context(|| format!("trial {}: no leader serving", n + 1))?;
        let old_addr = nodes
            .iter()
            .find(|(id, _)| *id == old.node)
            .map(|(_, a)| a.clone())
            .ok_or_else(|| anyhow!("unknown node {}", old.node))?;
        let old_pid = state.node(&old.node)?.pid;
        let waiters: Vec<String> = nodes
            .iter()
            .filter(|(id, _)| *id != old.node)
            .map(|(_, a)| a.clone())
            .collect();
        let requests_before = backend_requests(&client, &waiters).await;

        let trigger_at = Instant::now();
        let mut stepdown = None;
        if args.stepdown {
            let r = admin
                .post(&old_addr, "/stepdown")
                .await
                .with_context(|| format!("POST /stepdown to {}", old.node))?;
            match r.status.as_u16() {
                200 => stepdown = Some(r.json()["stepped_down"].clone()),
                409 if refused < 5 => {
                    // Leadership moved between our observation and the request: try again.
                    refused += 1;
                    continue;
                }
                s => bail!(
                    "POST /stepdown to {} answered {s}: {}",
                    old.node,
                    String::from_utf8_lossy(&r.body)
                ),
            }
        } else {
            state.kill_node(&old.node)?;
        }
        let new = wait_served(&mut rx, timeout, |s| {
            s.at > trigger_at && !s.same_leadership(&old)
        })
        .await
        .with_context(|| {
            format!(
                "trial {}: no new leader served within {timeout:?} after the {} of {}",
                n + 1,
                if args.stepdown { "step-down" } else { "kill" },
                old.node
            )
        })?;
        // The watch holds the latest answer; the driver logged the first one of the new leadership.
        let (new, client_gap_ms) = stats
            .transitions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(_, to)| to.at > trigger_at && !to.same_leadership(&old))
            .map(|(from, to)| (to.clone(), ms(to.at.saturating_duration_since(from.at))))
            .unwrap_or((new, f64::NAN));
        let detect_ms = ms(new.at.saturating_duration_since(trigger_at));
        // Calls the waiting nodes made to the backend while the old lease ran out and one of them won.
        let backend_requests_per_election =
            match (requests_before, backend_requests(&client, &waiters).await) {
                (Some(a), Some(b)) => Some(b.saturating_sub(a)),
                _ => None,
            };

        if !args.stepdown {
            // Restart the killed node with its state dir, so the fleet stays at N.
            let until = Instant::now() + Duration::from_secs(10);
            while pid_alive(old_pid) {
                if Instant::now() > until {
                    bail!("{} (pid {old_pid}) survived SIGKILL", old.node);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            state.start_node(&old.node)?;
            wait_answering(&client, &old_addr, Duration::from_secs(30))
                .await
                .with_context(|| format!("restarted {} never answered /status", old.node))?;
        }
        tokio::time::sleep(Duration::from_millis(args.settle)).await;

        let row = db
            .query_opt(
                "WITH old AS (SELECT max(pos) AS pos, max(committed_at) AS at FROM baton.fence_log
                               WHERE op = 'next' AND token = $1 AND holder = $2),
                      new AS (SELECT f.token, f.holder, f.committed_at AS at FROM baton.fence_log f, old
                               WHERE f.op = 'next' AND f.pos > old.pos AND NOT (f.token = $1 AND f.holder = $2)
                               ORDER BY f.pos LIMIT 1)
                 SELECT new.token, new.holder, (extract(epoch FROM new.at - old.at) * 1000)::float8
                   FROM old, new",
                &[&old.token, &old.node],
            )
            .await
            .context("reading baton.fence_log")?
            .ok_or_else(|| {
                anyhow!(
                    "trial {}: fence_log has no next-row of {} (token {}) followed by another leadership",
                    n + 1,
                    old.node,
                    old.token
                )
            })?;
        let (new_token, new_holder, failover_ms): (i64, String, f64) =
            (row.get(0), row.get(1), row.get(2));
        if new_token != new.token || new_holder != new.node {
            tracing::warn!(
                ledger_token = new_token, ledger_holder = %new_holder, client_token = new.token, client_node = %new.node,
                "the ledger's first new leadership differs from the one the client saw first"
            );
        }
        n += 1;
        refused = 0;
        println!(
            "trial {n:>3}: {} (token {}) -> {} (token {}): {} {failover_ms:>8.1} ms (client gap {client_gap_ms:.1} ms, served {detect_ms:.1} ms after the {}; backend requests {})",
            old.node,
            old.token,
            new_holder,
            new_token,
            if args.stepdown { "dark" } else { "failover" },
            if args.stepdown { "step-down request" } else { "kill" },
            backend_requests_per_election.map(|r| r.to_string()).unwrap_or_else(|| "?".into()),
        );
        trials.push(Trial {
            trial: n,
            old_leader: old.node.clone(),
            old_token: old.token,
            new_leader: new_holder,
            new_token,
            failover_ms,
            client_gap_ms,
            detect_ms,
            backend_requests_per_election,
            stepdown,
        });
    }
    Ok(())
}

/// Sum of `baton_backend_requests_total` over the given nodes (None if one does not answer).
async fn backend_requests(client: &NodeClient, addrs: &[String]) -> Option<u64> {
    let mut total = 0.0;
    for addr in addrs {
        let reply = client.get(addr, "/metrics").await.ok()?;
        total += String::from_utf8_lossy(&reply.body)
            .lines()
            .filter(|l| l.starts_with(baton::backends::BACKEND_REQUESTS) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    Some(total as u64)
}

async fn wait_served(
    rx: &mut watch::Receiver<Option<Served>>,
    within: Duration,
    pred: impl Fn(&Served) -> bool,
) -> anyhow::Result<Served> {
    match tokio::time::timeout(within, rx.wait_for(|o| o.as_ref().is_some_and(&pred))).await {
        Ok(Ok(v)) => Ok(v.clone().expect("matched Some")),
        Ok(Err(_)) => bail!("the load driver stopped"),
        Err(_) => bail!("timed out after {within:?}"),
    }
}

async fn wait_answering(client: &NodeClient, addr: &str, within: Duration) -> anyhow::Result<()> {
    let until = Instant::now() + within;
    loop {
        if matches!(client.get(addr, "/status").await, Ok(r) if r.status == 200) {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("{addr} did not answer within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One sequential client: `POST /next` to whoever leads, following `409` redirects; every 200 is
/// published on `tx`; retries every 5 ms while nobody serves.
async fn drive(
    nodes: Vec<(String, String)>,
    client: NodeClient,
    tx: watch::Sender<Option<Served>>,
    stats: Arc<LoadStats>,
) {
    let n = nodes.len();
    let mut hint: Option<usize> = None;
    let mut prev: Option<Served> = None;
    loop {
        let mut tried = vec![false; n];
        let mut next = hint.unwrap_or(0);
        let mut served = None;
        loop {
            tried[next] = true;
            let mut redirect = None;
            match client.post(&nodes[next].1, "/next").await {
                Ok(r) if r.status == 200 => {
                    let v = r.json();
                    if let (Some(token), Some(seq)) = (v["token"].as_i64(), v["seq"].as_i64()) {
                        served = Some(Served {
                            at: Instant::now(),
                            node: nodes[next].0.clone(),
                            token,
                            seq,
                        });
                        hint = Some(next);
                        break;
                    }
                }
                Ok(r) if r.status == 409 => {
                    redirect = r
                        .leader_header
                        .and_then(|l| nodes.iter().position(|(_, a)| *a == l));
                }
                _ => {}
            }
            next = match redirect.filter(|j| !tried[*j]) {
                Some(j) => j,
                None => match (0..n).find(|k| !tried[*k]) {
                    Some(k) => k,
                    None => break,
                },
            };
        }
        let Some(s) = served else {
            hint = None;
            stats.dark_rounds.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        stats.served.fetch_add(1, Ordering::Relaxed);
        if let Some(p) = &prev {
            if s.seq <= p.seq || s.token < p.token {
                stats
                    .violations
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(format!(
                        "({}, {}) from {} after ({}, {}) from {}",
                        s.token, s.seq, s.node, p.token, p.seq, p.node
                    ));
            }
            if !s.same_leadership(p) {
                stats
                    .transitions
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((p.clone(), s.clone()));
            }
        }
        prev = Some(s.clone());
        if tx.send(Some(s)).is_err() {
            return;
        }
    }
}
