//! Node configuration: a TOML file (`config/*.toml`) overlaid by command-line flags.
//!
//! Timing is validated when the config is built, in the spirit of client-go's leaderelection:
//! `lease_ttl > renew_interval > retry_interval`, and the lease, less the watchdog's safety
//! margin, must hold three renewal intervals plus 5 ms, so that after each renewal two more may
//! fail or come late before the watchdog demotes the leader. A config that fails this never
//! starts a node. The timing defaults are the backend's ([`NodeConfig::for_backend`]), also for
//! a config file that names a backend and leaves its timing out.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::elector::BackendKind;

/// Why a config was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file (or a secret file it names) could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A file the config names (a TLS certificate, key or CA) could not be read.
    #[error("cannot read {option} {path}: {source}")]
    File {
        /// The option that names it, e.g. `[http] tls_key_file`.
        option: &'static str,
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The config file is not valid TOML for a [`NodeConfig`].
    #[error("cannot parse config {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        source: toml::de::Error,
    },
    /// A duration flag that [`parse_duration_ms`] cannot read.
    #[error("invalid duration {0:?}: use e.g. 3s, 250ms or a plain number of milliseconds")]
    Duration(String),
    /// Lease timing that cannot be safe (see the module docs).
    #[error("invalid timing: {0}")]
    Timing(String),
    /// Any other refused setting.
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// Whether the fenced resource checks tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fencing {
    /// The resource refuses a write with a stale token (the only setting for production).
    On,
    /// Exists only to prove fencing is load-bearing: the resource accepts any token.
    Off,
}

impl std::str::FromStr for Fencing {
    type Err = String;
    fn from_str(s: &str) -> Result<Fencing, String> {
        match s {
            "on" => Ok(Fencing::On),
            "off" => Ok(Fencing::Off),
            _ => Err(format!("fencing must be on or off, not {s:?}")),
        }
    }
}

/// How the sequencer makes an ID safe to answer (`[sequencer] mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SequencerMode {
    /// Every ID is durable in PostgreSQL (a fenced group commit) before its answer; real-time
    /// order across leaders holds whatever the clocks do.
    #[default]
    Durable,
    /// The leader persists an upper bound a window ahead through the fence and serves IDs from
    /// memory below it, only inside its lease-read window; real-time order across leaders holds
    /// only while the clock-rate bound does.
    Window,
}

impl SequencerMode {
    /// `durable` or `window`.
    pub fn as_str(self) -> &'static str {
        match self {
            SequencerMode::Durable => "durable",
            SequencerMode::Window => "window",
        }
    }
}

/// The most IDs one window-mode extension may persist ahead: the fence's own default bound on
/// one sequence write (`baton.settings.max_seq_advance`, 2^24).
pub const MAX_WINDOW_IDS: u64 = 16_777_216;

/// How `GET /read` establishes that its answer is not stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadMode {
    /// From the leader's memory, no round trip, only inside the lease window
    /// ([`lease_read_until`]); outside it, falls back to `quorum`.
    Lease,
    /// A linearizable leadership check with the election backend first, then from memory.
    Quorum,
    /// One read of the fenced resource (PostgreSQL), which is always linearizable.
    Resource,
}

impl ReadMode {
    /// `lease`, `quorum` or `resource`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadMode::Lease => "lease",
            ReadMode::Quorum => "quorum",
            ReadMode::Resource => "resource",
        }
    }
}

impl std::str::FromStr for ReadMode {
    type Err = String;
    fn from_str(s: &str) -> Result<ReadMode, String> {
        match s {
            "lease" => Ok(ReadMode::Lease),
            "quorum" => Ok(ReadMode::Quorum),
            "resource" => Ok(ReadMode::Resource),
            _ => Err(format!(
                "read mode must be lease, quorum or resource, not {s:?}"
            )),
        }
    }
}

impl std::fmt::Display for ReadMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The end of the window in which a leader may answer a `lease` read from memory: the largest
/// `now` with `now < deadline - (rate_bound x (now - sent_at) + margin)`, i.e.
/// `sent_at + (deadline - sent_at - margin) / (1 + rate_bound)`.
///
/// `sent_at` is when the last successful renewal was *sent* and `deadline` the watchdog's deadline
/// for it (both on the monotonic clock), `rate_bound` the configured clock-rate error
/// ([`NodeConfig::clock_rate_error`]) and `margin` [`NodeConfig::read_lease_margin_ms`]. The
/// window is only as good as `rate_bound`: a clock that runs slower than it puts `deadline`
/// past the backend's real expiry, and the window with it (the read-lease experiment shows it).
/// `None` when the window is already empty.
pub fn lease_read_until(
    sent_at: std::time::Instant,
    deadline: std::time::Instant,
    rate_bound: f64,
    margin: Duration,
) -> Option<std::time::Instant> {
    let span = deadline
        .checked_duration_since(sent_at)?
        .checked_sub(margin)?;
    if span.is_zero() {
        return None;
    }
    Some(sent_at + span.div_f64(1.0 + rate_bound.max(0.0)))
}

/// How many renewal intervals the usable part of a lease must hold (see
/// [`NodeConfig::min_usable_lease_ms`]): after each renewal the watchdog outlasts two more
/// renewals that fail or come late (a busy host, a slow store) before it demotes the leader.
pub const RENEWALS_PER_USABLE_LEASE: u64 = 3;

/// What the usable part of a lease must hold beyond [`RENEWALS_PER_USABLE_LEASE`] renewal
/// intervals: time for the third renewal's answer to come back.
pub const RENEWAL_SLACK_MS: u64 = 5;

/// The spread of the election timeout [`NodeConfig::fit_stop_margin`] writes (`T-(T+200)`): room
/// for the followers' random stand-off (20 ms per other voter), and no more, since raft's
/// failover waits out the maximum.
pub const STOP_MARGIN_ELECTION_SPREAD_MS: u64 = 200;

/// The most shards a fleet may run (each is a full term with its own backend session).
pub const MAX_SHARDS: u32 = 4096;

/// One node's whole configuration (`config/*.toml`, overlaid by flags). Every field has a
/// default; [`NodeConfig::validate`] refuses combinations that cannot be safe.
///
/// The timing keys' defaults ([`BACKEND_TIMING_KEYS`]) are the named backend's: TOML (or any
/// self-describing format) that says `backend = "pg-lease"` and sets no timing reads as
/// [`NodeConfig::for_backend`]`(PgLease)`'s 3 s lease, not raft's 150 ms one; keys it sets keep
/// their values. Without a `backend` key the backend is raft, with [`NodeConfig::default`]'s
/// timing.
#[derive(Clone, Debug, Serialize, Deserialize)]
// `remote = "Self"`: the derives become the inherent `NodeConfig::deserialize` / `serialize`
// (the field-by-field work), and the trait impls below wrap them to apply the backend's timing.
#[serde(default, deny_unknown_fields, remote = "Self")]
pub struct NodeConfig {
    /// This node's id: 1-64 of `[A-Za-z0-9_-]`, unique in the fleet; the fence's holder.
    pub node_id: String,
    /// The election backend (default `raft`: see [`NodeConfig::for_backend`] for the others).
    pub backend: BackendKind,
    /// Where this node's HTTP server listens.
    pub http_listen: SocketAddr,
    /// The address other nodes and clients should use (defaults to the bound address).
    pub advertise_addr: Option<String>,
    /// How long a granted lease lasts. On raft with one shard the raft leader's lease, capped at
    /// the minimum election timeout; on sharded raft (`[shards] count` > 1) each shard's lease
    /// in the raft group's lease table, not capped (`config/raft-shards.toml`: 3000). Its
    /// default is the backend's: 150 on raft, 3000 on the others.
    pub lease_ttl_ms: u64,
    /// How often the leader renews its lease: the usable lease (the lease less the safety
    /// margin) must hold 3 of these + 5 ms (see [`NodeConfig::validate`]). Its default is the
    /// backend's: 40 on raft, 600 on zk, 800 on the others.
    pub renew_interval_ms: u64,
    /// How often a follower retries a campaign, and a failed renewal is retried. Its default is
    /// the backend's: 20 on raft, 250 on the others.
    pub retry_interval_ms: u64,
    /// The largest clock-rate error the lease arithmetic tolerates (0.01 = 1%).
    pub clock_rate_error: f64,
    /// A fixed margin subtracted from every lease deadline on top of the rate error. Its
    /// default is the backend's: 20 on raft, 100 on the others.
    pub deadline_margin_ms: u64,
    /// How `GET /read` is answered when the request names no `?mode=`.
    pub read_mode_default: ReadMode,
    /// A `lease` read is answered from memory only while
    /// `now < lease_deadline - (clock_rate_error x elapsed_since_renew_send + read_lease_margin_ms)`
    /// (see [`lease_read_until`]); outside it the read falls back to `quorum`.
    pub read_lease_margin_ms: u64,
    /// Offset of this node's wall clock (experiments only; wall time never decides a lease).
    pub clock_skew_ms: i64,
    /// Injected rate error of this node's clock (experiments only).
    pub clock_drift: f64,
    /// Raft election timeout range in ms, "min-max".
    pub election_timeout_ms: String,
    /// Whether the fenced resource checks tokens (`off` only to show what fencing prevents).
    pub fencing: Fencing,
    /// How long demotion waits for each leader-work actor to stop before killing it.
    pub work_stop_timeout_ms: u64,
    /// Extra time taken off every lease deadline so that leader work which needs time to stop
    /// (an external program: `baton run --child-stop-margin`) has stopped before the lease could
    /// expire: the watchdog demotes this much earlier. 0 by default.
    pub work_stop_margin_ms: u64,
    /// Bearer token required by `POST /stepdown` when set; required when `http_listen` is not
    /// loopback. Never printed (`Debug` redacts it) and never in [`NodeConfig::redacted_json`].
    pub admin_token: Option<Secret>,
    /// Where this node keeps its state (raft log, actor trace).
    pub state_dir: PathBuf,
    /// `[etcd]`: the etcd backend.
    pub etcd: EtcdConfig,
    /// `[raft]`: the embedded raft backend.
    pub raft: RaftConfig,
    /// `[redis]`: the redis and redis-naive backends.
    pub redis: RedisConfig,
    /// `[zk]`: the ZooKeeper backend.
    pub zk: ZkConfig,
    /// `[pg_lease]`: the pg-lease backend.
    pub pg_lease: PgLeaseConfig,
    /// `[resource]`: the fenced resource (PostgreSQL).
    pub resource: ResourceConfig,
    /// `[scheduler]`: the built-in scheduler job.
    pub scheduler: SchedulerConfig,
    /// `[sequencer]`: the built-in ID sequencer behind `POST /next`.
    pub sequencer: SequencerConfig,
    /// `[http]`: the client HTTP server's limits and TLS.
    pub http: HttpConfig,
    /// `[shards]`: how many independent terms of leadership the fleet runs, and placement.
    pub shards: ShardsConfig,
    /// `[term_backoff]`: how long this node waits before campaigning again after terms whose
    /// leader work failed.
    pub term_backoff: TermBackoffConfig,
    /// `[failure_budget]`: how many failed terms a shard may spend, fleet-wide, within a window
    /// before every node stops campaigning for it until the window passes or `baton budget
    /// reset` (counted in the fenced resource; a node that cannot read it backs off locally only).
    pub failure_budget: FailureBudgetConfig,
    /// `[detector]`: how a dead leader is noticed: by its lease running out (`lease`, the
    /// default) or, sooner, by a SWIM gossip failure detector (`swim`, cargo feature `swim`).
    pub detector: DetectorConfig,
}

/// Which failure detector a node runs (`[detector] kind`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DetectorKind {
    /// No detector: a dead leader is replaced when its lease runs out (the behaviour before
    /// the detector existed).
    #[default]
    Lease,
    /// A SWIM member per node (UDP, every datagram MACed with the cluster secret): when it
    /// confirms the leader dead, the others end its lease in the backend and campaign at once.
    Swim,
}

/// One member of the detector's gossip group: its node id and UDP `ip:port`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DetectorPeer {
    /// The member's node id.
    pub id: String,
    /// `ip:port` of the member's detector socket (UDP).
    pub addr: String,
}

/// `[detector]`: the failure detector. With `swim` the datagrams are authenticated with the
/// cluster secret (`[raft] cluster_secret` or `cluster_secret_file`, whatever the backend).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DetectorConfig {
    /// `lease` (default) or `swim`.
    pub kind: DetectorKind,
    /// Where this node's detector socket binds (UDP); defaults to this node's `addr` in `peers`.
    pub bind: Option<SocketAddr>,
    /// Every member of the gossip group, this node included. Datagrams from anyone else are
    /// dropped (and counted), and this node sends to nobody else.
    pub peers: Vec<DetectorPeer>,
    /// How often each member probes one other member (SWIM's protocol period). Lower finds a
    /// dead leader sooner and sends more datagrams (about 2 per member per period).
    pub probe_period_ms: u64,
    /// How long a direct probe waits for its ack before asking others to probe indirectly.
    pub probe_rtt_ms: u64,
    /// How long a member stays suspected (refutable by the member itself) before it is
    /// confirmed down. Too low, and a member that stalls this long is declared dead.
    pub suspect_ms: u64,
    /// How far a datagram's timestamp may be from this node's clock, either way; older or
    /// newer ones are dropped as stale (replays inside it are caught by sequence numbers).
    pub window_ms: u64,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig {
            kind: DetectorKind::Lease,
            bind: None,
            peers: Vec::new(),
            probe_period_ms: 150,
            probe_rtt_ms: 60,
            suspect_ms: 200,
            window_ms: 10_000,
        }
    }
}

