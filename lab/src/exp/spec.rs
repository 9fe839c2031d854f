//! `experiments/NAME.toml`: what one experiment runs, and its expansion into runs.
//!
//! Every time in a spec is a *span*: a sum of terms `<n>s`, `<n>ms` and `<n>ttl` (multiples of
//! the run's lease TTL), e.g. `"5s"`, `"0.5ttl"`, `"ttl+500ms"`, `"2ttl+2s"`. That is how one fault
//! schedule serves every point of a TTL sweep.
//!
//! ```toml
//! name = "gc-pause"
//! description = "..."
//! backends = ["etcd", "raft"]
//! nodes = 3
//! seed = 4
//! duration = "3ttl+12s"        # of the load; faults past it are dropped
//! fencing = ["on"]             # one run per value
//! [load]
//! rate = 300.0
//! connections = 8
//! [[faults]]
//! kind = "pause-leader"        # kill-leader | pause-leader | partition-leader | stepdown, or a
//!                              # nemesis kind (kill-follower, clock-rate, resource-kill, ...)
//! at = "4s"                    # from the start of the load
//! every = "ttl+8s"             # repeat...
//! count = 2                    # ...this many times (occurrences past `duration` are dropped)
//! length = "ttl+500ms"         # pause / partition length
//! jitter_ms = 300              # uniform ± jitter on each occurrence, drawn from the seed
//! [nemesis]                    # optional: a seeded random schedule (see `NemesisCfg`)
//! [quick]                      # `--quick` overrides, for tests
//! duration = "8s"
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use baton::backends::BackendKind;
use baton::config::{Fencing, SequencerMode};

/// A duration relative to the run's lease TTL: `secs + ttl_mult × TTL`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Span {
    pub secs: f64,
    pub ttl_mult: f64,
}

impl Span {
    pub fn parse(text: &str) -> anyhow::Result<Span> {
        let mut span = Span {
            secs: 0.0,
            ttl_mult: 0.0,
        };
        let t = text.trim();
        if t.is_empty() {
            bail!("empty span");
        }
        for term in t.split('+') {
            let term = term.trim();
            let num = |s: &str| -> anyhow::Result<f64> {
                if s.is_empty() {
                    return Ok(1.0);
                }
                let v: f64 = s
                    .trim()
                    .parse()
                    .with_context(|| format!("span {text:?}: bad number {s:?}"))?;
                if !(v.is_finite() && v >= 0.0) {
                    bail!("span {text:?}: {v} is not a non-negative number");
                }
                Ok(v)
            };
            if let Some(v) = term.strip_suffix("ttl") {
                span.ttl_mult += num(v)?;
            } else if let Some(v) = term.strip_suffix("ms") {
                span.secs += num(v)? / 1000.0;
            } else if let Some(v) = term.strip_suffix('s') {
                span.secs += num(v)?;
            } else {
                bail!("span {text:?}: term {term:?} needs a unit: s, ms or ttl");
            }
        }
        Ok(span)
    }