impl DetectorConfig {
    fn validate(&self, node_id: &str) -> Result<(), ConfigError> {
        if self.kind == DetectorKind::Lease {
            return Ok(());
        }
        if !cfg!(feature = "swim") {
            return Err(ConfigError::Invalid(
                "[detector] kind = \"swim\" needs baton built with `--features swim`".into(),
            ));
        }
        if !self.peers.iter().any(|p| p.id == node_id) && self.bind.is_none() {
            return Err(ConfigError::Invalid(format!(
                "[detector] peers does not list this node ({node_id:?}) and bind is not set"
            )));
        }
        for p in &self.peers {
            if p.addr.parse::<SocketAddr>().is_err() {
                return Err(ConfigError::Invalid(format!(
                    "[detector] peer {:?}: addr {:?} is not an ip:port",
                    p.id, p.addr
                )));
            }
        }
        if self.peers.len() > 256 {
            return Err(ConfigError::Invalid("[detector] at most 256 peers".into()));
        }
        if !(10..=10_000).contains(&self.probe_period_ms)
            || self.probe_rtt_ms == 0
            || self.probe_rtt_ms >= self.probe_period_ms
        {
            return Err(ConfigError::Invalid(format!(
                "[detector] need 10 <= probe_period_ms <= 10000 and 0 < probe_rtt_ms < probe_period_ms, got {} and {}",
                self.probe_period_ms, self.probe_rtt_ms
            )));
        }
        if self.suspect_ms == 0 || !(1000..=300_000).contains(&self.window_ms) {
            return Err(ConfigError::Invalid(format!(
                "[detector] need suspect_ms > 0 and 1000 <= window_ms <= 300000, got {} and {}",
                self.suspect_ms, self.window_ms
            )));
        }
        Ok(())
    }
}

/// One member of a sharded fleet, for placement: its id and its client HTTP address (probed
/// with `GET /healthz` to tell live members from dead ones).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MemberSpec {
    /// The member's node id.
    pub id: String,
    /// `host:port` of the member's client HTTP server.
    pub addr: String,
}

/// `[shards]`: K shards, each a full term (own election, token, watchdog and fence row),
/// spread over the live members by balanced rendezvous hashing (see [`crate::shard`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShardsConfig {
    /// K, the number of shards (1: one leader for the fleet, today's behaviour).
    pub count: u32,
    /// Every member that may own shards, this node included (K > 1 only). Empty: the raft
    /// peers' ids and client addresses.
    pub members: Vec<MemberSpec>,
    /// How often each member's `GET /healthz` is probed.
    pub probe_interval_ms: u64,
    /// A member that has not answered a probe for this long is not live: its shards are
    /// placed elsewhere (the backend still waits out its lease before a new owner wins).
    /// Counting a member dead long before its leases could expire gains little (nobody can win
    /// its shards sooner) and costs hand-overs when a loaded member answers late: the default
    /// is two thirds of the lease backends' 3 s TTL (1 s moved shards back and forth on a
    /// saturated 2-core machine, where `/healthz` is served at nice 5 behind the timers).
    pub down_after_ms: u64,
    /// A shard with no known leader is campaigned for, whatever the placement says, by the live
    /// members in their rendezvous order for it: the member ranked r after `r x` this long (at
    /// least once this long), so a disagreement between views does not leave a shard dark, and
    /// a slow start does not draw every member into every election at once.
    pub orphan_grace_ms: u64,
}

impl Default for ShardsConfig {
    fn default() -> Self {
        ShardsConfig {
            count: 1,
            members: Vec::new(),
            probe_interval_ms: 200,
            down_after_ms: 2000,
            orphan_grace_ms: 1500,
        }
    }
}

/// `[term_backoff]`: after a term whose leader work failed, this node waits before campaigning
/// again, `base_ms x 2^(failed terms in a row - 1)` up to `max_ms`, stretched by up to 20% at
/// random (see `actors::backoff`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TermBackoffConfig {
    /// The wait after one failed term; 0 turns the wait off (failures are still logged and
    /// counted).
    pub base_ms: u64,
    /// The longest wait.
    pub max_ms: u64,
    /// A failed term that had run at least this long starts a new streak instead of extending
    /// the last one (work that fails once a day is not crash-looping).
    pub reset_after_ms: u64,
}

impl Default for TermBackoffConfig {
    fn default() -> Self {
        TermBackoffConfig {
            base_ms: 1000,
            max_ms: 60_000,
            reset_after_ms: 60_000,
        }
    }
}

/// `[failure_budget]`: a fleet-wide limit on failed terms, counted per shard in the fenced
/// resource so every node sees the same count. Once `failed_terms` terms of a shard have failed
/// (its leader work failed, see `[term_backoff]`) within `window_ms` by the resource's clock, no
/// node campaigns for that shard, and each says so (WARN with the last failure, `/status`,
/// `baton_failure_budget_exhausted`), until enough of them have left the window or an operator
/// runs `baton budget reset`. Only the term's own leader can record its failure (the record is
/// fenced). A node that cannot reach the resource, or whose resource lacks the budget's schema
/// (`baton migrate`), backs off locally only.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailureBudgetConfig {
    /// Failed terms within the window that exhaust the budget; 0 turns the budget off
    /// (`[term_backoff]` alone then slows a failing work down).
    pub failed_terms: u32,
    /// The window the failed terms are counted in (1 s to 7 days).
    pub window_ms: u64,
    /// How often a node that holds off asks the resource again (and at the latest when the
    /// budget should reopen): how soon a reset takes effect.
    pub recheck_ms: u64,
}

impl Default for FailureBudgetConfig {
    fn default() -> Self {
        FailureBudgetConfig {
            failed_terms: 5,
            window_ms: 600_000,
            recheck_ms: 5_000,
        }
    }
}

/// The longest `[failure_budget] window_ms` (the resource keeps failed terms this long).
pub const MAX_FAILURE_BUDGET_WINDOW_MS: u64 = 7 * 24 * 3600 * 1000;
/// The most `[failure_budget] failed_terms` (the resource's own bound).
pub const MAX_FAILURE_BUDGET_TERMS: u32 = 10_000;

impl FailureBudgetConfig {
    /// Whether the budget is on (`failed_terms > 0`).
    pub fn enabled(&self) -> bool {
        self.failed_terms > 0
    }

    /// The window.
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }

    /// The recheck interval.
    pub fn recheck(&self) -> Duration {
        Duration::from_millis(self.recheck_ms)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled() {
            return Ok(());
        }
        let d = FailureBudgetConfig::default();
        if self.failed_terms > MAX_FAILURE_BUDGET_TERMS {
            return Err(ConfigError::Invalid(format!(
                "[failure_budget] failed_terms ({}) must be at most {MAX_FAILURE_BUDGET_TERMS} (0 turns the budget off), e.g. failed_terms = {}",
                self.failed_terms, d.failed_terms
            )));
        }
        if !(1000..=MAX_FAILURE_BUDGET_WINDOW_MS).contains(&self.window_ms) {
            return Err(ConfigError::Invalid(format!(
                "[failure_budget] window_ms ({}) must be from 1000 (1 s) to {MAX_FAILURE_BUDGET_WINDOW_MS} (7 days), e.g. window_ms = {}",
                self.window_ms, d.window_ms
            )));
        }
        if !(100..=self.window_ms).contains(&self.recheck_ms) {
            return Err(ConfigError::Invalid(format!(
                "[failure_budget] recheck_ms ({}) must be from 100 to window_ms ({}), e.g. recheck_ms = {}",
                self.recheck_ms,
                self.window_ms,
                d.recheck_ms.min(self.window_ms)
            )));
        }
        Ok(())
    }
}

/// A credential (the admin token, the raft cluster secret): serialized as the plain string (node
/// config files must carry it; `baton fleet` writes them 0600), but `Debug` never shows it, so a
/// `{:?}` of a config in a log cannot leak it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }
    /// The secret itself, for the one comparison (or config file) that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Secret {
        Secret(value)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Shortest admin token accepted: a guessable token is no guard.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 16;

/// Most client-serving threads `[http] threads` may ask for.
const MAX_HTTP_THREADS: usize = 64;

/// Bounds on what one client may hold of the node's HTTP server: a client that
/// trickles headers or a body, or never sends one, is cut off instead of holding a descriptor.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Client connections served at once; past it a new connection is answered 503 and closed.
    /// The node also keeps it below half the descriptor soft limit (see `http::connection_cap`).
    pub max_connections: usize,
    /// Time to receive a whole request head. hyper starts this clock whenever a connection waits
    /// for a request, so it is also the idle keep-alive bound.
    pub header_read_timeout_ms: u64,
    /// Time to receive a whole request body once the head is in.
    pub body_read_timeout_ms: u64,
    /// Largest request body a client route accepts (413 past it).
    pub max_body_bytes: usize,
    /// Bound on one request from head to response (a stalled handler answers 503 and closes).
    /// Must exceed the step-down bound, which `POST /stepdown` waits for.
    pub request_timeout_ms: u64,
    /// A leader whose accept loop fails (e.g. out of descriptors) for this long steps down:
    /// it cannot serve its clients, and its followers would otherwise keep following it.
    pub accept_failure_stepdown_ms: u64,
    /// The nice value of the thread that serves clients (0..=19; higher yields more). Above the
    /// node's own threads by default, so when clients saturate the machine the kernel runs this
    /// node's heartbeats, renewals and watchdog, and its peers' (in this or another process),
    /// before more client requests: overload slows clients down instead of moving leadership.
    pub thread_nice: i32,
    /// Threads that serve clients, each with its own single-threaded runtime accepting on the
    /// same listener (they share `max_connections`). 0, the default, means half the cores this
    /// process may use, at least 1: one thread on a 2-core machine, where a second would take
    /// the core PostgreSQL and the node's own runtime need; more where there are cores to
    /// spare, since one thread tops out near 100k requests/s. At most 64.
    pub threads: usize,
    /// Threads of their own for the sequencers' group commits (0..=64). Unset, the default: one
    /// when the node runs one shard and the server has 4 or more client threads (8 cores or
    /// more), else none (K > 1 shards' commit paths spread over the client threads, the layout
    /// `experiments/FINDINGS.md` measured scaling with K; one thread for all of them was not). None (0): a
    /// shard's commit path (its sequencer, commit loop and database connection) runs on one of
    /// the client threads, shard s on thread s mod `threads`, so on a one-thread server a
    /// request crosses no thread inside the node. N > 0: N more threads, `baton-commit-i`,
    /// shard s on commit thread s mod N. A commit loop on a client thread waits, after each
    /// commit, behind that thread's own requests, a wait that grows with the load: on 16 cores
    /// a thread of its own halved the commit cycle and took durable `/next` at 500k offered
    /// from 477k IDs/s (p99 382 ms) to 499k (p99 6.8 ms) (`experiments/FINDINGS.md`).
    pub commit_threads: Option<usize>,
    /// PEM certificate chain to serve HTTPS with (feature `tls`); with `tls_key_file`, the
    /// server speaks HTTPS only. The TLS handshake must complete within `header_read_timeout_ms`.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file` (PKCS#8, PKCS#1 or SEC1). Keep it 0600; never logged.
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA bundle that the other members' HTTPS certificates must chain to (feature `tls`),
    /// for what this node asks them over their client API: placement's `/healthz` probes
    /// (needed with `tls_cert_file` when `[shards] count` > 1) and the fleet page's `/status`
    /// sweep. A member's certificate must name the host of its address in `[shards] members`
    /// (or the raft peers' `http_addr`).
    pub member_ca_file: Option<PathBuf>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_connections: 1024,
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 10_000,
            max_body_bytes: 1024,
            request_timeout_ms: 60_000,
            accept_failure_stepdown_ms: 5_000,
            thread_nice: 5,
            threads: 0,
            commit_threads: None,
            tls_cert_file: None,
            tls_key_file: None,
            member_ca_file: None,
        }
    }
}