    pub fn eval(&self, ttl_ms: u64) -> Duration {
        Duration::from_secs_f64(self.secs + self.ttl_mult * ttl_ms as f64 / 1000.0)
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Span, D::Error> {
        let text = String::deserialize(d)?;
        Span::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// `kill -9` of the node that leads (optionally restarted after `restart_after`).
    KillLeader,
    /// SIGSTOP of the leader for `length`, then SIGCONT: a stop-the-world pause.
    PauseLeader,
    /// Cut the leader from its election backend (raft: from its peers) for `length`; needs `netns`.
    PartitionLeader,
    /// `POST /stepdown` to the leader: checkpoint, stop, release.
    Stepdown,
    /// `kill -9` of a node that does not lead, restarted (state kept or wiped).
    KillFollower,
    /// `kill -9` of the leader while its `POST /stepdown` is in flight.
    KillSteppingDown,
    /// Cut the leader from the fenced PostgreSQL only (netns).
    PartitionLeaderResource,
    /// Cut the leader from its election backend and from PostgreSQL (netns).
    PartitionLeaderBoth,
    /// Restart one node under libfaketime so its `CLOCK_MONOTONIC` runs at another rate.
    ClockRate,
    /// Kill and restart one election-backend server: an etcd member (sometimes etcd's leader),
    /// a ZooKeeper server, Redis (with or without its data), pg-lease's PostgreSQL.
    BackendRestart,
    /// `kill -9` of the fenced PostgreSQL (postmaster and its children), restarted.
    ResourceKill,
    /// `POST /stepdown?to=<a follower>`: a leadership transfer (raft).
    Transfer,
    /// `kill -9` of the Redis primary of a fleet behind Sentinel (`redis_topology = "sentinel"`);
    /// the Sentinels promote the replica, the old primary comes back as its replica.
    SentinelFailover,
    /// `kill -9` of the fenced resource's PostgreSQL primary and promotion of its standby
    /// (`resource_standby`); a new standby is then built where the old primary was.
    PgPromote,
}

impl FaultKind {
    pub const ALL: [FaultKind; 14] = [
        FaultKind::KillLeader,
        FaultKind::KillFollower,
        FaultKind::KillSteppingDown,
        FaultKind::PauseLeader,
        FaultKind::PartitionLeader,
        FaultKind::PartitionLeaderResource,
        FaultKind::PartitionLeaderBoth,
        FaultKind::ClockRate,
        FaultKind::BackendRestart,
        FaultKind::ResourceKill,
        FaultKind::Stepdown,
        FaultKind::Transfer,
        FaultKind::SentinelFailover,
        FaultKind::PgPromote,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill-leader",
            FaultKind::PauseLeader => "pause-leader",
            FaultKind::PartitionLeader => "partition-leader",
            FaultKind::Stepdown => "stepdown",
            FaultKind::KillFollower => "kill-follower",
            FaultKind::KillSteppingDown => "kill-stepping-down",
            FaultKind::PartitionLeaderResource => "partition-leader-resource",
            FaultKind::PartitionLeaderBoth => "partition-leader-both",
            FaultKind::ClockRate => "clock-rate",
            FaultKind::BackendRestart => "backend-restart",
            FaultKind::ResourceKill => "resource-kill",
            FaultKind::Transfer => "transfer",
            FaultKind::SentinelFailover => "sentinel-failover",
            FaultKind::PgPromote => "pg-promote",
        }
    }

    /// Faults after which a leadership change is the point (not a false failover).
    pub fn forces_change(self) -> bool {
        matches!(
            self,
            FaultKind::KillLeader
                | FaultKind::Stepdown
                | FaultKind::KillSteppingDown
                | FaultKind::Transfer
        )
    }

    /// Faults that cut the leader off for `length` while it keeps running (a stale leader).
    pub fn isolates_leader(self) -> bool {
        matches!(
            self,
            FaultKind::PauseLeader
                | FaultKind::PartitionLeader
                | FaultKind::PartitionLeaderResource
                | FaultKind::PartitionLeaderBoth
        )
    }

    pub fn needs_netns(self) -> bool {
        matches!(
            self,
            FaultKind::PartitionLeader
                | FaultKind::PartitionLeaderResource
                | FaultKind::PartitionLeaderBoth
        )
    }
}

/// `[nemesis]`: a seeded random schedule instead of `[[faults]]`. Faults run one after
/// another: a gap, one fault (its kind, timing and length drawn from the run's seed), the next.
/// Ranges are `[low, high]` spans, drawn uniformly.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NemesisCfg {
    /// How many faults to draw (the load's `duration` bounds the run: faults still due when
    /// the load ends are not injected).
    pub faults: usize,
    /// The run counts only if at least this fraction of the injected faults took effect.
    #[serde(default = "default_min_effective")]
    pub min_effective_fraction: f64,
    /// Quiet time between two faults.
    pub gap: [Span; 2],
    /// How long a killed node / server stays down before its restart.
    pub down: [Span; 2],
    /// SIGSTOP lengths below the lease TTL...
    pub pause_short: [Span; 2],
    /// ...and above it.
    pub pause_long: [Span; 2],
    pub partition: [Span; 2],
    /// How long a node runs under a skewed clock rate.
    pub clock_hold: [Span; 2],
    /// Clock rates to draw from (e.g. 0.8 = 20% slow, 1.25 = 25% fast).
    pub clock_rates: Vec<f64>,
    /// Fraction of node kills restarted with the state dir wiped (a new member, an old id).
    #[serde(default)]
    pub wipe_fraction: f64,
    /// `pg-promote`: how long the primary's WAL sender is stopped (SIGSTOP) before the primary
    /// is killed, so the standby lags as one across a network (or on a slow disk) does. On
    /// loopback an asynchronous standby is never behind by more than a few commits when its
    /// primary dies: the lag is what makes its promotion lose the acknowledged commits it
    /// lacked. A synchronous standby's primary makes commits wait instead. Unset: no lag.
    #[serde(default)]
    pub standby_lag: Option<[Span; 2]>,
    /// `pg-promote` with `standby_lag`: halfway through the lag the leader steps down and the
    /// lag lasts until a new leader serves (at most 5 s more), so a term change happens that the
    /// standby never receives: the promotion loses it, and the next term is numbered again.
    #[serde(default)]
    pub handover_in_lag: bool,
    /// Relative weights of the kinds; kinds a backend cannot take are left out for it.
    pub mix: std::collections::BTreeMap<FaultKind, f64>,
}