impl HttpConfig {
    /// [`HttpConfig::header_read_timeout_ms`] (also the TLS handshake bound).
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }
    /// [`HttpConfig::body_read_timeout_ms`].
    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }
    /// [`HttpConfig::request_timeout_ms`].
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
    /// [`HttpConfig::accept_failure_stepdown_ms`].
    pub fn accept_failure_stepdown(&self) -> Duration {
        Duration::from_millis(self.accept_failure_stepdown_ms)
    }
    /// [`HttpConfig::threads`] resolved against the cores available (`cores`): the setting if
    /// it is not 0, else half of them, at least 1.
    pub fn server_threads(&self, cores: usize) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            (cores / 2).max(1)
        }
    }

    /// [`HttpConfig::commit_threads`] resolved against the cores available (`cores`) and the
    /// node's shard count (`shards`).
    pub fn commit_threads(&self, cores: usize, shards: usize) -> usize {
        let auto = shards == 1 && self.server_threads(cores) >= 4;
        self.commit_threads.unwrap_or(usize::from(auto))
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(format!("[http] {m}")));
        if self.max_connections == 0 {
            return bad("max_connections must be > 0".into());
        }
        for (name, v) in [
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("request_timeout_ms", self.request_timeout_ms),
            (
                "accept_failure_stepdown_ms",
                self.accept_failure_stepdown_ms,
            ),
        ] {
            if v == 0 {
                return bad(format!("{name} must be > 0"));
            }
        }
        if self.max_body_bytes == 0 || self.max_body_bytes > 1024 * 1024 {
            return bad("max_body_bytes must be in 1..=1048576".into());
        }
        if !(0..=19).contains(&self.thread_nice) {
            return bad(format!(
                "thread_nice must be in 0..=19 (a client thread never runs above the node's own), got {}",
                self.thread_nice
            ));
        }
        if self.threads > MAX_HTTP_THREADS {
            return bad(format!(
                "threads must be in 0..={MAX_HTTP_THREADS} (0: half the cores), got {}",
                self.threads
            ));
        }
        if let Some(n) = self.commit_threads.filter(|n| *n > MAX_HTTP_THREADS) {
            return bad(format!(
                "commit_threads must be in 0..={MAX_HTTP_THREADS} (0: on the client threads), got {n}"
            ));
        }
        Ok(())
    }
}

/// `[etcd]`: the etcd backend's cluster and election.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdConfig {
    /// Client URLs of the cluster's members (`https://` with `tls_ca_file`).
    pub endpoints: Vec<String>,
    /// The election name; `etcdctl elect NAME` on the same name interoperates.
    pub election_name: String,
    /// Bound on each request (and on connecting).
    pub request_timeout_ms: u64,
    /// PEM CA bundle that etcd's server certificates must chain to (feature `tls`); the
    /// endpoints must then be `https://`.
    pub tls_ca_file: Option<PathBuf>,
}

/// One member of a raft fleet.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PeerSpec {
    /// The member's node id.
    pub id: String,
    /// `host:port` of the member's client HTTP server (where followers redirect clients).
    pub addr: String,
    /// `host:port` of the member's raft peer listener (`POST /peer/...`, authenticated).
    pub peer_addr: String,
}

/// `[raft]`: the embedded raft group.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftConfig {
    /// Every member, this node included.
    pub peers: Vec<PeerSpec>,
    /// How often the raft leader sends heartbeats (0: the default, 50 ms); at most half the
    /// minimum election timeout.
    pub heartbeat_interval_ms: u64,
    /// Where this node's raft peer listener binds; defaults to this node's `peer_addr` in
    /// `peers`. Never the client port: peer RPC has its own listener.
    pub peer_listen: Option<SocketAddr>,
    /// The shared cluster secret keying every peer request's HMAC. Required whenever the group
    /// has more than one member or the peer listener is not on loopback.
    pub cluster_secret: Option<Secret>,
    /// The cluster secret read from this file instead (surrounding whitespace trimmed; keep it
    /// 0600, the same on every member). Set this or `cluster_secret`, not both.
    pub cluster_secret_file: Option<PathBuf>,
}

impl RaftConfig {
    /// The configured cluster secret, read from the file if that is how it was given.
    pub fn secret(&self) -> Result<Option<Secret>, ConfigError> {
        match (&self.cluster_secret, &self.cluster_secret_file) {
            (Some(_), Some(_)) => Err(ConfigError::Invalid(
                "raft: set cluster_secret or cluster_secret_file, not both".into(),
            )),
            (Some(s), None) => Ok(Some(s.clone())),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                Ok(Some(Secret::new(text.trim())))
            }
            (None, None) => Ok(None),
        }
    }
}

/// `[redis]`: the redis backends' server and lock key.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://host:port/` or, over TLS, `rediss://host:port/`.
    pub url: String,
    /// The lock key; the fenced variant keeps its token counter at `<key>:token`.
    pub key: String,
    /// Bound on each request (and on connecting).
    pub request_timeout_ms: u64,
    /// PEM CA bundle that the server's certificate must chain to (feature `tls`); the URL must
    /// then be `rediss://`.
    pub tls_ca_file: Option<PathBuf>,
    /// Redis Sentinel addresses (`host:port`). When set, the backend asks them which server is
    /// `master_name`'s primary and talks to that one, and asks again after a connection error or
    /// a `READONLY` answer (a failover), without a restart. `url` then gives only how to talk to
    /// the primary: `redis://` or `rediss://` (TLS to the primary and to the Sentinels, verified
    /// against `tls_ca_file`), the user and password, the database; its host and port are not
    /// used. A token counter (the `redis` backend) can go back after a failover to a replica that
    /// lacked the last `INCR`s: the fenced resource refuses such a token (README).
    pub sentinels: Vec<String>,
    /// The name the Sentinels monitor the primary under (their `sentinel monitor NAME ...`);
    /// required with `sentinels`.
    pub master_name: Option<String>,
    /// The password the Sentinels themselves ask for (their `requirepass`), sent with `AUTH` on
    /// every Sentinel connection. Only with `sentinels`. The data servers' password is `url`'s,
    /// which the Sentinels reach them with through their own `sentinel auth-pass`.
    pub sentinel_password: Option<Secret>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: "redis://127.0.0.1:6379/".into(),
            key: "baton:leader".into(),
            request_timeout_ms: 1000,
            tls_ca_file: None,
            sentinels: Vec::new(),
            master_name: None,
            sentinel_password: None,
        }
    }
}

impl RedisConfig {
    /// The Sentinel options: every address a `host:port` with a port, a master name with them
    /// (and only with them), a `url` that still parses (it carries the primary's scheme and
    /// credentials).
    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(format!("[redis] {m}")));
        match (&self.master_name, self.sentinels.is_empty()) {
            (None, false) => {
                return bad(
                    "sentinels needs master_name: the name the Sentinels monitor the primary under (their `sentinel monitor NAME host port quorum`)".into(),
                )
            }
            (Some(_), true) => {
                return bad(
                    "master_name is set but sentinels is empty: list the Sentinels' host:port addresses, or remove master_name for a single Redis at url".into(),
                )
            }
            (Some(name), false) if name.is_empty() || name.chars().any(char::is_whitespace) => {
                return bad(format!(
                    "master_name {name:?} must be non-empty, without whitespace"
                ))
            }
            _ => {}
        }
        if self.sentinel_password.is_some() && self.sentinels.is_empty() {
            return bad(
                "sentinel_password is set but sentinels is empty: it is the Sentinels' own password"
                    .into(),
            );
        }
        for s in &self.sentinels {
            let port = s
                .rsplit_once(':')
                .filter(|(host, _)| !host.is_empty() && !host.contains('/'))
                .and_then(|(_, port)| port.parse::<u16>().ok())
                .filter(|&p| p > 0);
            if port.is_none() {
                return bad(format!(
                    "sentinels entry {s:?} is not host:port (e.g. \"127.0.0.1:26379\")"
                ));
            }
        }
        Ok(())
    }
}

/// `[zk]`: the ZooKeeper backend's ensemble and election node.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ZkConfig {
    /// `host:port,host:port,...`
    pub connect: String,
    /// The parent znode of the election's sequential candidates.
    pub election_path: String,
    /// Bound on each request (and 3× on establishing a session).
    pub request_timeout_ms: u64,
}

impl Default for ZkConfig {
    fn default() -> Self {
        ZkConfig {
            connect: "127.0.0.1:2181".into(),
            election_path: "/baton/election".into(),
            request_timeout_ms: 1000,
        }
    }
}

/// `[pg_lease]`: the pg-lease backend's database and lease row.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PgLeaseConfig {
    /// The lease store's URL, as the `baton_lease` role (`baton db init --backend pg-lease`
    /// writes it). No default: the pg-lease backend refuses to start without it. May be the
    /// fenced resource's server, but the lease lives in its own table.
    pub database_url: String,
    /// The lease row's name: nodes electing together share it.
    pub lease_name: String,
    /// PEM CA bundle that the server's certificate must chain to (feature `tls`); when set, the
    /// connection must be TLS (`sslmode=require`) and the server is verified.
    pub tls_ca_file: Option<PathBuf>,
}

impl Default for PgLeaseConfig {
    fn default() -> Self {
        PgLeaseConfig {
            database_url: String::new(),
            lease_name: "baton".into(),
            tls_ca_file: None,
        }
    }
}

/// `[resource]`: the fenced resource (PostgreSQL).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourceConfig {
    /// The fenced resource, connected to as the application role (which may only call functions).
    pub database_url: String,
    /// Connections kept to it for claims, ticks and reads; a node that has run the sequencer
    /// keeps one more, its own (see `Fence::seq_pipe`).
    pub pool_size: usize,
    /// Server-side bound on each statement, and on waiting for or making a connection.
    pub statement_timeout_ms: u64,
    /// PEM CA bundle that the server's certificate must chain to (feature `tls`); when set, the
    /// connection must be TLS (`sslmode=require`) and the server is verified.
    pub tls_ca_file: Option<PathBuf>,
}

/// `[scheduler]`: the built-in scheduler job (works through a fenced work-set).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// Whether the leader runs it.
    pub enabled: bool,
    /// Time between ticks.
    pub tick_interval_ms: u64,
    /// Jobs taken from the work-set per tick.
    pub jobs_per_tick: i64,
    /// Publish the cursor through the fence every this many ticks (and always on demotion).
    pub checkpoint_every_ticks: u64,
}

/// `[sequencer]`: the built-in ID sequencer (`POST /next`), group-committed through the fence.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SequencerConfig {
    /// Whether the leader runs it.
    pub enabled: bool,
    /// Upper bound on IDs committed in one group commit.
    pub max_batch_ids: usize,
    /// Largest `?n=` a client may ask for.
    pub max_block: u32,
    /// Group commits sent and not yet answered at once (1..=8), all on one connection so
    /// PostgreSQL runs them in order. With 2 or more, a batch can wait in the database's socket
    /// while the one before it is flushed (one goes behind another only once it carries at
    /// least as many IDs): more IDs/s where commits, not CPU, are the limit (few clients, or
    /// cores to spare). 1, the default: each commit waits for the answer to the last, which on
    /// a saturated 2-core machine is the faster of the two (`experiments/FINDINGS.md`).
    pub commits_in_flight: usize,
    /// The least time between the starts of two group commits sent one after the other
    /// (0..=20). 0, the default: the next commit goes as soon as the last is answered. Above
    /// that, requests arriving sooner wait for the interval to pass and go in one commit: fewer
    /// commits per second under load, each costing PostgreSQL about the same whatever it
    /// carries, for at most this much more latency. An idle sequencer answers at once.
    pub min_commit_interval_ms: u64,
    /// `durable` (the default) or `window`. Durable: every ID is committed through the fence
    /// (a group commit) before its answer, and real-time order across leaders holds whatever the
    /// clocks do. Window (the timestamp oracle of Percolator and TiDB PD): the leader persists an
    /// upper bound `window_ids` ahead through the fence, then answers IDs from memory below it,
    /// only while its lease-read window is open (the bound `GET /read?mode=lease` uses);
    /// unique and increasing per leader unconditionally (a new leader claims above the highest
    /// bound persisted), but real-time order across a change of leader holds only while the
    /// clock-rate bound (`clock_rate_error`) holds. A leader change burns what was left below the
    /// old bound.
    pub mode: SequencerMode,
    /// Window mode: how far ahead of the IDs served the bound is persisted (1..=16777216, and
    /// at most the resource's `max_seq_advance`, 16777216 unless its owner lowered it). The
    /// bound is extended in the background once fewer than half of these are left.
    pub window_ids: u64,
}