fn default_min_effective() -> f64 {
    0.9
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    pub kind: FaultKind,
    /// First occurrence, from the start of the load.
    pub at: Span,
    /// Period of the repetitions.
    #[serde(default)]
    pub every: Option<Span>,
    #[serde(default = "one")]
    pub count: usize,
    /// Pause / partition length.
    #[serde(default)]
    pub length: Option<Span>,
    /// Kill: restart the killed node (with its state) after this long; unset = it stays down.
    #[serde(default)]
    pub restart_after: Option<Span>,
    /// Uniform ± jitter on each occurrence, drawn from the run's seed.
    #[serde(default)]
    pub jitter_ms: u64,
}

fn one() -> usize {
    1
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadCfg {
    /// Offered `POST /next` per second (open loop).
    pub rate: f64,
    #[serde(default = "default_connections")]
    pub connections: usize,
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Share of the slots sent as `GET /read` (0: none).
    #[serde(default)]
    pub read_fraction: f64,
    /// `?mode=` of those reads, in turn (empty: the nodes' default).
    #[serde(default)]
    pub read_modes: Vec<String>,
}

fn default_connections() -> usize {
    4
}

/// `[read_probe]`: see [`ExpSpec::read_probe`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadProbe {
    /// Read modes, each probed on every node.
    pub modes: Vec<String>,
    /// Concurrent sequential readers per node and mode.
    #[serde(default = "default_probes")]
    pub per_node: usize,
    /// Pause between one reader's reads, ms.
    #[serde(default = "default_probe_interval")]
    pub interval_ms: u64,
    /// A reader gives up on a read after this long and sends the next one, so a paused node
    /// always has a recent read waiting for it when it resumes.
    #[serde(default = "default_probe_timeout")]
    pub timeout_ms: u64,
}

fn default_probe_timeout() -> u64 {
    250
}

fn default_probes() -> usize {
    2
}
fn default_probe_interval() -> u64 {
    20
}
fn default_timeout_ms() -> u64 {
    2000
}

/// `[[neighbours]]`: a reproducible CPU neighbour for the load's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeighbourCfg {
    /// `stress-ng --cpu 2 --cpu-load P`: P % of both cores.
    pub cpu_percent: u32,
    /// `--cpu-load-slice` in ms: > 0 spreads the same P % evenly (a steady neighbour); 0 keeps
    /// stress-ng's default, each busy slice a random 0–500 ms flat out (a bursty one).
    #[serde(default)]
    pub slice_ms: u32,
}

impl NeighbourCfg {
    /// `steady15`, `bursty15`.
    pub fn label(&self) -> String {
        let shape = if self.slice_ms > 0 {
            "steady"
        } else {
            "bursty"
        };
        format!("{shape}{}", self.cpu_percent)
    }
}

/// `--quick` overrides (every field optional).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuickCfg {
    #[serde(default)]
    pub duration: Option<Span>,
    #[serde(default)]
    pub lease_ttl: Option<Vec<String>>,
    #[serde(default)]
    pub nodes: Option<usize>,
    #[serde(default)]
    pub workset_rows: Option<Vec<u64>>,
    #[serde(default)]
    pub fault_count: Option<usize>,
}

/// What the checker must say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expect {
    Pass,
    Fail,
    /// Reported, not judged (e.g. a fencing-off run that may or may not hit the race).
    Any,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub backends: Vec<BackendKind>,
    #[serde(default = "default_nodes")]
    pub nodes: usize,
    /// Lease TTLs to sweep (e.g. `["1s", "3s"]`); empty: each backend's `config/<backend>.toml`.
    #[serde(default)]
    pub lease_ttl: Vec<String>,
    /// Backends the TTL sweep applies to (default: all but raft, whose lease is bounded by its
    /// election timeout).
    #[serde(default)]
    pub ttl_backends: Option<Vec<BackendKind>>,
    /// Raft election timeout range in ms, `MIN-MAX` (default: `config/raft.toml`).
    #[serde(default)]
    pub election_timeout: Option<String>,
    #[serde(default = "default_fencing")]
    pub fencing: Vec<Fencing>,
    /// Whether the fleet must run in network namespaces (partitions).
    #[serde(default)]
    pub netns: bool,
    /// The redis backends' Redis (`single`, or `sentinel`: a primary, a replica, three
    /// Sentinels), as `baton fleet up --redis-topology`; `sentinel-failover` needs `sentinel`.
    #[serde(default)]
    pub redis_topology: crate::fleet::RedisTopology,
    /// A streaming standby of the fenced resource (`sync` or `async`), as `baton fleet up
    /// --resource-standby`; `pg-promote` needs one.
    #[serde(default)]
    pub resource_standby: Option<crate::fleet::StandbyMode>,
    /// Rate error of every node's clock (`clock_drift`, e.g. -0.45 = 45% slow): breaks the
    /// watchdog's bounded-drift assumption on purpose, so only the fence is left.
    #[serde(default)]
    pub clock_drift: Option<f64>,
    /// One run per value: every node's `clock_drift` (label `-drift-0.30`). Empty: no sweep.
    #[serde(default)]
    pub clock_drifts: Vec<f64>,
    /// One run per value: every node restarted under libfaketime with `CLOCK_MONOTONIC` (and the
    /// wall clock) running at this rate, a real clock-rate fault rather than `clock_drift`'s
    /// arithmetic (label `-faketime0.800`; rate 0.8 is drift −0.2). Empty: none.
    #[serde(default)]
    pub faketime_rates: Vec<f64>,
    /// The clock-rate error bound the nodes are configured with (`clock_rate_error`; default:
    /// the backend's config file). A run whose clock is slower than this is not judged.
    #[serde(default)]
    pub clock_rate_error: Option<f64>,
    /// Clients that keep reading from *every* node, as a client with a stale leader cache would:
    /// a deposed leader that still answers is caught by the checker's read invariants. The
    /// mode `next` sends `POST /next` instead (an acknowledged ID, checked like the load's).
    #[serde(default)]
    pub read_probe: Option<ReadProbe>,
    /// One run per value: every node's `[sequencer] mode` (label `-window` / `-durable`).
    /// Empty: the backend's config file (durable).
    #[serde(default)]
    pub sequencer_modes: Vec<SequencerMode>,
    /// One run per value: every node's `[detector] kind` (label `-lease` / `-swim`). Empty:
    /// the backend's config file (`lease`). `swim` with `netns` needs root like any netns run.
    #[serde(default)]
    pub detectors: Vec<baton::config::DetectorKind>,
    /// One run per value: a CPU neighbour beside the load (`stress-ng --cpu 2`, as `baton bench
    /// next --neighbour-cpu-percent`), label `-steady15` (even busy slices) or `-bursty15`
    /// (stress-ng's random 0–500 ms slices). Empty: no neighbour.
    #[serde(default)]
    pub neighbours: Vec<NeighbourCfg>,
    /// `[sequencer] window_ids` of the window-mode runs (default: the config's).
    #[serde(default)]
    pub window_ids: Option<u64>,
    pub seed: u64,
    /// How long the load runs.
    pub duration: Span,
    /// Pause after the load before the ledger is read.
    #[serde(default = "default_settle")]
    pub settle: Span,
    pub load: LoadCfg,
    #[serde(default)]
    pub faults: Vec<FaultSpec>,
    /// Rows seeded into `baton.jobs` before the load (one run per value; empty = no seeding).
    #[serde(default)]
    pub workset_rows: Vec<u64>,
    /// The verdict expected with fencing on (default pass).
    #[serde(default = "default_expect_on")]
    pub expect_on: Expect,
    /// The verdict expected with fencing off (default fail).
    #[serde(default = "default_expect_off")]
    pub expect_off: Expect,
    /// Backends whose verdict is reported but not judged (e.g. redis-naive has no real token).
    #[serde(default)]
    pub unjudged: Vec<BackendKind>,
    /// Backends whose fencing-off verdict is reported but not judged (the fault may not defeat
    /// their watchdog, e.g. raft's lease is shorter than any election).
    #[serde(default)]
    pub unjudged_off: Vec<BackendKind>,
    /// A seeded random fault schedule (the nemesis) instead of, or besides, `faults`.
    #[serde(default)]
    pub nemesis: Option<NemesisCfg>,
    /// Backends expected to FAIL whatever the fencing (e.g. redis-naive, which has no real
    /// token: the nemesis must show its violations).
    #[serde(default)]
    pub expect_fail: Vec<BackendKind>,
    #[serde(default)]
    pub quick: QuickCfg,
}

fn default_nodes() -> usize {
    3
}
fn default_fencing() -> Vec<Fencing> {
    vec![Fencing::On]
}
fn default_settle() -> Span {
    Span {
        secs: 1.0,
        ttl_mult: 0.0,
    }
}
fn default_expect_on() -> Expect {
    Expect::Pass
}
fn default_expect_off() -> Expect {
    Expect::Fail
}