/// The default config is the default backend's: raft, with the timing raft accepts. A raft
/// leader may act on a lease no longer than the minimum election timeout (150 ms with the default
/// `150-250`, see `backends::raft`), so it renews every 40 ms (one heartbeat round each) with a
/// 20 ms margin; a 3-node group on loopback needs only `node_id`, `state_dir` (one per node),
/// `raft.peers` and `raft.cluster_secret` on top of it. For another backend start from
/// [`NodeConfig::for_backend`]: a 150 ms lease renewed every 40 ms would make a lease backend's
/// store take a write every 40 ms from the leader and every 20 ms from each follower.
impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            node_id: "n1".into(),
            backend: BackendKind::Raft,
            http_listen: "127.0.0.1:0".parse().unwrap(),
            advertise_addr: None,
            lease_ttl_ms: 150,
            renew_interval_ms: 40,
            retry_interval_ms: 20,
            clock_rate_error: 0.01,
            deadline_margin_ms: 20,
            read_mode_default: ReadMode::Lease,
            read_lease_margin_ms: 50,
            clock_skew_ms: 0,
            clock_drift: 0.0,
            election_timeout_ms: "150-250".into(),
            fencing: Fencing::On,
            work_stop_timeout_ms: 2000,
            work_stop_margin_ms: 0,
            admin_token: None,
            state_dir: PathBuf::from("state/n1"),
            etcd: EtcdConfig::default(),
            raft: RaftConfig::default(),
            redis: RedisConfig::default(),
            zk: ZkConfig::default(),
            pg_lease: PgLeaseConfig::default(),
            resource: ResourceConfig::default(),
            scheduler: SchedulerConfig::default(),
            sequencer: SequencerConfig::default(),
            http: HttpConfig::default(),
            shards: ShardsConfig::default(),
            term_backoff: TermBackoffConfig::default(),
            failure_budget: FailureBudgetConfig::default(),
            detector: DetectorConfig::default(),
        }
    }
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            election_name: "baton".into(),
            request_timeout_ms: 1000,
            tls_ca_file: None,
        }
    }
}

impl Default for ResourceConfig {
    fn default() -> Self {
        ResourceConfig {
            database_url: "postgres://baton_app@127.0.0.1:5432/baton".into(),
            pool_size: 4,
            statement_timeout_ms: 2000,
            tls_ca_file: None,
        }
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            enabled: true,
            tick_interval_ms: 1000,
            jobs_per_tick: 1000,
            checkpoint_every_ticks: 10,
        }
    }
}

impl Default for SequencerConfig {
    fn default() -> Self {
        SequencerConfig {
            enabled: true,
            max_batch_ids: 4096,
            max_block: 1000,
            commits_in_flight: 1,
            min_commit_interval_ms: 0,
            mode: SequencerMode::Durable,
            window_ids: 1_000_000,
        }
    }
}

/// The keys whose default is the backend's ([`NodeConfig::for_backend`]) rather than raft's.
pub const BACKEND_TIMING_KEYS: [&str; 4] = [
    "lease_ttl_ms",
    "renew_interval_ms",
    "retry_interval_ms",
    "deadline_margin_ms",
];

impl Serialize for NodeConfig {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        NodeConfig::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for NodeConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<NodeConfig, D::Error> {
        use serde::de::Error;
        let table = toml::Table::deserialize(deserializer)?;
        let set: Vec<String> = table.keys().cloned().collect();
        let raw = NodeConfig::deserialize(toml::Value::Table(table)).map_err(D::Error::custom)?;
        Ok(raw.with_backend_timing(|key| set.iter().any(|k| k == key)))
    }
}

impl NodeConfig {
    /// This config with the backend's default ([`NodeConfig::for_backend`]) for every key of
    /// [`BACKEND_TIMING_KEYS`] that `is_set` says the source did not set.
    fn with_backend_timing(mut self, is_set: impl Fn(&str) -> bool) -> NodeConfig {
        let b = NodeConfig::for_backend(self.backend);
        for key in BACKEND_TIMING_KEYS.into_iter().filter(|k| !is_set(k)) {
            match key {
                "lease_ttl_ms" => self.lease_ttl_ms = b.lease_ttl_ms,
                "renew_interval_ms" => self.renew_interval_ms = b.renew_interval_ms,
                "retry_interval_ms" => self.retry_interval_ms = b.retry_interval_ms,
                "deadline_margin_ms" => self.deadline_margin_ms = b.deadline_margin_ms,
                _ => unreachable!("every backend timing key is handled"),
            }
        }
        self
    }

    /// The defaults with `backend` and the timing that suits it (the committed
    /// `config/<backend>.toml` use the same, and a config file or TOML text that names a
    /// backend gets this timing for every timing key it does not set): raft's is
    /// [`NodeConfig::default`]; a lease backend (etcd, redis, redis-naive, pg-lease, zk) gets a
    /// 3 s lease renewed every 800 ms (ZooKeeper every 600 ms: each renewal grants only 2/3 of
    /// the session timeout), retried every 250 ms, with a 100 ms margin. Every backend's timing
    /// leaves the watchdog at least 3 renewal intervals + 5 ms after each renewal (see
    /// [`NodeConfig::min_usable_lease_ms`]): 2,870 ms of usable lease for 3 x 800 ms.
    pub fn for_backend(backend: BackendKind) -> NodeConfig {
        let raft = NodeConfig::default();
        if backend == BackendKind::Raft {
            return raft;
        }
        NodeConfig {
            backend,
            lease_ttl_ms: 3000,
            renew_interval_ms: if backend == BackendKind::Zk {
                600
            } else {
                800
            },
            retry_interval_ms: 250,
            deadline_margin_ms: 100,
            ..raft
        }
    }