/// One run: a fresh fleet, the load, the fault schedule, the checker.
#[derive(Clone, Debug, Serialize)]
pub struct RunPlan {
    /// File stem of this run's results, e.g. `etcd`, `etcd-ttl3s`, `raft-fencing-off`.
    pub label: String,
    pub backend: BackendKind,
    /// TTL override (None: the backend's config file).
    pub ttl_ms: Option<u64>,
    pub fencing: Fencing,
    pub workset_rows: u64,
    /// Every node's clock drift in this run (the `clock_drifts` sweep).
    pub clock_drift: Option<f64>,
    /// Every node's libfaketime clock rate in this run (the `faketime_rates` sweep).
    pub faketime_rate: Option<f64>,
    /// Every node's `[sequencer] mode` in this run (the `sequencer_modes` sweep).
    pub sequencer_mode: Option<SequencerMode>,
    /// Every node's `[detector] kind` in this run (the `detectors` sweep).
    pub detector: Option<baton::config::DetectorKind>,
    /// The CPU neighbour beside this run's load (the `neighbours` sweep).
    pub neighbour: Option<NeighbourCfg>,
    /// This run's seed (the experiment's seed mixed with the label).
    pub seed: u64,
}

impl ExpSpec {
    /// Reads `experiments/NAME.toml` (or a path to a `.toml`).
    pub fn load(name_or_path: &str) -> anyhow::Result<(ExpSpec, PathBuf)> {
        let p = Path::new(name_or_path);
        let path = if p.extension().is_some_and(|e| e == "toml") {
            p.to_path_buf()
        } else {
            crate::repo_path("experiments").join(format!("{name_or_path}.toml"))
        };
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading experiment {}", path.display()))?;
        let spec: ExpSpec =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        spec.validate()?;
        Ok((spec, path))
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.backends.is_empty() {
            bail!("{}: no backends", self.name);
        }
        if self.nodes < 2 {
            bail!("{}: a fleet needs at least 2 nodes to fail over", self.name);
        }
        if !(self.load.rate.is_finite() && self.load.rate > 0.0) {
            bail!("{}: load.rate must be positive", self.name);
        }
        if self
            .clock_drifts
            .iter()
            .chain(&self.clock_drift)
            .any(|d| !(d.is_finite() && d.abs() < 0.5))
        {
            bail!("{}: clock drifts must be in (-0.5, 0.5)", self.name);
        }
        if self
            .faketime_rates
            .iter()
            .any(|r| !(r.is_finite() && (0.5..1.5).contains(r)))
        {
            bail!("{}: faketime rates must be in [0.5, 1.5)", self.name);
        }
        if self
            .clock_rate_error
            .is_some_and(|b| !(0.0..0.5).contains(&b))
        {
            bail!("{}: clock_rate_error must be in [0, 0.5)", self.name);
        }
        if self
            .neighbours
            .iter()
            .any(|n| !(1..=100).contains(&n.cpu_percent))
        {
            bail!("{}: neighbours' cpu_percent must be in [1, 100]", self.name);
        }
        if !(0.0..=1.0).contains(&self.load.read_fraction) {
            bail!("{}: load.read_fraction must be in [0, 1]", self.name);
        }
        let probe_modes = self
            .read_probe
            .iter()
            .flat_map(|p| p.modes.iter())
            .filter(|m| m.as_str() != "next");
        for m in self.load.read_modes.iter().chain(probe_modes) {
            if !["lease", "quorum", "resource"].contains(&m.as_str()) {
                bail!(
                    "{}: read mode {m:?} is not lease, quorum or resource",
                    self.name
                );
            }
        }
        if let Some(p) = &self.read_probe {
            // The probe's extra mode; the load's reads are reads only.
            if p.modes.is_empty() {
                bail!("{}: read_probe.modes is empty", self.name);
            }
        }
        for t in &self.lease_ttl {
            baton::config::parse_duration_ms(t)
                .with_context(|| format!("{}: lease_ttl {t:?}", self.name))?;
        }
        if let Some(n) = &self.nemesis {
            if n.mix.values().any(|w| !(w.is_finite() && *w >= 0.0))
                || n.mix.values().sum::<f64>() <= 0.0
            {
                bail!(
                    "{}: nemesis.mix needs non-negative weights, some positive",
                    self.name
                );
            }
            if n.mix.keys().any(|k| k.needs_netns()) && !self.netns {
                bail!("{}: nemesis partitions need netns = true", self.name);
            }
            if n.clock_rates
                .iter()
                .any(|r| !(r.is_finite() && *r > 0.1 && *r < 10.0))
            {
                bail!("{}: nemesis.clock_rates must be in (0.1, 10)", self.name);
            }
            if n.mix.get(&FaultKind::ClockRate).is_some_and(|w| *w > 0.0)
                && n.clock_rates.is_empty()
            {
                bail!("{}: clock-rate faults need nemesis.clock_rates", self.name);
            }
            if !(0.0..=1.0).contains(&n.wipe_fraction)
                || !(0.0..=1.0).contains(&n.min_effective_fraction)
            {
                bail!("{}: nemesis fractions must be in [0, 1]", self.name);
            }
        }
        for f in &self.faults {
            match f.kind {
                FaultKind::PauseLeader | FaultKind::PartitionLeader if f.length.is_none() => {
                    bail!("{}: a {} fault needs a length", self.name, f.kind.as_str())
                }
                k if k.needs_netns() && !self.netns => {
                    bail!("{}: {} needs netns = true", self.name, k.as_str())
                }
                _ => {}
            }
            if f.count > 1 && f.every.is_none() {
                bail!("{}: a repeated fault needs `every`", self.name);
            }
        }
        Ok(())
    }