    /// This config minus what differs per node or per run (ids, addresses, paths, URLs,
    /// secrets): what a benchmark or experiment report records as "the config".
    pub fn redacted_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            for k in [
                "node_id",
                "http_listen",
                "advertise_addr",
                "state_dir",
                "admin_token",
            ] {
                o.remove(k);
            }
            for (section, key) in [
                ("resource", "database_url"),
                ("pg_lease", "database_url"),
                ("etcd", "endpoints"),
                ("redis", "url"),
                ("redis", "sentinels"),
                ("redis", "sentinel_password"),
                ("raft", "peers"),
                ("raft", "peer_listen"),
                ("raft", "cluster_secret"),
                ("raft", "cluster_secret_file"),
                ("zk", "connect"),
                ("resource", "tls_ca_file"),
                ("pg_lease", "tls_ca_file"),
                ("etcd", "tls_ca_file"),
                ("redis", "tls_ca_file"),
                ("http", "tls_cert_file"),
                ("http", "tls_key_file"),
                ("http", "member_ca_file"),
            ] {
                if let Some(s) = o.get_mut(section).and_then(|s| s.as_object_mut()) {
                    s.remove(key);
                }
            }
        }
        v
    }

    /// Reads a TOML config file (unknown keys are errors). The timing keys it does not set
    /// are its backend's defaults ([`NodeConfig::for_backend`]): a file that names
    /// `backend = "pg-lease"` and no timing runs on pg-lease's 3 s lease.
    pub fn from_file(path: &Path) -> Result<NodeConfig, ConfigError> {
        NodeConfig::from_file_as(path, None)
    }

    /// [`NodeConfig::from_file`], with `backend` (when given) in place of the file's own
    /// `backend` key, before the backend's timing defaults fill the keys the file leaves out:
    /// what `--config FILE --backend NAME` means.
    pub fn from_file_as(
        path: &Path,
        backend: Option<BackendKind>,
    ) -> Result<NodeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let parse = |source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        };
        // Parsed straight from the text (not through `Deserialize for NodeConfig`), so that an
        // error names its line and column.
        let table: toml::Table = toml::from_str(&text).map_err(parse)?;
        let mut c = NodeConfig::deserialize(toml::Deserializer::new(&text)).map_err(parse)?;
        if let Some(b) = backend {
            c.backend = b;
        }
        Ok(c.with_backend_timing(|key| table.contains_key(key)))
    }

    /// [`NodeConfig::lease_ttl_ms`].
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }
    /// [`NodeConfig::renew_interval_ms`].
    pub fn renew_interval(&self) -> Duration {
        Duration::from_millis(self.renew_interval_ms)
    }
    /// [`NodeConfig::retry_interval_ms`].
    pub fn retry_interval(&self) -> Duration {
        Duration::from_millis(self.retry_interval_ms)
    }
    /// [`NodeConfig::work_stop_timeout_ms`].
    pub fn work_stop_timeout(&self) -> Duration {
        Duration::from_millis(self.work_stop_timeout_ms)
    }

    /// How much of a granted TTL the node gives up so it stops before the backend expires it:
    /// the clock-rate error over the whole TTL plus a fixed margin, plus the time leader work is
    /// given to stop ([`NodeConfig::work_stop_margin_ms`]).
    pub fn lease_safety_margin(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.clock_rate_error)
            + Duration::from_millis(self.deadline_margin_ms)
            + self.work_stop_margin()
    }

    /// How long after the watchdog's deadline the lease itself can expire, by this node's clock
    /// with the clock-rate error already allowed for: the watchdog stops `deadline_margin_ms` +
    /// `work_stop_margin_ms` before `sent_at + TTL x (1 - clock_rate_error)` (through the same
    /// clock model as the deadline). What an audit of "gone before the lease could expire" adds
    /// to a time measured against the watchdog's deadline.
    pub fn lease_expiry_after_watchdog_deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_margin_ms + self.work_stop_margin_ms)
            .div_f64(1.0 + self.clock_drift)
    }

    /// [`NodeConfig::work_stop_margin_ms`] as a duration.
    pub fn work_stop_margin(&self) -> Duration {
        Duration::from_millis(self.work_stop_margin_ms)
    }

    /// `(min, max)` of the Raft election timeout.
    pub fn election_timeout_range_ms(&self) -> Result<(u64, u64), ConfigError> {
        let bad = || {
            ConfigError::Invalid(format!(
                "election_timeout_ms {:?}: use MIN-MAX in ms",
                self.election_timeout_ms
            ))
        };
        let (lo, hi) = match self.election_timeout_ms.split_once('-') {
            Some((lo, hi)) => (
                lo.trim().parse().map_err(|_| bad())?,
                hi.trim().parse().map_err(|_| bad())?,
            ),
            None => {
                let v: u64 = self.election_timeout_ms.trim().parse().map_err(|_| bad())?;
                (v, v * 2)
            }
        };
        if lo == 0 || lo > hi {
            return Err(bad());
        }
        Ok((lo, hi))
    }

    /// The lease raft grants: `lease_ttl_ms`, capped by the minimum election timeout (see
    /// `backends::raft`: no rival can win sooner, so no longer lease is safe).
    pub fn raft_lease_ttl_ms(&self) -> Result<u64, ConfigError> {
        let (emin, _) = self.election_timeout_range_ms()?;
        Ok(self.lease_ttl_ms.min(emin))
    }

    /// The lease this config's backend grants: [`NodeConfig::raft_lease_ttl_ms`] on raft with
    /// one shard (the raft leader's own lease), `lease_ttl_ms` elsewhere — sharded raft among
    /// them, whose shard leases are judged by the raft leader's clock and need no election bound
    /// (`backends::raft::shards`).
    fn granted_lease_ttl_ms(&self) -> u64 {
        match self.backend {
            BackendKind::Raft if self.shard_count() == 1 => {
                self.raft_lease_ttl_ms().unwrap_or(self.lease_ttl_ms)
            }
            _ => self.lease_ttl_ms,
        }
    }

    /// The least usable lease ([`NodeConfig::check_usable_lease`]) this config's renewal interval
    /// needs: [`RENEWALS_PER_USABLE_LEASE`] renewal intervals plus [`RENEWAL_SLACK_MS`], so that
    /// after each renewal the watchdog waits out two more that fail or come late before it
    /// demotes, and the third still has the slack to be answered in.
    pub fn min_usable_lease_ms(&self) -> u64 {
        self.renew_interval_ms
            .saturating_mul(RENEWALS_PER_USABLE_LEASE)
            .saturating_add(RENEWAL_SLACK_MS)
    }

    /// The smallest granted lease (ms) whose usable part, after this config's safety margin,
    /// still has room for [`NodeConfig::min_usable_lease_ms`] and the lease-read margin.
    pub fn min_working_ttl_ms(&self) -> u64 {
        let need = Duration::from_millis(
            self.min_usable_lease_ms()
                .max(self.read_lease_margin_ms.saturating_add(1)),
        );
        let fixed_ms = self.deadline_margin_ms + self.work_stop_margin_ms;
        let rate = self.clock_rate_error.clamp(0.0, 0.49);
        // The closed form, less a little for rounding, then the exact check upward.
        let mut ttl_ms = ((need.as_millis() as f64 + fixed_ms as f64) / (1.0 - rate)) as u64;
        ttl_ms = ttl_ms.saturating_sub(2);
        let usable = |ms: u64| {
            let ttl = Duration::from_millis(ms);
            ttl.saturating_sub(self.lease_safety_margin(ttl))
        };
        while usable(ttl_ms) < need {
            ttl_ms += 1;
        }
        ttl_ms
    }

    /// Raises this config's lease (and on raft with one shard the election timeout, whose
    /// minimum caps raft's lease) to the least, rounded up to 100 ms, that leaves the watchdog
    /// [`NodeConfig::min_usable_lease_ms`] after a `baton run --child-stop-margin` of
    /// `margin_ms`: what `baton config init --child-stop-margin` writes. A lease that is already
    /// long enough is kept. On raft the election timeout becomes `T-(T+200)` for the lease `T`:
    /// after a leader dies the others wait out openraft's leader lease, the maximum, before one
    /// stands, so failover takes about `T + 200 ms` (a `T-2T` range would double it). The margin
    /// itself is not set: `baton run` sets it from its flag.
    pub fn fit_stop_margin(&mut self, margin_ms: u64) {
        let probe = NodeConfig {
            work_stop_margin_ms: margin_ms,
            ..self.clone()
        };
        let ttl_ms = probe.min_working_ttl_ms().div_ceil(100) * 100;
        self.lease_ttl_ms = self.lease_ttl_ms.max(ttl_ms);
        if self.backend == BackendKind::Raft && self.shard_count() == 1 {
            let emin = self.election_timeout_range_ms().map(|(lo, _)| lo).unwrap_or(0);
            if emin < ttl_ms {
                self.election_timeout_ms =
                    format!("{ttl_ms}-{}", ttl_ms + STOP_MARGIN_ELECTION_SPREAD_MS);
            }
        }
    }

    /// What to raise so the granted lease reaches `ttl_ms`: `lease_ttl_ms` and, on raft, the
    /// minimum election timeout, with the flags that set them.
    fn raise_ttl_advice(&self, ttl_ms: u64) -> String {
        let mut raise = Vec::new();
        if self.lease_ttl_ms < ttl_ms {
            raise.push(format!(
                "lease_ttl_ms to at least {ttl_ms} (--lease-ttl {ttl_ms}ms)"
            ));
        }
        if self.backend == BackendKind::Raft && self.shard_count() == 1 {
            let emin = self
                .election_timeout_range_ms()
                .map(|(lo, _)| lo)
                .unwrap_or(0);
            if emin < ttl_ms {
                let emax = ttl_ms + STOP_MARGIN_ELECTION_SPREAD_MS;
                raise.push(format!(
                    "the minimum election timeout to at least {ttl_ms} (election_timeout_ms = \"{ttl_ms}-{emax}\", --election-timeout {ttl_ms}-{emax}), since raft grants min(lease_ttl_ms, election timeout min); failover then takes about the maximum, {emax} ms"
                ));
            }
        }
        format!("raise {}", raise.join(" and "))
    }

    /// The usable part of a granted lease of `granted` (what is left after
    /// [`NodeConfig::lease_safety_margin`]) must hold [`NodeConfig::min_usable_lease_ms`] (3
    /// renewal intervals + 5 ms) and leave room for `read_lease_margin_ms`; the error names each
    /// part of the margin and the settings (and flags) that would fix it.
    pub fn check_usable_lease(&self, granted: Duration) -> Result<(), ConfigError> {
        let margin = self.lease_safety_margin(granted);
        let usable = granted.saturating_sub(margin);
        let read_margin = Duration::from_millis(self.read_lease_margin_ms);
        let (what, limit) = if usable < Duration::from_millis(self.min_usable_lease_ms()) {
            ("renew_interval_ms", self.renew_interval_ms)
        } else if read_margin >= usable {
            // A lease read needs a window: the margin must leave some of the usable lease.
            ("read_lease_margin_ms", self.read_lease_margin_ms)
        } else {
            return Ok(());
        };
        let granted_is = if self.backend == BackendKind::Raft
            && self.shard_count() == 1
            && granted < self.lease_ttl()
        {
            format!(
                "raft's lease of {} ms (the minimum election timeout, below lease_ttl_ms)",
                granted.as_millis()
            )
        } else {
            format!("lease_ttl_ms {}", granted.as_millis())
        };
        let stop_margin = if self.work_stop_margin_ms > 0 {
            format!(
                " + work_stop_margin_ms {} (`baton run --child-stop-margin`)",
                self.work_stop_margin_ms
            )
        } else {
            String::new()
        };
        let mut fixes = vec![self.raise_ttl_advice(self.min_working_ttl_ms())];
        let usable_ms = usable.as_millis() as u64;
        let renew_fits =
            usable_ms.saturating_sub(RENEWAL_SLACK_MS) / RENEWALS_PER_USABLE_LEASE;
        if what == "renew_interval_ms" && renew_fits > self.retry_interval_ms {
            fixes.push(format!(
                "lower renew_interval_ms to at most {renew_fits} (--renew-interval {renew_fits}ms)"
            ));
        }
        if what == "read_lease_margin_ms" && usable_ms > 0 {
            fixes.push(format!(
                "lower read_lease_margin_ms to at most {} (--read-lease-margin {}ms)",
                usable_ms - 1,
                usable_ms - 1
            ));
        }
        if self.work_stop_margin_ms > 0 {
            fixes.push(
                "give the program less time to stop (a smaller --stop-timeout and --child-stop-margin)"
                    .into(),
            );
        }
        let rule = if what == "renew_interval_ms" {
            format!(
                "{what} ({limit}) needs a usable lease of at least {} ms ({RENEWALS_PER_USABLE_LEASE} renewal intervals + {RENEWAL_SLACK_MS} ms slack, so that two renewals may fail or come late before the watchdog demotes), but the usable lease is",
                self.min_usable_lease_ms()
            )
        } else {
            format!("{what} ({limit}) must be below the usable lease:")
        };
        Err(ConfigError::Timing(format!(
            "{rule} {usable_ms} ms = {granted_is} minus the safety margin of {} ms (clock_rate_error {} x TTL + deadline_margin_ms {}{stop_margin}). To fix: {}",
            margin.as_millis(),
            self.clock_rate_error,
            self.deadline_margin_ms,
            fixes.join("; or ")
        )))
    }

    /// The construction-time checks. Rejects any config whose lease arithmetic cannot be safe;
    /// a timing error names the setting to change and a value that works.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let (ttl, renew, retry) = (
            self.lease_ttl_ms,
            self.renew_interval_ms,
            self.retry_interval_ms,
        );
        if retry == 0 {
            return Err(ConfigError::Timing(
                "retry_interval_ms must be > 0 (--retry-interval), e.g. a quarter of renew_interval_ms".into(),
            ));
        }
        if !(0.0..0.5).contains(&self.clock_rate_error) {
            return Err(ConfigError::Timing(format!(
                "clock_rate_error ({}) must be in [0, 0.5), e.g. 0.01 (1%)",
                self.clock_rate_error
            )));
        }
        if renew <= retry {
            return Err(ConfigError::Timing(format!(
                "need renew_interval_ms ({renew}) > retry_interval_ms ({retry}): lower retry_interval_ms below {renew}, e.g. --retry-interval {}ms, or raise renew_interval_ms (--renew-interval)",
                (renew / 4).max(1)
            )));
        }
        if ttl <= renew {
            return Err(ConfigError::Timing(format!(
                "need lease_ttl_ms ({ttl}) > renew_interval_ms ({renew}): {}, or lower renew_interval_ms (--renew-interval)",
                self.raise_ttl_advice(self.min_working_ttl_ms())
            )));
        }
        self.check_usable_lease(Duration::from_millis(self.granted_lease_ttl_ms()))?;
        if self.node_id.is_empty()
            || self.node_id.len() > 64
            || !self
                .node_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ConfigError::Invalid(format!(
                "node_id {:?}: 1-64 of [A-Za-z0-9_-]",
                self.node_id
            )));
        }
        if self.clock_drift.abs() >= 0.5 {
            return Err(ConfigError::Invalid(
                "clock_drift must be in (-0.5, 0.5)".into(),
            ));
        }
        self.election_timeout_range_ms()?;
        if self.sequencer.max_batch_ids == 0 || self.sequencer.max_block == 0 {
            return Err(ConfigError::Invalid("sequencer limits must be > 0".into()));
        }
        if !(1..=8).contains(&self.sequencer.commits_in_flight) {
            return Err(ConfigError::Invalid(format!(
                "[sequencer] commits_in_flight must be in 1..=8, got {}",
                self.sequencer.commits_in_flight
            )));
        }
        if !(1..=MAX_WINDOW_IDS).contains(&self.sequencer.window_ids) {
            return Err(ConfigError::Invalid(format!(
                "[sequencer] window_ids must be in 1..={MAX_WINDOW_IDS} (one fenced write may move the sequence at most that far), got {}",
                self.sequencer.window_ids
            )));
        }
        if self.sequencer.min_commit_interval_ms > 20 {
            return Err(ConfigError::Invalid(format!(
                "[sequencer] min_commit_interval_ms must be in 0..=20 (it adds to every answer's latency), got {}",
                self.sequencer.min_commit_interval_ms
            )));
        }
        self.http.validate()?;
        let tb = &self.term_backoff;
        if tb.base_ms > 0 && tb.max_ms < tb.base_ms {
            return Err(ConfigError::Invalid(format!(
                "[term_backoff] max_ms ({}) must be at least base_ms ({}), e.g. max_ms = {}",
                tb.max_ms,
                tb.base_ms,
                tb.base_ms * 60
            )));
        }
        self.failure_budget.validate()?;
        self.detector.validate(&self.node_id)?;
        // `POST /stepdown` must outlive the demotion it waits for.
        let stepdown_bound_ms = self.work_stop_timeout_ms.saturating_mul(3) + 2000;
        if self.http.request_timeout_ms <= stepdown_bound_ms {
            return Err(ConfigError::Invalid(format!(
                "[http] request_timeout_ms ({}) must exceed the step-down bound ({stepdown_bound_ms} ms = 3 x work_stop_timeout_ms + 2 s)",
                self.http.request_timeout_ms
            )));
        }
        self.redis.validate()?;
        self.validate_tls()?;
        self.validate_shards()?;
        self.check_admin_surface(self.http_listen.ip())
    }

    /// The shard count K (`[shards] count`, at least 1).
    pub fn shard_count(&self) -> u32 {
        self.shards.count.max(1)
    }

    /// The members placement spreads shards over: `[shards] members`, or the raft peers.
    pub fn shard_members(&self) -> Vec<MemberSpec> {
        if !self.shards.members.is_empty() {
            return self.shards.members.clone();
        }
        self.raft
            .peers
            .iter()
            .map(|p| MemberSpec {
                id: p.id.clone(),
                addr: p.addr.clone(),
            })
            .collect()
    }

    /// This config as shard `shard`'s elector sees it: the backend's election key carries the
    /// shard's suffix (unchanged for shard 0), so each shard is its own election.
    pub fn for_shard(&self, shard: crate::shard::ShardId) -> NodeConfig {
        let mut c = self.clone();
        let sfx = shard.election_suffix();
        c.etcd.election_name.push_str(&sfx);
        c.redis.key.push_str(&sfx);
        c.zk.election_path.push_str(&sfx);
        c.pg_lease.lease_name.push_str(&sfx);
        c
    }

    fn validate_shards(&self) -> Result<(), ConfigError> {
        let k = self.shards.count;
        if !(1..=MAX_SHARDS).contains(&k) {
            return Err(ConfigError::Invalid(format!(
                "[shards] count must be in 1..={MAX_SHARDS}, got {k}"
            )));
        }
        if k == 1 {
            return Ok(());
        }
        if self.http.tls_cert_file.is_some() && self.http.member_ca_file.is_none() {
            return Err(ConfigError::Invalid(
                "[shards] count > 1 with HTTPS needs [http] member_ca_file: the CA bundle the members' certificates chain to, which placement verifies them against when it probes them".into(),
            ));
        }
        let members = self.shard_members();
        if !members.iter().any(|m| m.id == self.node_id) {
            return Err(ConfigError::Invalid(format!(
                "[shards] count = {k} needs [shards] members listing every member, this node ({}) included",
                self.node_id
            )));
        }
        if self.shards.probe_interval_ms == 0
            || self.shards.down_after_ms < 2 * self.shards.probe_interval_ms
        {
            return Err(ConfigError::Invalid(format!(
                "[shards] down_after_ms ({}) must be at least 2 x probe_interval_ms ({}), and the interval > 0",
                self.shards.down_after_ms, self.shards.probe_interval_ms
            )));
        }
        Ok(())
    }

    /// The TLS options: the server's certificate and key together or not at all, the URL schemes
    /// that go with a CA, every named file readable (parsed when the node starts), and a build
    /// with TLS in it whenever any is set.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        let http = match (&self.http.tls_cert_file, &self.http.tls_key_file) {
            (Some(cert), Some(key)) => [
                Some(("[http] tls_cert_file", cert)),
                Some(("[http] tls_key_file", key)),
            ],
            (None, None) => [None, None],
            _ => {
                return Err(ConfigError::Invalid(
                    "[http] set tls_cert_file and tls_key_file together, or neither".into(),
                ))
            }
        };
        if self.http.member_ca_file.is_some() && self.http.tls_cert_file.is_none() {
            return Err(ConfigError::Invalid(
                "[http] member_ca_file is for a fleet that serves HTTPS; this node serves plain HTTP (no tls_cert_file)".into(),
            ));
        }
        if self.redis.tls_ca_file.is_some() && !self.redis.url.starts_with("rediss://") {
            return Err(ConfigError::Invalid(
                "[redis] tls_ca_file needs a rediss:// url".into(),
            ));
        }
        // The redis client reads `#insecure` as "skip certificate checks": never with a CA.
        if self.redis.tls_ca_file.is_some() && self.redis.url.contains("#insecure") {
            return Err(ConfigError::Invalid(
                "[redis] a url with #insecure would skip the checks tls_ca_file asks for".into(),
            ));
        }
        if self.etcd.tls_ca_file.is_some()
            && !self
                .etcd
                .endpoints
                .iter()
                .all(|e| e.starts_with("https://"))
        {
            return Err(ConfigError::Invalid(
                "[etcd] tls_ca_file needs https:// endpoints".into(),
            ));
        }
        let cas = [
            ("[resource] tls_ca_file", &self.resource.tls_ca_file),
            ("[pg_lease] tls_ca_file", &self.pg_lease.tls_ca_file),
            ("[redis] tls_ca_file", &self.redis.tls_ca_file),
            ("[etcd] tls_ca_file", &self.etcd.tls_ca_file),
            ("[http] member_ca_file", &self.http.member_ca_file),
        ]
        .map(|(option, path)| path.as_ref().map(|p| (option, p)));
        for (option, path) in http.into_iter().chain(cas).flatten() {
            if !cfg!(feature = "tls") {
                return Err(ConfigError::Invalid(format!(
                    "{option} is set, but this build of baton has no TLS (cargo feature `tls`)"
                )));
            }
            std::fs::File::open(path).map_err(|source| ConfigError::File {
                option,
                path: path.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// The admin route (`POST /stepdown`) is reachable by anyone who can reach `listen_ip`: off
    /// loopback it must need a token, and a token must not be guessable.
    pub fn check_admin_surface(&self, listen_ip: std::net::IpAddr) -> Result<(), ConfigError> {
        match &self.admin_token {
            Some(t) if t.expose().len() < MIN_ADMIN_TOKEN_BYTES => Err(ConfigError::Invalid(format!(
                "admin_token is shorter than {MIN_ADMIN_TOKEN_BYTES} bytes"
            ))),
            Some(t) if t.expose().chars().any(|c| c.is_whitespace() || c.is_control()) => Err(
                ConfigError::Invalid("admin_token must not contain whitespace or control characters".into()),
            ),
            None if !listen_ip.is_loopback() => Err(ConfigError::Invalid(format!(
                "the HTTP server listens on {listen_ip}, which is not loopback: set admin_token (or BATON_ADMIN_TOKEN / --admin-token) so POST /stepdown needs it"
            ))),
            _ => Ok(()),
        }
    }
}

/// Parses `3s`, `250ms`, `1.5s`, `2m` or a plain number of milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, ConfigError> {
    let t = text.trim();
    let err = || ConfigError::Duration(text.to_owned());
    let (num, scale) = if let Some(v) = t.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = t.strip_suffix('s') {
        (v, 1000.0)
    } else if let Some(v) = t.strip_suffix('m') {
        (v, 60_000.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| err())?;
    if !v.is_finite() || v < 0.0 {
        return Err(err());
    }
    Ok((v * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_detector_is_off_by_default_and_swim_is_checked() {
        let base = NodeConfig::default();
        assert_eq!(base.detector.kind, DetectorKind::Lease);
        base.validate().unwrap();
        let mut cfg = base.clone();
        cfg.detector.kind = DetectorKind::Swim;
        // No peers and no bind: refused (with or without the feature, for its own reason).
        assert!(cfg.validate().is_err());
        cfg.detector.peers = vec![DetectorPeer {
            id: "n1".into(),
            addr: "127.0.0.1:7946".into(),
        }];
        assert_eq!(cfg.validate().is_ok(), cfg!(feature = "swim"));
        if cfg!(feature = "swim") {
            let mut bad = cfg.clone();
            bad.detector.peers[0].addr = "somewhere".into();
            assert!(bad.validate().is_err());
            let mut bad = cfg.clone();
            bad.detector.probe_rtt_ms = bad.detector.probe_period_ms;
            assert!(bad.validate().is_err());
            let mut bad = cfg.clone();
            bad.detector.window_ms = 10;
            assert!(bad.validate().is_err());
        }
        let text = "[detector]\nkind = \"swim\"\nbind = \"127.0.0.1:0\"\n";
        let parsed: NodeConfig = toml::from_str(text).unwrap();
        assert_eq!(parsed.detector.kind, DetectorKind::Swim);
        assert!(toml::from_str::<NodeConfig>("[detector]\nkind = \"gossip\"\n").is_err());
    }

    #[test]
    fn default_timing_is_valid() {
        NodeConfig::default().validate().unwrap();
    }

    const EVERY_BACKEND: [BackendKind; 6] = [
        BackendKind::Etcd,
        BackendKind::Redis,
        BackendKind::RedisNaive,
        BackendKind::Zk,
        BackendKind::PgLease,
        BackendKind::Raft,
    ];

    /// The usable lease the watchdog gets after each renewal, computed here from the parts
    /// (granted lease minus the clock-rate share, the deadline margin and the stop margin),
    /// not through `lease_safety_margin`.
    fn usable_after_renewal_ms(c: &NodeConfig) -> f64 {
        let granted = c.granted_lease_ttl_ms() as f64;
        granted * (1.0 - c.clock_rate_error)
            - c.deadline_margin_ms as f64
            - c.work_stop_margin_ms as f64
    }

    /// Issue 43: the timing derived for `baton run --child-stop-margin` (what `baton config
    /// init --child-stop-margin` writes) left the watchdog 76 ms after each 40 ms renewal, and
    /// a busy host demoted the leader 4 times in 3.5 minutes. Every derived timing, on every
    /// backend, must leave at least 3 renewal intervals + 5 ms after each renewal, and validate
    /// as `baton run` will run it.
    #[test]
    fn derived_timing_leaves_the_watchdog_three_renewals_and_slack() {
        for backend in EVERY_BACKEND {
            for margin_ms in [0, 700, 1250, 3300, 5250, 30_000] {
                let mut c = NodeConfig::for_backend(backend);
                c.fit_stop_margin(margin_ms);
                c.work_stop_margin_ms = margin_ms;
                let usable = usable_after_renewal_ms(&c);
                let need = (3 * c.renew_interval_ms + 5) as f64;
                assert!(
                    usable >= need,
                    "{backend} with a {margin_ms} ms stop margin: lease {} ms, election timeout {}, {usable} ms after each {} ms renewal, need {need}",
                    c.lease_ttl_ms,
                    c.election_timeout_ms,
                    c.renew_interval_ms
                );
                c.validate().unwrap();
            }
        }
        // deploy/baton-run.service's unit (--stop-timeout 5s --child-stop-margin 5250ms) on
        // raft: a 5.5 s lease (not 5.4) and a 200 ms election spread (not 5400-10800), so
        // failover takes ~5.7 s, not ~11.
        let mut c = NodeConfig::default();
        c.fit_stop_margin(5250);
        assert_eq!(
            (c.lease_ttl_ms, c.election_timeout_ms.as_str()),
            (5500, "5500-5700")
        );
    }

    /// Validation refuses a usable lease below 3 renewals + 5 ms, and the error's suggestions
    /// (a longer lease, or a shorter renewal) are values that pass.
    #[test]
    fn validation_refuses_less_than_three_renewals_of_headroom() {
        // The raft defaults with a 25 ms deadline margin: 150 x 0.99 - 25 = 123.5 ms < 125.
        let c = NodeConfig {
            deadline_margin_ms: 25,
            election_timeout_ms: "300-500".into(),
            lease_ttl_ms: 150,
            ..NodeConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("renew_interval_ms (40) needs a usable lease of at least 125 ms"),
            "{err}"
        );
        let mut longer = c.clone();
        longer.lease_ttl_ms = parse_duration_ms(suggested(&err, "--lease-ttl").unwrap()).unwrap();
        longer.validate().unwrap();
        let mut shorter = c.clone();
        shorter.renew_interval_ms =
            parse_duration_ms(suggested(&err, "--renew-interval").unwrap()).unwrap();
        shorter.validate().unwrap();
        assert!(usable_after_renewal_ms(&shorter) >= (3 * shorter.renew_interval_ms + 5) as f64);
        // Exactly 3 renewals + 5 ms passes; a millisecond less does not.
        let mut edge = NodeConfig {
            lease_ttl_ms: 1000,
            renew_interval_ms: 200,
            retry_interval_ms: 50,
            deadline_margin_ms: 395,
            clock_rate_error: 0.0,
            election_timeout_ms: "1000-1200".into(),
            ..NodeConfig::default()
        };
        edge.validate().unwrap();
        edge.deadline_margin_ms = 396;
        assert!(matches!(edge.validate(), Err(ConfigError::Timing(_))));
    }

    /// Every backend's defaults pass the headroom rule, and `for_backend` differs from the
    /// raft defaults only in the keys a config file inherits from its backend.
    #[test]
    fn every_backends_defaults_have_headroom_and_only_timing_differs() {
        let raft = toml::Table::try_from(NodeConfig::default()).unwrap();
        for backend in EVERY_BACKEND {
            let c = NodeConfig::for_backend(backend);
            assert!(
                usable_after_renewal_ms(&c) >= (3 * c.renew_interval_ms + 5) as f64,
                "{backend}"
            );
            let t = toml::Table::try_from(&c).unwrap();
            for (key, value) in &t {
                if raft.get(key) != Some(value) {
                    assert!(
                        key == "backend" || BACKEND_TIMING_KEYS.contains(&key.as_str()),
                        "{backend}: {key} differs from raft's default but is not a backend timing key"
                    );
                }
            }
        }
    }

    /// config/<backend>.toml (what `baton config init` and the lab fleets start from) has the
    /// same timing as `for_backend`, which a file that names the backend inherits.
    #[test]
    fn the_shipped_configs_have_their_backends_timing() {
        for (backend, text) in [
            (BackendKind::Raft, include_str!("../config/raft.toml")),
            (BackendKind::Etcd, include_str!("../config/etcd.toml")),
            (BackendKind::Redis, include_str!("../config/redis.toml")),
            (BackendKind::RedisNaive, include_str!("../config/redis-naive.toml")),
            (BackendKind::Zk, include_str!("../config/zk.toml")),
            (BackendKind::PgLease, include_str!("../config/pg-lease.toml")),
        ] {
            let shipped: NodeConfig = toml::from_str(text).unwrap();
            let d = NodeConfig::for_backend(backend);
            assert_eq!(shipped.backend, backend);
            assert_eq!(
                (
                    shipped.lease_ttl_ms,
                    shipped.renew_interval_ms,
                    shipped.retry_interval_ms,
                    shipped.deadline_margin_ms,
                    shipped.clock_rate_error
                ),
                (
                    d.lease_ttl_ms,
                    d.renew_interval_ms,
                    d.retry_interval_ms,
                    d.deadline_margin_ms,
                    d.clock_rate_error
                ),
                "config/{backend}.toml"
            );
        }
        let mut shards: NodeConfig =
            toml::from_str(include_str!("../config/raft-shards.toml")).unwrap();
        // `baton fleet up --shards K` sets the count; each shard's lease is lease_ttl_ms.
        shards.shards.count = 4;
        assert!(
            usable_after_renewal_ms(&shards) >= (3 * shards.renew_interval_ms + 5) as f64,
            "config/raft-shards.toml"
        );
    }

    /// Issue 43: a config file that named `backend = "pg-lease"` and set no timing ran on
    /// raft's 150 ms lease renewed every 40 ms, against PostgreSQL, without a word. It gets
    /// pg-lease's timing now, from `from_file` and from plain TOML parsing alike; the keys it
    /// does set keep their values, and `--backend` (from_file_as) picks the defaults too.
    #[test]
    fn a_file_that_names_pg_lease_gets_pg_lease_timing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        let text = "node_id = \"n1\"\nbackend = \"pg-lease\"\n\n[pg_lease]\ndatabase_url = \"postgres://baton_lease:pw@db/baton\"\n";
        std::fs::write(&path, text).unwrap();
        let pg = NodeConfig::for_backend(BackendKind::PgLease);
        let timing = |c: &NodeConfig| {
            (
                c.lease_ttl_ms,
                c.renew_interval_ms,
                c.retry_interval_ms,
                c.deadline_margin_ms,
            )
        };
        let from_file = NodeConfig::from_file(&path).unwrap();
        assert_eq!(timing(&from_file), timing(&pg), "from_file");
        assert_eq!(timing(&from_file), (3000, 800, 250, 100));
        let parsed: NodeConfig = toml::from_str(text).unwrap();
        assert_eq!(timing(&parsed), timing(&pg), "toml::from_str");
        from_file.validate().unwrap();

        // A key the file sets is kept; the others are still pg-lease's.
        let set = format!("lease_ttl_ms = 6000\n{text}");
        let parsed: NodeConfig = toml::from_str(&set).unwrap();
        assert_eq!(timing(&parsed), (6000, 800, 250, 100));

        // No backend named: raft, with raft's timing.
        let raft: NodeConfig = toml::from_str("node_id = \"n1\"\n").unwrap();
        assert_eq!(timing(&raft), timing(&NodeConfig::default()));
        // A raft file run with --backend etcd gets etcd's timing.
        std::fs::write(&path, "node_id = \"n1\"\n").unwrap();
        let etcd = NodeConfig::from_file_as(&path, Some(BackendKind::Etcd)).unwrap();
        assert_eq!(etcd.backend, BackendKind::Etcd);
        assert_eq!(timing(&etcd), timing(&NodeConfig::for_backend(BackendKind::Etcd)));

        // from_file still says where a bad key is.
        std::fs::write(&path, "node_id = \"n1\"\nlease_tll_ms = 5\n").unwrap();
        let err = NodeConfig::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("lease_tll_ms") && err.contains("line 2"), "{err}");
        assert!(toml::from_str::<NodeConfig>("lease_tll_ms = 5\n").is_err());
    }

    /// `[pg_lease] database_url` has no default (it was a `postgres` superuser URL): nothing in
    /// the defaults points at a superuser.
    #[test]
    fn no_default_url_names_a_superuser() {
        let c = NodeConfig::for_backend(BackendKind::PgLease);
        assert_eq!(c.pg_lease.database_url, "");
        let text = toml::to_string(&NodeConfig::default()).unwrap();
        assert!(!text.contains("postgres://postgres"), "{text}");
    }

    /// The default backend is raft, and its default timing is what raft accepts: the check
    /// `RaftElector::start` makes (renewal inside the granted lease minus its margin) passes.
    #[test]
    fn defaults_are_the_default_backends_and_fit_its_lease() {
        let c = NodeConfig::default();
        assert_eq!(c.backend, BackendKind::Raft);
        let (emin, _) = c.election_timeout_range_ms().unwrap();
        let granted = Duration::from_millis(c.lease_ttl_ms.min(emin));
        assert!(
            c.renew_interval() < granted.saturating_sub(c.lease_safety_margin(granted)),
            "raft would refuse the default timing"
        );
        for backend in EVERY_BACKEND {
            let c = NodeConfig::for_backend(backend);
            assert_eq!(c.backend, backend);
            c.validate().unwrap();
        }
        assert_eq!(
            NodeConfig::for_backend(BackendKind::PgLease).lease_ttl_ms,
            3000
        );
    }

    #[test]
    fn the_client_thread_may_only_yield() {
        let mut c = NodeConfig::default();
        for (nice, ok) in [(-1, false), (0, true), (5, true), (19, true), (20, false)] {
            c.http.thread_nice = nice;
            assert_eq!(c.validate().is_ok(), ok, "thread_nice = {nice}");
        }
    }

    #[test]
    fn client_threads_default_to_half_the_cores_and_are_bounded() {
        let mut c = NodeConfig::default();
        assert_eq!(c.http.server_threads(1), 1);
        assert_eq!(c.http.server_threads(2), 1);
        assert_eq!(c.http.server_threads(16), 8);
        // A commit thread of its own from 4 client threads up, unless the config says.
        // One shard only: K shards' commit paths spread over the client threads.
        assert_eq!(c.http.commit_threads(2, 1), 0);
        assert_eq!(c.http.commit_threads(6, 1), 0);
        assert_eq!(c.http.commit_threads(8, 1), 1);
        assert_eq!(c.http.commit_threads(16, 1), 1);
        assert_eq!(c.http.commit_threads(16, 4), 0);
        c.http.commit_threads = Some(0);
        assert_eq!(c.http.commit_threads(16, 1), 0);
        c.http.commit_threads = Some(3);
        assert_eq!(c.http.commit_threads(2, 16), 3);
        c.http.commit_threads = None;
        c.http.threads = 3;
        assert_eq!(c.http.server_threads(16), 3);
        assert_eq!(c.http.commit_threads(16, 1), 0);
        for (threads, ok) in [(0, true), (1, true), (64, true), (65, false)] {
            c.http.threads = threads;
            assert_eq!(c.validate().is_ok(), ok, "threads = {threads}");
            c.http.threads = 0;
            c.http.commit_threads = Some(threads);
            assert_eq!(c.validate().is_ok(), ok, "commit_threads = {threads}");
            c.http.commit_threads = None;
        }
    }

    #[test]
    fn commits_in_flight_is_bounded() {
        let mut c = NodeConfig::default();
        for (n, ok) in [(0, false), (1, true), (2, true), (8, true), (9, false)] {
            c.sequencer.commits_in_flight = n;
            assert_eq!(c.validate().is_ok(), ok, "commits_in_flight = {n}");
        }
    }

    #[test]
    fn sequencer_mode_is_durable_by_default_and_the_window_is_bounded() {
        let c = NodeConfig::default();
        assert_eq!(c.sequencer.mode, SequencerMode::Durable);
        let c: NodeConfig =
            toml::from_str("[sequencer]\nmode = \"window\"\nwindow_ids = 5000\n").unwrap();
        assert_eq!(
            (c.sequencer.mode, c.sequencer.window_ids),
            (SequencerMode::Window, 5000)
        );
        assert!(toml::from_str::<NodeConfig>("[sequencer]\nmode = \"fast\"\n").is_err());
        let mut c = NodeConfig::default();
        for (ids, ok) in [
            (0, false),
            (1, true),
            (MAX_WINDOW_IDS, true),
            (MAX_WINDOW_IDS + 1, false),
        ] {
            c.sequencer.window_ids = ids;
            assert_eq!(c.validate().is_ok(), ok, "window_ids = {ids}");
        }
    }

    #[test]
    fn min_commit_interval_is_bounded() {
        let mut c = NodeConfig::default();
        for (ms, ok) in [(0, true), (2, true), (20, true), (21, false)] {
            c.sequencer.min_commit_interval_ms = ms;
            assert_eq!(c.validate().is_ok(), ok, "min_commit_interval_ms = {ms}");
        }
    }

    #[test]
    fn ttl_must_exceed_renew_which_must_exceed_retry() {
        let mut c = NodeConfig {
            renew_interval_ms: 3000,
            ..NodeConfig::for_backend(BackendKind::Etcd)
        };
        assert!(matches!(c.validate(), Err(ConfigError::Timing(_))));
        c.renew_interval_ms = 200;
        assert!(matches!(c.validate(), Err(ConfigError::Timing(_))));
        c.renew_interval_ms = 1000;
        c.retry_interval_ms = 0;
        assert!(matches!(c.validate(), Err(ConfigError::Timing(_))));
    }

    #[test]
    fn lease_read_window_solves_its_inequality() {
        let t0 = std::time::Instant::now();
        let deadline = t0 + Duration::from_millis(2870);
        let (bound, margin) = (0.01, Duration::from_millis(50));
        let until = lease_read_until(t0, deadline, bound, margin).unwrap();
        // At the window's end, now == deadline - (bound x elapsed + margin), to the microsecond.
        let elapsed = until - t0;
        let rhs = deadline - (elapsed.mul_f64(bound) + margin);
        let diff = if until > rhs {
            until - rhs
        } else {
            rhs - until
        };
        assert!(diff < Duration::from_micros(5), "{diff:?}");
        // Just inside it holds, just past it does not.
        let inside = until - Duration::from_millis(1);
        assert!(inside < deadline - ((inside - t0).mul_f64(bound) + margin));
        let past = until + Duration::from_millis(1);
        assert!(past >= deadline - ((past - t0).mul_f64(bound) + margin));
        // Tighter with a bigger bound or margin; empty when the margin eats the lease.
        assert!(lease_read_until(t0, deadline, 0.05, margin).unwrap() < until);
        assert!(lease_read_until(t0, deadline, bound, margin * 2).unwrap() < until);
        assert!(lease_read_until(t0, deadline, bound, Duration::from_secs(3)).is_none());
        assert!(lease_read_until(deadline, t0, bound, margin).is_none());
    }

    /// The read window against the backend's real expiry (`sent_at + ttl`), with the node's
    /// clock running at `1 + drift` (the watchdog's deadline goes through the same clock model):
    /// safe whenever the clock is no slower than the configured bound, and stale when it is
    /// slower than the bound by more than the margins cover. A wrong bound fails this test.
    #[test]
    fn lease_read_window_ends_before_real_expiry_only_within_the_bound() {
        // 3 s TTL, 1% bound, 100 ms + 50 ms margins
        let cfg = NodeConfig::for_backend(BackendKind::Etcd);
        let ttl = cfg.lease_ttl();
        let t0 = std::time::Instant::now();
        let until = |drift: f64| {
            let clock = crate::clock::NodeClock { skew_ms: 0, drift };
            let deadline = clock.real_deadline(t0, ttl - cfg.lease_safety_margin(ttl));
            lease_read_until(
                t0,
                deadline,
                cfg.clock_rate_error,
                Duration::from_millis(cfg.read_lease_margin_ms),
            )
            .unwrap()
        };
        for drift in [0.0, 0.01, -0.01, 0.005, -0.005, 0.3] {
            assert!(until(drift) < t0 + ttl, "drift {drift}: window past expiry");
        }
        // A clock 10% slow against a 1% bound: the window outlives the lease by ~108 ms
        // ((2870 ms / 0.9 - 50 ms) / 1.01 = 3108 ms after the send).
        let late = until(-0.10) - (t0 + ttl);
        assert!(late > Duration::from_millis(80), "{late:?}");
        // With the bound set to the real drift, the same slow clock is safe again.
        let cfg10 = NodeConfig {
            clock_rate_error: 0.10,
            ..NodeConfig::for_backend(BackendKind::Etcd)
        };
        let clock = crate::clock::NodeClock {
            skew_ms: 0,
            drift: -0.10,
        };
        let deadline = clock.real_deadline(t0, ttl - cfg10.lease_safety_margin(ttl));
        let u = lease_read_until(t0, deadline, 0.10, Duration::from_millis(50)).unwrap();
        assert!(u < t0 + ttl);
    }

    #[test]
    fn read_settings_are_validated() {
        let c = NodeConfig {
            read_lease_margin_ms: 5000,
            ..NodeConfig::default()
        };
        assert!(matches!(c.validate(), Err(ConfigError::Timing(_))));
        assert_eq!("quorum".parse::<ReadMode>().unwrap(), ReadMode::Quorum);
        assert!("stale".parse::<ReadMode>().is_err());
        let c: NodeConfig = toml::from_str("read_mode_default = \"resource\"").unwrap();
        assert_eq!(c.read_mode_default, ReadMode::Resource);
        assert!(toml::from_str::<NodeConfig>("read_mode_default = \"fast\"").is_err());
    }

    #[test]
    fn renew_must_fit_inside_the_usable_lease() {
        // 3 s TTL, 1% + 100 ms margin -> 2.87 s usable; renewing every 2.9 s cannot keep it.
        let c = NodeConfig {
            renew_interval_ms: 2900,
            ..NodeConfig::for_backend(BackendKind::Etcd)
        };
        assert!(matches!(c.validate(), Err(ConfigError::Timing(_))));
    }

    /// The value a timing error suggests for `flag` (`--lease-ttl 1327ms` -> "1327ms").
    fn suggested<'a>(err: &'a str, flag: &str) -> Option<&'a str> {
        let at = err.find(&format!("{flag} "))? + flag.len() + 1;
        err[at..].split([')', ' ', ',', ';']).next()
    }

    /// The trap from issue 30: README's raft advice for `baton run` (election timeout
    /// 1500-3000) on top of config/raft.toml's 150 ms lease, with `baton run`'s default stop
    /// margin (1 s + 250 ms). The error names lease_ttl_ms and its flag, and the value it
    /// suggests is one that validates.
    #[test]
    fn a_stop_margin_bigger_than_the_lease_names_the_ttl_that_works() {
        let mut c = NodeConfig {
            backend: BackendKind::Raft,
            election_timeout_ms: "1500-3000".into(),
            lease_ttl_ms: 150,
            renew_interval_ms: 40,
            retry_interval_ms: 20,
            deadline_margin_ms: 20,
            work_stop_margin_ms: 1250,
            ..NodeConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("renew_interval_ms (40) needs a usable lease of at least 125 ms (3 renewal intervals + 5 ms slack"),
            "{err}"
        );
        assert!(err.contains("but the usable lease is 0 ms"), "{err}");
        assert!(
            err.contains("work_stop_margin_ms 1250 (`baton run --child-stop-margin`)"),
            "{err}"
        );
        assert!(!err.contains("--election-timeout"), "1500 is enough: {err}");
        let ttl = suggested(&err, "--lease-ttl").expect("a --lease-ttl to pass");
        c.lease_ttl_ms = parse_duration_ms(ttl).unwrap();
        c.validate().unwrap();
        // One less does not: the suggestion is the least that works.
        c.lease_ttl_ms -= 1;
        assert!(c.validate().is_err());
    }

    /// On raft the granted lease is capped by the minimum election timeout: raising
    /// lease_ttl_ms alone cannot help, and the error says which flags to pass together.
    #[test]
    fn raft_timing_errors_name_the_election_timeout_too() {
        let mut c = NodeConfig {
            backend: BackendKind::Raft,
            election_timeout_ms: "150-250".into(),
            lease_ttl_ms: 3000,
            work_stop_margin_ms: 700,
            ..NodeConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("raft's lease of 150 ms"), "{err}");
        assert!(
            !err.contains("--lease-ttl"),
            "lease_ttl_ms is already high enough: {err}"
        );
        c.election_timeout_ms = suggested(&err, "--election-timeout")
            .expect("an --election-timeout to pass")
            .into();
        c.validate().unwrap();
    }

    #[test]
    fn lease_timing_errors_offer_a_lower_renewal_that_works() {
        let mut c = NodeConfig {
            renew_interval_ms: 2900,
            // A lease backend's timing (3 s lease, renew 800 ms, retry 250 ms, margin 100 ms).
            ..NodeConfig::for_backend(BackendKind::Etcd)
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("clock_rate_error 0.01 x TTL + deadline_margin_ms 100"),
            "{err}"
        );
        let lower = suggested(&err, "--renew-interval").expect("a --renew-interval");
        let raise = suggested(&err, "--lease-ttl").expect("a --lease-ttl");
        let mut by_renew = c.clone();
        by_renew.renew_interval_ms = parse_duration_ms(lower).unwrap();
        by_renew.validate().unwrap();
        c.lease_ttl_ms = parse_duration_ms(raise).unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn interval_order_errors_name_a_value_that_works() {
        let mut c = NodeConfig {
            retry_interval_ms: 1000,
            // A lease backend's timing (3 s lease, renew 800 ms, retry 250 ms, margin 100 ms).
            ..NodeConfig::for_backend(BackendKind::Etcd)
        };
        let err = c.validate().unwrap_err().to_string();
        c.retry_interval_ms =
            parse_duration_ms(suggested(&err, "--retry-interval").unwrap()).unwrap();
        c.validate().unwrap();
        let mut c = NodeConfig {
            lease_ttl_ms: 700,
            // A lease backend's timing (3 s lease, renew 800 ms, retry 250 ms, margin 100 ms).
            ..NodeConfig::for_backend(BackendKind::Etcd)
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("need lease_ttl_ms (700) > renew_interval_ms (800)"),
            "{err}"
        );
        c.lease_ttl_ms = parse_duration_ms(suggested(&err, "--lease-ttl").unwrap()).unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn off_loopback_without_admin_token_is_refused() {
        let mut c = NodeConfig {
            http_listen: "0.0.0.0:8080".parse().unwrap(),
            ..NodeConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("admin_token"), "{err}");
        c.http_listen = "10.1.2.3:8080".parse().unwrap();
        assert!(c.validate().is_err());
        c.admin_token = Some(Secret::new("0123456789abcdef0123"));
        c.validate().unwrap();
        // Loopback needs none.
        c.admin_token = None;
        c.http_listen = "127.0.0.1:8080".parse().unwrap();
        c.validate().unwrap();
        c.http_listen = "[::1]:8080".parse().unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn short_or_blank_admin_tokens_are_refused() {
        let mut c = NodeConfig::default();
        for bad in ["", "short", "0123456789abcde f"] {
            c.admin_token = Some(Secret::new(bad));
            assert!(c.validate().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn admin_token_never_shows_in_debug_or_redacted_json() {
        let c = NodeConfig {
            admin_token: Some(Secret::new("very-secret-admin-token")),
            ..NodeConfig::default()
        };
        assert!(!format!("{c:?}").contains("very-secret"));
        assert!(!c.redacted_json().to_string().contains("very-secret"));
        // The config file still carries it: a node started from it must know its token.
        let text = toml::to_string(&c).unwrap();
        assert!(text.contains("very-secret-admin-token"));
        let back: NodeConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.admin_token, c.admin_token);
    }

    #[test]
    fn http_limits_are_validated() {
        let zero_cap = NodeConfig {
            http: HttpConfig {
                max_connections: 0,
                ..HttpConfig::default()
            },
            ..NodeConfig::default()
        };
        assert!(zero_cap.validate().is_err());
        let zero_header = NodeConfig {
            http: HttpConfig {
                header_read_timeout_ms: 0,
                ..HttpConfig::default()
            },
            ..NodeConfig::default()
        };
        assert!(zero_header.validate().is_err());
        // A request bound shorter than a step-down would cut every step-down off.
        let short_request = NodeConfig {
            http: HttpConfig {
                request_timeout_ms: 5000,
                ..HttpConfig::default()
            },
            ..NodeConfig::default()
        };
        assert!(short_request.validate().is_err());
        let unknown: Result<NodeConfig, _> = toml::from_str("[http]\nmax_conections = 5\n");
        assert!(unknown.is_err(), "a typo in [http] must not be ignored");
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration_ms("3s").unwrap(), 3000);
        assert_eq!(parse_duration_ms("250ms").unwrap(), 250);
        assert_eq!(parse_duration_ms("1.5s").unwrap(), 1500);
        assert_eq!(parse_duration_ms("40").unwrap(), 40);
        assert!(parse_duration_ms("-1s").is_err());
        assert!(parse_duration_ms("soon").is_err());
    }

    #[test]
    fn election_timeout_range_parses() {
        let c = NodeConfig {
            election_timeout_ms: "150-300".into(),
            ..NodeConfig::default()
        };
        assert_eq!(c.election_timeout_range_ms().unwrap(), (150, 300));
        let c = NodeConfig {
            election_timeout_ms: "300-150".into(),
            ..NodeConfig::default()
        };
        assert!(c.validate().is_err());
    }
}

#[cfg(test)]
mod tls_tests {
    use super::*;

    #[test]
    fn https_needs_both_certificate_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        std::fs::write(&cert, "x").unwrap();
        let mut c = NodeConfig::default();
        c.http.tls_cert_file = Some(cert.clone());
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("together"), "{err}");
        c.http.tls_cert_file = None;
        c.http.tls_key_file = Some(cert);
        assert!(c.validate().is_err());
    }

    #[test]
    fn tls_files_must_be_readable_and_schemes_must_match() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let mut c = NodeConfig::default();
        c.resource.tls_ca_file = Some(missing.clone());
        let err = c.validate().unwrap_err();
        if cfg!(feature = "tls") {
            assert!(
                matches!(
                    err,
                    ConfigError::File {
                        option: "[resource] tls_ca_file",
                        ..
                    }
                ),
                "{err}"
            );
        } else {
            assert!(err.to_string().contains("feature `tls`"), "{err}");
        }
        let mut c = NodeConfig::default();
        c.redis.tls_ca_file = Some(missing.clone());
        assert!(c.validate().unwrap_err().to_string().contains("rediss://"));
        let mut c = NodeConfig::default();
        c.etcd.tls_ca_file = Some(missing);
        assert!(c.validate().unwrap_err().to_string().contains("https://"));
    }

    #[cfg(feature = "tls")]
    #[test]
    fn readable_tls_files_pass_validation_and_stay_out_of_reports() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "x").unwrap();
        let mut c = NodeConfig::default();
        c.http.tls_cert_file = Some(ca.clone());
        c.http.tls_key_file = Some(ca.clone());
        c.resource.tls_ca_file = Some(ca.clone());
        c.redis.url = "rediss://127.0.0.1:6380/".into();
        c.redis.tls_ca_file = Some(ca.clone());
        c.validate().unwrap();
        let redacted = c.redacted_json().to_string();
        assert!(!redacted.contains("ca.pem"), "{redacted}");
        let back: NodeConfig = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back.http.tls_key_file, Some(ca));
    }
}

#[cfg(test)]
mod secret_tests {
    use super::*;

    #[test]
    fn the_cluster_secret_never_shows_in_debug_or_redacted_json() {
        let mut c = NodeConfig::default();
        c.raft.cluster_secret = Some(Secret::new("hunter2-hunter2-hunter2"));
        c.raft.cluster_secret_file = Some(PathBuf::from("/etc/baton/secret"));
        assert!(!format!("{c:?}").contains("hunter2"));
        let redacted = c.redacted_json().to_string();
        assert!(!redacted.contains("hunter2"), "{redacted}");
        assert!(!redacted.contains("/etc/baton/secret"), "{redacted}");
        // The generated TOML does carry it: that is how every node of a fleet gets it.
        assert!(toml::to_string(&c).unwrap().contains("hunter2"));
    }

    #[test]
    fn secret_inline_or_from_a_file_not_both() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "  from-the-file-0123456789\n").unwrap();
        let mut r = RaftConfig {
            cluster_secret_file: Some(path),
            ..RaftConfig::default()
        };
        assert_eq!(
            r.secret().unwrap().unwrap().expose(),
            "from-the-file-0123456789"
        );
        r.cluster_secret = Some(Secret::new("inline"));
        assert!(r.secret().is_err());
        r.cluster_secret_file = None;
        assert_eq!(r.secret().unwrap().unwrap().expose(), "inline");
    }

    #[test]
    fn the_failure_budget_is_on_by_default_and_its_errors_name_a_working_value() {
        let c = NodeConfig::default();
        assert!(c.failure_budget.enabled());
        c.validate().unwrap();
        let refused = |b: FailureBudgetConfig| {
            let c = NodeConfig {
                failure_budget: b,
                ..NodeConfig::default()
            };
            c.validate().unwrap_err().to_string()
        };
        let e = refused(FailureBudgetConfig {
            window_ms: 10,
            ..FailureBudgetConfig::default()
        });
        assert!(
            e.contains("[failure_budget] window_ms (10)") && e.contains("window_ms = 600000"),
            "{e}"
        );
        let e = refused(FailureBudgetConfig {
            recheck_ms: 0,
            ..FailureBudgetConfig::default()
        });
        assert!(e.contains("recheck_ms = 5000"), "{e}");
        let e = refused(FailureBudgetConfig {
            window_ms: 2000,
            recheck_ms: 5000,
            ..FailureBudgetConfig::default()
        });
        assert!(e.contains("recheck_ms = 2000"), "{e}");
        let e = refused(FailureBudgetConfig {
            failed_terms: 20_000,
            ..FailureBudgetConfig::default()
        });
        assert!(e.contains("failed_terms = 5"), "{e}");
        // Off: the other settings are not looked at.
        let off = NodeConfig {
            failure_budget: FailureBudgetConfig {
                failed_terms: 0,
                window_ms: 0,
                recheck_ms: 0,
            },
            ..NodeConfig::default()
        };
        off.validate().unwrap();
    }
}