    /// Applies the `[quick]` overrides.
    pub fn quick(mut self) -> ExpSpec {
        let q = self.quick.clone();
        if let Some(d) = q.duration {
            self.duration = d;
        }
        if let Some(t) = q.lease_ttl {
            self.lease_ttl = t;
        }
        if let Some(n) = q.nodes {
            self.nodes = n;
        }
        if let Some(w) = q.workset_rows {
            self.workset_rows = w;
        }
        if let Some(c) = q.fault_count {
            for f in &mut self.faults {
                f.count = f.count.min(c);
            }
            if let Some(n) = &mut self.nemesis {
                n.faults = n.faults.min(c);
            }
        }
        self
    }

    fn sweeps_ttl(&self, b: BackendKind) -> bool {
        !self.lease_ttl.is_empty()
            && match &self.ttl_backends {
                Some(list) => list.contains(&b),
                None => b != BackendKind::Raft,
            }
    }

    /// Every run, in order: backend × TTL × fencing × work-set size.
    pub fn plan(
        &self,
        backends: Option<&[BackendKind]>,
        ttl_override: Option<&[u64]>,
    ) -> anyhow::Result<Vec<RunPlan>> {
        let mut ttls: Vec<u64> = match ttl_override {
            Some(t) => t.to_vec(),
            None => self
                .lease_ttl
                .iter()
                .map(|t| baton::config::parse_duration_ms(t).map_err(anyhow::Error::from))
                .collect::<anyhow::Result<_>>()?,
        };
        ttls.dedup();
        let mut runs = Vec::new();
        for &b in &self.backends {
            if backends.is_some_and(|only| !only.contains(&b)) {
                continue;
            }
            let ttl_points: Vec<Option<u64>> = if self.sweeps_ttl(b) && !ttls.is_empty() {
                ttls.iter().map(|t| Some(*t)).collect()
            } else {
                vec![None]
            };
            let rows: Vec<u64> = if self.workset_rows.is_empty() {
                vec![0]
            } else {
                self.workset_rows.clone()
            };
            // (simulated drift, libfaketime rate): one run each, or one run with neither.
            let clocks: Vec<(Option<f64>, Option<f64>)> = self
                .clock_drifts
                .iter()
                .map(|d| (Some(*d), None))
                .chain(self.faketime_rates.iter().map(|r| (None, Some(*r))))
                .collect();
            let clocks = if clocks.is_empty() {
                vec![(None, None)]
            } else {
                clocks
            };
            let modes: Vec<Option<SequencerMode>> = if self.sequencer_modes.is_empty() {
                vec![None]
            } else {
                self.sequencer_modes.iter().map(|m| Some(*m)).collect()
            };
            let detectors: Vec<Option<baton::config::DetectorKind>> = if self.detectors.is_empty() {
                vec![None]
            } else {
                self.detectors.iter().map(|d| Some(*d)).collect()
            };
            let neighbours: Vec<Option<NeighbourCfg>> = if self.neighbours.is_empty() {
                vec![None]
            } else {
                self.neighbours.iter().map(|n| Some(*n)).collect()
            };
            let mut points = Vec::new();
            for &n in &neighbours {
                for &d in &detectors {
                    for &m in &modes {
                        points.push((m, d, n));
                    }
                }
            }
            for ttl in &ttl_points {
                for &fencing in &self.fencing {
                    for &w in &rows {
                        for &(drift, faketime) in &clocks {
                            for &(mode, detector, neighbour) in &points {
                                let mut label = b.as_str().to_owned();
                                if let Some(d) = drift {
                                    label.push_str(&format!("-drift{d:+.2}"));
                                }
                                if let Some(r) = faketime {
                                    label.push_str(&format!("-faketime{r:.3}"));
                                }
                                if let Some(t) = ttl {
                                    label.push_str(&format!("-ttl{}", fmt_ttl(*t)));
                                }
                                if self.fencing.len() > 1 || fencing == Fencing::Off {
                                    label.push_str(match fencing {
                                        Fencing::On => "-fencing-on",
                                        Fencing::Off => "-fencing-off",
                                    });
                                }
                                if self.workset_rows.len() > 1 {
                                    label.push_str(&format!("-jobs{}", fmt_count(w)));
                                }
                                if let Some(m) = mode {
                                    label.push_str(&format!("-{}", m.as_str()));
                                }
                                if let Some(d) = detector {
                                    label.push_str(match d {
                                        baton::config::DetectorKind::Lease => "-lease",
                                        baton::config::DetectorKind::Swim => "-swim",
                                    });
                                }
                                if let Some(n) = neighbour {
                                    label.push_str(&format!("-{}", n.label()));
                                }
                                runs.push(RunPlan {
                                    seed: mix_seed(self.seed, &label),
                                    label,
                                    backend: b,
                                    ttl_ms: *ttl,
                                    fencing,
                                    workset_rows: w,
                                    clock_drift: drift,
                                    faketime_rate: faketime,
                                    sequencer_mode: mode,
                                    detector,
                                    neighbour,
                                });
                            }
                        }
                    }
                }
            }
        }
        if runs.is_empty() {
            bail!("{}: no run matches the selected backends", self.name);
        }
        Ok(runs)
    }