#[cfg(test)]
mod sentinel_tests {
    use super::*;

    fn with(sentinels: &[&str], master_name: Option<&str>) -> Result<(), ConfigError> {
        let mut c = NodeConfig::for_backend(BackendKind::Redis);
        c.redis.sentinels = sentinels.iter().map(|s| s.to_string()).collect();
        c.redis.master_name = master_name.map(str::to_owned);
        c.validate()
    }

    fn refused(sentinels: &[&str], master_name: Option<&str>) -> String {
        with(sentinels, master_name).unwrap_err().to_string()
    }

    #[test]
    fn sentinels_need_a_master_name_and_host_port_addresses() {
        with(&[], None).unwrap();
        with(
            &["127.0.0.1:26379", "sentinel-2.example:26379"],
            Some("baton"),
        )
        .unwrap();
        assert!(refused(&["127.0.0.1:26379"], None).contains("sentinels needs master_name"));
        assert!(refused(&[], Some("baton")).contains("sentinels is empty"));
        assert!(refused(&["127.0.0.1:26379"], Some("")).contains("master_name"));
        assert!(refused(&["127.0.0.1:26379"], Some("a b")).contains("whitespace"));
        for bad in [
            "127.0.0.1",
            ":26379",
            "127.0.0.1:0",
            "127.0.0.1:port",
            "redis://h:1/",
        ] {
            let e = refused(&[bad], Some("baton"));
            assert!(e.contains("is not host:port"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_sentinel_addresses_stay_out_of_reports() {
        let mut c = NodeConfig::for_backend(BackendKind::Redis);
        c.redis.sentinels = vec!["10.1.2.3:26379".into()];
        c.redis.master_name = Some("baton".into());
        c.redis.sentinel_password = Some(Secret::new("sentinel-hunter2"));
        let v = c.redacted_json().to_string();
        assert!(!v.contains("10.1.2.3"), "{v}");
        assert!(!v.contains("sentinel-hunter2"), "{v}");
        assert!(v.contains("\"master_name\":\"baton\""), "{v}");
        assert!(!format!("{c:?}").contains("sentinel-hunter2"));
    }

    #[test]
    fn a_sentinel_password_needs_sentinels() {
        let mut c = NodeConfig::for_backend(BackendKind::Redis);
        c.redis.sentinel_password = Some(Secret::new("pw"));
        let e = c.redis.validate().unwrap_err().to_string();
        assert!(
            e.contains("sentinel_password is set but sentinels is empty"),
            "{e}"
        );
        c.redis.sentinels = vec!["127.0.0.1:26379".into()];
        c.redis.master_name = Some("baton".into());
        c.redis.validate().unwrap();
    }
}