    /// Whether the run reads with `lease` (answered from memory inside the lease window): the
    /// load's reads (`read_modes` empty is the node's default, `lease`) or the probe's.
    fn leans_on_the_lease_window(&self) -> bool {
        let load = self.load.read_fraction > 0.0
            && (self.load.read_modes.is_empty()
                || self.load.read_modes.iter().any(|m| m == "lease"));
        let probe = self
            .read_probe
            .as_ref()
            .is_some_and(|p| p.modes.iter().any(|m| m == "lease"));
        load || probe
    }

    /// The expected verdict of a run (`Any` for unjudged backends).
    pub fn expectation(&self, plan: &RunPlan) -> Expect {
        if self.expect_fail.contains(&plan.backend) {
            return Expect::Fail;
        }
        // A clock slower than the configured bound breaks the lease arithmetic on purpose: what
        // the run shows is counted (stale reads by mode, window-mode IDs out of real-time
        // order), not judged. A run with neither (durable IDs only, no lease read) is judged
        // whatever the clock: only the fence is left, and it is enough.
        let bound = self.clock_rate_error.unwrap_or(0.01);
        if plan
            .clock_drift
            .or(self.clock_drift)
            .or(plan.faketime_rate.map(|r| r - 1.0))
            .is_some_and(|d| -d > bound)
            && (self.leans_on_the_lease_window()
                || plan.sequencer_mode == Some(SequencerMode::Window))
        {
            return Expect::Any;
        }
        if self.unjudged.contains(&plan.backend)
            || (plan.fencing == Fencing::Off && self.unjudged_off.contains(&plan.backend))
        {
            return Expect::Any;
        }
        match plan.fencing {
            Fencing::On => self.expect_on,
            Fencing::Off => self.expect_off,
        }
    }
}

/// `1500` → `1.5s`, `3000` → `3s`.
pub fn fmt_ttl(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{}ms", ms)
    }
}

/// `10000000` → `10M`, `0` → `0`.
pub fn fmt_count(n: u64) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// FNV-1a of the label, mixed into the experiment's seed: each run gets its own stream, stable
/// across invocations that select different backends.
pub fn mix_seed(seed: u64, label: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in label.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    seed ^ h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_add_seconds_millis_and_ttls() {
        assert_eq!(
            Span::parse("ttl+500ms").unwrap().eval(3000),
            Duration::from_millis(3500)
        );
        assert_eq!(
            Span::parse("0.5ttl").unwrap().eval(1000),
            Duration::from_millis(500)
        );
        assert_eq!(
            Span::parse("2ttl + 2s").unwrap().eval(10_000),
            Duration::from_secs(22)
        );
        assert_eq!(Span::parse("5s").unwrap().eval(0), Duration::from_secs(5));
        assert!(Span::parse("5").is_err());
        assert!(Span::parse("-1s").is_err());
    }

    #[test]
    fn plan_expands_backends_ttls_and_fencing_with_stable_labels() {
        let spec: ExpSpec = toml::from_str(
            r#"
            name = "t"
            backends = ["etcd", "raft"]
            lease_ttl = ["1s", "3s"]
            fencing = ["off", "on"]
            seed = 7
            duration = "10s"
            [load]
            rate = 100.0
            [[faults]]
            kind = "pause-leader"
            at = "2s"
            length = "ttl+500ms"
        "#,
        )
        .unwrap();
        spec.validate().unwrap();
        let runs = spec.plan(None, None).unwrap();
        let labels: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "etcd-ttl1s-fencing-off",
                "etcd-ttl1s-fencing-on",
                "etcd-ttl3s-fencing-off",
                "etcd-ttl3s-fencing-on",
                "raft-fencing-off",
                "raft-fencing-on"
            ]
        );
        assert_eq!(spec.expectation(&runs[0]), Expect::Fail);
        assert_eq!(spec.expectation(&runs[1]), Expect::Pass);
        let only = spec.plan(Some(&[BackendKind::Raft]), None).unwrap();
        assert_eq!(only.len(), 2);
        assert_eq!(only[0].seed, runs[4].seed);
    }

    #[test]
    fn the_next_window_sweep_judges_window_mode_inside_the_bound_and_durable_mode_everywhere() {
        let (spec, _) = ExpSpec::load("next-window").unwrap();
        let runs = spec.plan(None, None).unwrap();
        let of = |label: &str| {
            let run = runs
                .iter()
                .find(|r| r.label == label)
                .unwrap_or_else(|| panic!("no run {label}"));
            spec.expectation(run)
        };
        assert_eq!(runs.len(), 12);
        assert_eq!(of("pg-lease-drift+0.00-window"), Expect::Pass);
        assert_eq!(of("pg-lease-drift-0.01-window"), Expect::Pass);
        assert_eq!(of("pg-lease-faketime0.995-window"), Expect::Pass);
        assert_eq!(
            of("pg-lease-drift-0.40-window"),
            Expect::Any,
            "beyond the bound: counted"
        );
        assert_eq!(of("pg-lease-faketime0.800-window"), Expect::Any);
        assert_eq!(
            of("pg-lease-drift-0.40-durable"),
            Expect::Pass,
            "the fence alone suffices"
        );
        assert_eq!(of("pg-lease-faketime0.800-durable"), Expect::Pass);
        // The read-lease experiment's lease reads stay unjudged beyond the bound.
        let (reads, _) = ExpSpec::load("read-lease").unwrap();
        let beyond = reads
            .plan(None, None)
            .unwrap()
            .into_iter()
            .find(|r| r.label == "pg-lease-drift-0.40")
            .unwrap();
        assert_eq!(reads.expectation(&beyond), Expect::Any);
    }

    #[test]
    fn the_detector_experiment_runs_lease_and_swim_per_backend_on_one_schedule() {
        let (spec, _) = ExpSpec::load("detector").unwrap();
        let runs = spec.plan(None, None).unwrap();
        let labels: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "pg-lease-lease",
                "pg-lease-swim",
                "redis-lease",
                "redis-swim",
                "etcd-lease",
                "etcd-swim",
                "zk-lease",
                "zk-swim"
            ]
        );
        use baton::config::DetectorKind;
        assert_eq!(runs[0].detector, Some(DetectorKind::Lease));
        assert_eq!(runs[1].detector, Some(DetectorKind::Swim));
        // (run.rs's tests check that a swim run's node config turns the detector on.)
        // The same faults in both runs of a backend: the schedule is the spec's, not the seed's.
        assert!(spec.faults.iter().all(|f| f.jitter_ms == 0));
    }

    #[test]
    fn the_detector_variants_sweep_neighbours_and_keep_one_schedule() {
        let (spec, _) = ExpSpec::load("detector-neighbour").unwrap();
        let runs = spec.plan(Some(&[BackendKind::Redis]), None).unwrap();
        let labels: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "redis-lease-steady15",
                "redis-swim-steady15",
                "redis-lease-bursty15",
                "redis-swim-bursty15"
            ]
        );
        assert_eq!(
            runs[1].neighbour,
            Some(NeighbourCfg {
                cpu_percent: 15,
                slice_ms: 10
            })
        );
        assert_eq!(runs[3].neighbour.map(|n| n.slice_ms), Some(0));
        // No pause or partition beside the neighbour: a false failover is the neighbour's.
        assert!(spec
            .faults
            .iter()
            .all(|f| f.kind == FaultKind::KillLeader && f.jitter_ms == 0));
        // (faults.rs's tests check the kill and pause schedules these specs draw.)
        let bad = toml::from_str::<ExpSpec>(
            r#"
            name = "t"
            backends = ["etcd"]
            seed = 1
            duration = "5s"
            [[neighbours]]
            cpu_percent = 0
            [load]
            rate = 10.0
        "#,
        )
        .unwrap();
        assert!(bad.validate().is_err());
    }
}
