//! `raft`: openraft among the fleet's own nodes — no external service. Token = the Raft term.
//!
//! # Version: openraft `=0.10.0-alpha.37`, pinned exactly
//!
//! Chosen over 0.9.x because graceful step-down needs a *leadership transfer*: 0.9's
//! `trigger().elect()` cannot pick a successor, and a follower that calls it is refused by every
//! voter still inside its leader lease, so a 0.9 "step down" means going dark for a whole election
//! timeout. 0.10 has `trigger().transfer_leader(to)`: the leader stops proposing and heartbeating,
//! tells every member, and the named node elects itself with a flag that lets voters skip the lease
//! (section 4.2.3 of the Raft dissertation). The alpha's API still changes between alphas, hence the `=` pin.
//!
//! # Mapping onto [`Elector`]
//!
//! * The raft group is the fleet: `cfg.raft.peers` lists every member (this node included); raft
//!   ids come from [`types::PeerMap`]. A member whose store is pristine calls `initialize` with the
//!   full membership (the lowest id at once, the others after a stagger, and only if still
//!   uninitialised); openraft allows identical `initialize` calls on several nodes, and
//!   `NotAllowed` (already initialised) is ignored.
//! * `campaign()` starts raft if it is not running, waits on the raft metrics until this node is
//!   leader, then calls `ensure_linearizable(ReadIndex)`: it succeeds only once this leader's no-op
//!   entry is committed and applied *and* a quorum acknowledged a heartbeat sent after the call.
//!   The token is the term of that read log id. (A transferring leader gets `ForwardToLeader`, so a
//!   node never re-wins the term it just handed over.)
//! * `renew()` is one `ensure_linearizable(ReadIndex)` (a fresh quorum round trip), bounded by the
//!   lease: success → `Grant { sent_at: <instant before the call>, ttl: lease }`; the term moved or
//!   raft answers `ForwardToLeader` / stopped → `LeaseLost`; no quorum in time → `Unavailable`.
//!   Not leading → `Ok(None)`. This is the self-fence: an isolated openraft leader keeps reporting
//!   `Leader` forever, but its reads fail, its grants stop, and the watchdog demotes it.
//! * `resign(successor)` hands leadership over with `transfer_leader` — to the named node, or to
//!   the most up-to-date follower — and waits (bounded) until this node no longer leads. If the
//!   target is behind or dead, the transfer is ignored by it, but this node has already stopped
//!   heartbeating, so the others elect normally after the lease: a slower hand-over, never two.
//! * `leader()` is the metrics' `current_leader` mapped back to the peer's node id and address.
//! * `close()` shuts raft down (bounded). A later `campaign()` restarts it from the same on-disk
//!   store, so the elector loop's "close and campaign again" after a lost lease is a rejoin.
//!
//! # The lease bound (why an isolated leader stops before anyone else can start)
//!
//! openraft (0.10) gives every vote a *leader lease* of `L = election_timeout_max`: a follower
//! refuses any non-transfer vote for `L` after it last heard from the leader, and the leader refuses
//! while a quorum acked it within `L`. A successful `ensure_linearizable(ReadIndex)` that we called
//! at `sent_at` means a quorum acked a heartbeat sent *after* `sent_at`; each of those followers got
//! it at `r ≥ sent_at` and refuses other candidates until `r + L` on its own clock, i.e. until at
//! least `sent_at + L·(1−ρ)` in real time for a clock-rate error `ρ`. Every election quorum
//! intersects that ack quorum, so **no other node can win before `sent_at + L·(1−ρ)`** (except a
//! transfer this node started itself, which it does only in `resign`, after its work stopped).
//!
//! We grant `ttl = min(lease_ttl_ms, election_timeout_min)` (clipping is logged). The node then
//! subtracts its own margin (`ttl·clock_rate_error + deadline_margin_ms`, see
//! [`NodeConfig::lease_safety_margin`]) and measures from `sent_at` on its own monotonic clock.
//! So the watchdog fires by `sent_at + ttl − margin` while the earliest rival win is
//! `sent_at + L·(1−ρ)`; with `ttl ≤ election_timeout_min ≤ L` the gap `L − ttl` plus the node's
//! margin covers the rate error and the follower-side processing delay. Heartbeats every
//! `heartbeat_interval_ms` (default 50) must be well under `election_timeout_min`.
//!
//! Practical timing for this backend: the grant is short (150 ms with the default `150-250`
//! election timeout), so `renew_interval_ms` must be below `ttl − margin`, e.g. `renew 40 ms,
//! retry 20 ms, deadline_margin 20 ms` with `150-250`, or raise the election timeout. Each renewal
//! is one heartbeat round, so frequent renewals are cheap.
//!
//! # What bounds failover
//!
//! After a leader dies, no voter grants a vote until `L` has passed since the last append it
//! accepted (that is the lease bound above), so failover is at least `L` minus the time since the
//! last heartbeat. openraft on its own waits longer: a follower stands only after
//! `L + election_timeout` (a fresh draw in `[min, max)`), ~`L + min·4/3` for the first of two
//! followers, which measured 535 ms median with `150-300`. The `prompt` module has each follower stand
//! (pre-vote first) as soon as its own `L` has run out, which leaves `L` − half a heartbeat +
//! a few ms of jitter + the claim through the fence: 270–280 ms median with `150-250` (the
//! measured runs are in `experiments/FINDINGS.md`). Lowering `L` further lowers failover but shortens nothing else:
//! the lease a leader may act on is capped by `election_timeout_min`, not by `L`.
//!
//! # Sharded (`[shards] count` > 1)
//!
//! K = 1 is everything above: the raft leader is the one leader. At K > 1 the same raft group
//! (one per fleet) also replicates a shard lease table, and each shard's elector is a client of
//! it as pg-lease's are clients of their rows: see [`shards`]. `campaign`/`renew` of this type
//! are then unused; the raft member runs for the table.
//!
//! # Where raft differs from the lease backends
//!
//! * Leadership is raft's, not the caller's: a node leads because a quorum elected it, whether or
//!   not it is calling `campaign`, and it keeps leading while raft heartbeats flow even if nobody
//!   calls `renew`. A renewal after a gap therefore grants again if this node still leads the same
//!   term — safe, since raft guarantees nobody else led in between; the node's watchdog is what
//!   stops the work during the gap. (So the generic conformance checks built on "a candidate that
//!   stops renewing loses the lease" and "only campaigning candidates can win" do not describe
//!   this backend; `tests/raft_backend.rs` checks its own contract.)
//! * In the node every member always campaigns, so the raft leader is always a candidate.
//! * openraft 0.10 is edition 2024: building needs Rust ≥ 1.85.
//!
//! # Peer transport and its trust boundary
//!
//! Peer RPC has its own listener ([`server`], bound at `raft.peer_listen` or this node's
//! `peer_addr`), owned by the elector and stopped when it is dropped; the client HTTP port never
//! serves `/peer/*`. Every request is authenticated with HMAC-SHA256 under the shared cluster
//! secret over method, path, sender, timestamp and body, with a ±30 s window, before openraft sees
//! it ([`auth`]); refusals are 401/403, counted in `baton_peer_auth_failures_total{reason}`.
//! No nonce cache: replays inside the window are tolerated by raft (see [`auth`]). Holding the
//! secret is membership: a member is trusted. [`start`](RaftElector::start) refuses a peer
//! listener off loopback, or a group of more than one member, without a secret.
//!
//! Terms never wrap: the won term becomes a token through [`FenceToken::checked`] (a term that
//! does not fit an `i64` is an error and the node does not act), and the listener refuses any
//! message whose term is above `i64::MAX − 1` (so one more election still fits), even when it is
//! correctly signed. openraft has no hook to bound *relative* term jumps, so none is attempted.
//!
//! # Fault injection (test/chaos hook)
//!
//! `touch <state_dir>/faults/isolate-peers` cuts this node's raft peer traffic both ways (outgoing
//! RPCs dropped, incoming `/peer/*` refused) while clients and PostgreSQL stay reachable; removing
//! the file heals it. Checked at most every 50 ms. See [`faults`]; `tests/raft_fleet.rs` uses it
//! to isolate a leader in a real fleet.
//!
//! # Durability
//!
//! Vote, log and snapshot live in `<state_dir>/raft/` and are fsync'ed before openraft proceeds
//! (see [`storage`]), so a restarted node never votes twice in a term and never reuses or lowers
//! one. `enable_leader_restore` is off: a restarted leader must win a new, higher term. Snapshots
//! are taken every 64 entries and the log is purged behind them. A node whose state directory is
//! wiped is a *new* voter with amnesia; raft's safety does not cover that (don't do it to a
//! majority).

pub use crate::peer_auth as auth;
mod client;
pub mod faults;
pub mod lease_server;
pub mod lease_table;
pub mod network;
mod prompt;
pub mod server;
mod shard_wire;
pub mod shards;
pub mod storage;
pub mod types;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{InitializeError, LinearizableReadError, RaftError};
use openraft::{ReadPolicy, ServerState, SnapshotPolicy};

use super::{
    count_request, BackendKind, Elector, ElectorError, ElectorResult, FenceToken, Grant,
    LeaderInfo, Win,
};
use crate::config::NodeConfig;
use auth::{PeerAuth, DEFAULT_WINDOW_MS, MIN_SECRET_BYTES};
use network::{NetworkFactory, RaftHandleSource, RaftPeerRpc};
use server::{Limits, PeerService};
use storage::{LogStore, StateMachine};
use types::{PeerMap, TypeConfig};

/// The running raft of one node.
pub type RaftHandle = openraft::Raft<TypeConfig, StateMachine>;

/// Heartbeat interval when `raft.heartbeat_interval_ms` is 0.
pub const DEFAULT_HEARTBEAT_MS: u64 = 50;

struct Shared {
    node_id: String,
    me: u64,
    peers: PeerMap,
    config: Arc<openraft::Config>,
    log: LogStore,
    sm: StateMachine,
    /// The `isolate-peers` test/chaos hook (see [`faults`]).
    faults: Arc<faults::PeerFaults>,
    /// Signs outgoing peer requests (the same key verifies incoming ones).
    auth: PeerAuth,
    raft: RwLock<Option<RaftHandle>>,
    /// Serialises start and shutdown.
    lifecycle: tokio::sync::Mutex<()>,
    /// The term of our last won campaign, while we believe we hold it.
    won_term: Mutex<Option<u64>>,
    lease_ttl: Duration,
    heartbeat: Duration,
    election_max: Duration,
    /// When this node last accepted an append from a leader (for [`prompt`]).
    contact: Arc<prompt::LeaderContact>,
}

impl RaftHandleSource for Shared {
    fn current(&self) -> Option<RaftHandle> {
        self.raft.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Serves `/peer/*` on `listener` until the returned sender is dropped.
fn spawn_peer_server(
    shared: &Arc<Shared>,
    listener: tokio::net::TcpListener,
    peers: &[crate::config::PeerSpec],
    shards: Option<Arc<lease_server::LeaseServer>>,
) -> tokio::sync::oneshot::Sender<()> {
    let rpc = RaftPeerRpc {
        source: shared.clone(),
        faults: shared.faults.clone(),
        contact: shared.contact.clone(),
        shards: shards.map(|s| s as Arc<dyn network::ShardRpc>),
    };
    let members = peers.iter().map(|p| p.id.clone()).collect();
    let service = PeerService::new(
        shared.auth.clone(),
        members,
        rpc,
        Limits::default(),
        shared.node_id.clone(),
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server::serve(listener, Arc::new(service), async move {
        let _ = stop_rx.await;
    }));
    stop_tx
}

/// The raft backend. See the module docs.
pub struct RaftElector {
    shared: Arc<Shared>,
    /// The shard lease table's server (K > 1, see [`shards`]); `None` at K = 1.
    lease: Option<Arc<lease_server::LeaseServer>>,
    /// Where the peer listener is bound (the configured address, resolved if it was port 0).
    peer_addr: SocketAddr,
    /// Dropping it stops the peer listener.
    _peer_stop: tokio::sync::oneshot::Sender<()>,
}

fn config_error(e: impl std::fmt::Display) -> ElectorError {
    ElectorError::Config(e.to_string())
}

/// Where this node's peer listener binds: `raft.peer_listen`, else its own `peer_addr`.
fn peer_listen_addr(cfg: &NodeConfig) -> ElectorResult<SocketAddr> {
    if let Some(a) = cfg.raft.peer_listen {
        return Ok(a);
    }
    let own = cfg.raft.peers.iter().find(|p| p.id == cfg.node_id);
    let addr = own.map(|p| p.peer_addr.as_str()).unwrap_or("");
    addr.parse().map_err(|_| {
        config_error(format!(
            "raft.peer_listen is not set and this node's peer_addr {addr:?} is not an ip:port"
        ))
    })
}

/// The key peer requests are authenticated with. Refuses to start a node whose peer listener is
/// reachable beyond loopback, or whose group has other members, without a cluster secret. A
/// one-member group on loopback gets a random key: it has nobody to talk to, so nobody can sign.
pub fn peer_auth_key(cfg: &NodeConfig, listen: SocketAddr) -> ElectorResult<Vec<u8>> {
    let secret = cfg.raft.secret().map_err(config_error)?;
    match secret {
        Some(s) if s.expose().len() >= MIN_SECRET_BYTES => Ok(s.expose().as_bytes().to_vec()),
        Some(_) => Err(config_error(format!(
            "raft.cluster_secret is shorter than {MIN_SECRET_BYTES} bytes (use e.g. 64 hex characters)"
        ))),
        None if !listen.ip().is_loopback() => Err(config_error(format!(
            "the raft peer listener {listen} is not on loopback: set raft.cluster_secret (or \
             raft.cluster_secret_file) so peer RPC is authenticated"
        ))),
        None if cfg.raft.peers.len() > 1 => Err(config_error(format!(
            "a raft group of {} members needs raft.cluster_secret (or raft.cluster_secret_file) \
             to authenticate peer RPC; `baton fleet` generates one",
            cfg.raft.peers.len()
        ))),
        None => Ok((0..32).map(|_| rand::random::<u8>()).collect()),
    }
}

fn unavailable(e: impl std::fmt::Display) -> ElectorError {
    ElectorError::Unavailable(e.to_string())
}

/// Raft's timing from `cfg`, checked: the election timeout range `(min, max)` in ms, the
/// heartbeat in ms (derived from the range unless set), and the lease, capped by the minimum
/// election timeout (checked usable unless `sharded`: there the shard table's leases serve).
fn raft_timing(cfg: &NodeConfig, sharded: bool) -> ElectorResult<(u64, u64, u64, Duration)> {
    let (emin, emax) = cfg
        .election_timeout_range_ms()
        .map_err(|e| ElectorError::Config(e.to_string()))?;
    if emin >= emax {
        return Err(ElectorError::Config(format!(
            "raft needs election_timeout_ms min < max, got {emin}-{emax}"
        )));
    }
    let heartbeat = match cfg.raft.heartbeat_interval_ms {
        0 => DEFAULT_HEARTBEAT_MS.min(emin / 3).max(1),
        h => h,
    };
    if heartbeat * 2 > emin {
        return Err(ElectorError::Config(format!(
            "raft.heartbeat_interval_ms ({heartbeat}) must be at most half the minimum election timeout ({emin})"
        )));
    }
    let lease_ttl = lease_bound(cfg)?;
    if !sharded {
        if lease_ttl.as_millis() < u128::from(cfg.lease_ttl_ms) {
            tracing::info!(
                configured_ms = cfg.lease_ttl_ms,
                granted_ms = lease_ttl.as_millis() as u64,
                "raft: lease_ttl capped at the minimum election timeout (an isolated leader must self-fence before a rival can win)"
            );
        }
        cfg.check_usable_lease(lease_ttl)
            .map_err(|e| ElectorError::Config(e.to_string()))?;
    }
    Ok((emin, emax, heartbeat, lease_ttl))
}

/// openraft's settings for that timing (snapshots, pre-vote, log reversion), validated.
fn openraft_config(emin: u64, emax: u64, heartbeat: u64) -> ElectorResult<openraft::Config> {
    openraft::Config {
        cluster_name: "baton".into(),
        election_timeout_min: emin,
        election_timeout_max: emax,
        heartbeat_interval: heartbeat,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(64),
        max_in_snapshot_log_to_keep: 16,
        enable_pre_vote: Some(true),
        enable_leader_restore: Some(false),
        // A member that lost its disk and rejoins under its old id answers appends with a
        // log that went backwards. Without this the leader's replication asserts on it
        // (openraft panics in debug builds; RaftCore dies and the node stays up, leaderless
        // for good: found by the nemesis). With it the leader resets that follower's progress
        // and re-replicates. Raft's own safety assumes durable votes and logs, so such a
        // member may vote twice in one term: two leaders of one term share one token, and
        // the fence refuses the second holder.
        allow_log_reversion: Some(true),
        ..Default::default()
    }
    .validate()
    .map_err(|e| ElectorError::Config(format!("openraft config: {e}")))
}

/// The lease a renewal may grant: the user's TTL, capped by the election-timeout bound.
pub fn lease_bound(cfg: &NodeConfig) -> ElectorResult<Duration> {
    let ttl_ms = cfg
        .raft_lease_ttl_ms()
        .map_err(|e| ElectorError::Config(e.to_string()))?;
    Ok(Duration::from_millis(ttl_ms))
}

impl RaftElector {
    /// Opens the store in `<state_dir>/raft/`, binds the authenticated peer listener (see
    /// [`server`]) and starts raft. The listener stops when the elector is dropped.
    pub async fn start(cfg: &NodeConfig) -> ElectorResult<RaftElector> {
        RaftElector::start_with(cfg, None).await
    }

    /// [`RaftElector::start`] for a sharded node (K > 1): the same raft member, whose peer
    /// listener also serves the shard lease table ([`shards`]) with leases of `shard_ttl`, each
    /// raft round of its requests bounded by `bound`. The raft leader's own lease (what
    /// `campaign` and `renew` grant) is not used at K > 1, so its bound is not checked.
    pub(crate) async fn start_sharded(
        cfg: &NodeConfig,
        shard_ttl: Duration,
        bound: Duration,
    ) -> ElectorResult<RaftElector> {
        RaftElector::start_with(cfg, Some((shard_ttl, bound))).await
    }

    async fn start_with(
        cfg: &NodeConfig,
        sharded: Option<(Duration, Duration)>,
    ) -> ElectorResult<RaftElector> {
        let peers = PeerMap::new(&cfg.raft.peers).map_err(ElectorError::Config)?;
        let me = peers.raft_id(&cfg.node_id).ok_or_else(|| {
            ElectorError::Config(format!(
                "raft.peers does not list this node ({})",
                cfg.node_id
            ))
        })?;
        let (emin, emax, heartbeat, lease_ttl) = raft_timing(cfg, sharded.is_some())?;
        let config = openraft_config(emin, emax, heartbeat)?;

        // Refuse an unauthenticated peer listener before touching the disk or the network.
        let listen = peer_listen_addr(cfg)?;
        let auth = PeerAuth::new(&peer_auth_key(cfg, listen)?, DEFAULT_WINDOW_MS);
        let dir: PathBuf = cfg.state_dir.join("raft");
        let log = LogStore::open(&dir)
            .map_err(|e| ElectorError::Config(format!("raft store {}: {e}", dir.display())))?;
        let sm = StateMachine::open(&dir)
            .map_err(|e| ElectorError::Config(format!("raft state {}: {e}", dir.display())))?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| config_error(format!("binding the raft peer listener {listen}: {e}")))?;
        let peer_addr = listener.local_addr().map_err(config_error)?;
        let shared = Arc::new(Shared {
            node_id: cfg.node_id.clone(),
            me,
            peers,
            config: Arc::new(config),
            log,
            sm,
            faults: Arc::new(faults::PeerFaults::new(&cfg.node_id, &cfg.state_dir)),
            auth,
            raft: RwLock::new(None),
            lifecycle: tokio::sync::Mutex::new(()),
            won_term: Mutex::new(None),
            lease_ttl,
            heartbeat: Duration::from_millis(heartbeat),
            election_max: Duration::from_millis(emax),
            contact: Default::default(),
        });
        let lease = sharded.map(|(ttl, bound)| {
            Arc::new(lease_server::LeaseServer::new(
                shared.clone(),
                shared.sm.clone(),
                me,
                ttl,
                bound,
            ))
        });
        let peer_stop = spawn_peer_server(&shared, listener, &cfg.raft.peers, lease.clone());
        tracing::info!(node = %cfg.node_id, %peer_addr, "raft peer listener up (authenticated)");
        let elector = RaftElector {
            shared,
            lease,
            peer_addr,
            _peer_stop: peer_stop,
        };
        elector.ensure_started().await?;
        Ok(elector)
    }

    /// Where this node's raft peer listener is bound.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    /// The running raft (tests and diagnostics).
    pub fn raft(&self) -> Option<RaftHandle> {
        self.shared.current()
    }

    /// This node's raft id.
    pub fn raft_id(&self) -> u64 {
        self.shared.me
    }

    /// The lease a successful renewal grants.
    pub fn lease_ttl(&self) -> Duration {
        self.shared.lease_ttl
    }

    fn set_won(&self, term: Option<u64>) {
        *self
            .shared
            .won_term
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = term;
    }

    fn won(&self) -> Option<u64> {
        *self
            .shared
            .won_term
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    async fn ensure_started(&self) -> ElectorResult<RaftHandle> {
        let s = &self.shared;
        let _g = s.lifecycle.lock().await;
        if let Some(r) = s.current() {
            return Ok(r);
        }
        let raft = openraft::Raft::new(
            s.me,
            s.config.clone(),
            NetworkFactory::new(
                &s.node_id,
                s.peers.clone(),
                s.faults.clone(),
                s.auth.clone(),
            ),
            s.log.clone(),
            s.sm.clone(),
        )
        .await
        .map_err(|e| unavailable(format!("starting raft: {e}")))?;
        *s.raft.write().unwrap_or_else(|p| p.into_inner()) = Some(raft.clone());
        tracing::info!(node = %s.node_id, raft_id = s.me, "raft started");
        let weak = Arc::downgrade(s);
        tokio::spawn(prompt::prompt_elections(
            move || weak.upgrade().and_then(|s| s.current()),
            s.contact.clone(),
            prompt::PromptTiming {
                leader_lease: s.election_max,
                heartbeat: s.heartbeat,
                jitter_window: prompt::PromptTiming::jitter_window(
                    s.peers.ids().count(),
                    Duration::from_millis(s.config.election_timeout_min),
                    s.election_max,
                ),
            },
        ));

        // Bootstrap: a pristine member initialises the cluster with every peer. The lowest id
        // goes first; the others wait a stagger so they normally just receive its log instead.
        let position = s.peers.ids().position(|id| id == s.me).unwrap_or(0) as u32;
        let (members, stagger, r) = (s.peers.members(), s.election_max * 2, raft.clone());
        let node = s.node_id.clone();
        tokio::spawn(async move {
            tokio::time::sleep(stagger * position).await;
            match r.is_initialized().await {
                Ok(false) => match r.initialize(members).await {
                    Ok(()) => tracing::info!(%node, "raft cluster initialised"),
                    Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                    Err(e) => tracing::warn!(%node, error = %e, "raft initialize failed"),
                },
                Ok(true) => {}
                Err(_) => {} // shut down meanwhile
            }
        });
        Ok(raft)
    }

    /// Stops this node standing for election for two election timeouts, the successor's head
    /// start. The transfer message can fail to reach the successor (a leader stepping down
    /// because it is out of descriptors cannot connect to it); the leader then only stops
    /// heartbeating, and without this its own election timer could win the next term back —
    /// the unserviceable node re-elected. It still votes, so the others elect among themselves.
    fn stand_aside(&self, raft: &RaftHandle) {
        raft.runtime_config().elect(false);
        let (raft, head_start) = (raft.clone(), self.shared.election_max * 2);
        tokio::spawn(async move {
            tokio::time::sleep(head_start).await;
            raft.runtime_config().elect(true);
        });
    }

    /// The most up-to-date follower (by replicated log id), for a hand-over without a name.
    fn best_follower(&self, raft: &RaftHandle) -> Option<u64> {
        let m = raft.metrics().borrow_watched().clone();
        let replication = m.replication.as_ref()?;
        replication
            .iter()
            .filter(|(id, _)| **id != self.shared.me)
            .max_by(|(ia, la), (ib, lb)| la.cmp(lb).then(ib.cmp(ia)))
            .map(|(id, _)| *id)
    }
}

#[async_trait]
impl Elector for RaftElector {
    fn kind(&self) -> BackendKind {
        BackendKind::Raft
    }

    fn supports_transfer(&self) -> bool {
        true
    }

    async fn campaign(&self) -> ElectorResult<Win> {
        let raft = self.ensure_started().await?;
        let me = self.shared.me;
        let mut rx = raft.metrics();
        // When this node's election timer fired (it became candidate) for the contest it wins;
        // reset whenever another leader is seen. A candidacy too short to be seen in the
        // metrics stays unknown rather than counting as zero.
        let mut candidate_since: Option<Instant> = None;
        loop {
            if self.shared.current().is_none() {
                return Err(unavailable("raft was shut down during the campaign"));
            }
            let leading = {
                let m = rx.borrow_watched();
                match m.state {
                    ServerState::Candidate => {
                        candidate_since.get_or_insert_with(Instant::now);
                    }
                    ServerState::Follower if m.current_leader.is_some() => candidate_since = None,
                    _ => {}
                }
                m.state == ServerState::Leader && m.current_leader == Some(me)
            };
            if leading {
                let sent_at = Instant::now();
                let read = tokio::time::timeout(
                    self.shared.election_max * 2,
                    raft.ensure_linearizable(ReadPolicy::ReadIndex),
                )
                .await;
                if let Ok(Ok(read)) = read {
                    let term = read.committed_leader_id().term;
                    // Checked before we claim the term: one that cannot be a token is not acted on.
                    let token = FenceToken::checked("raft term", term)?;
                    self.set_won(Some(term));
                    return Ok(Win {
                        token,
                        grant: Grant {
                            sent_at,
                            ttl: self.shared.lease_ttl,
                        },
                        vacant_since: candidate_since,
                    });
                }
                // Transferring away, or no quorum yet: wait for a change, but poll anyway.
                let _ = tokio::time::timeout(self.shared.heartbeat, rx.changed()).await;
                continue;
            }
            // Bounded, so a shutdown or a missed wake-up is noticed.
            let changed = tokio::time::timeout(self.shared.election_max, rx.changed()).await;
            if let Ok(Err(_)) = changed {
                return Err(unavailable("raft stopped"));
            }
        }
    }

    async fn renew(&self) -> ElectorResult<Option<Grant>> {
        let Some(term) = self.won() else {
            return Ok(None);
        };
        let lost = |why: String| {
            self.set_won(None);
            Err(ElectorError::LeaseLost(why))
        };
        let Some(raft) = self.shared.current() else {
            return lost("raft is shut down".into());
        };
        {
            let m = raft.metrics().borrow_watched().clone();
            if m.current_term != term || m.state != ServerState::Leader {
                return lost(format!(
                    "no longer raft leader of term {term} (now term {}, {:?})",
                    m.current_term, m.state
                ));
            }
        }
        let sent_at = Instant::now();
        match tokio::time::timeout(
            self.shared.lease_ttl,
            raft.ensure_linearizable(ReadPolicy::ReadIndex),
        )
        .await
        {
            Ok(Ok(read)) if read.committed_leader_id().term == term => Ok(Some(Grant {
                sent_at,
                ttl: self.shared.lease_ttl,
            })),
            Ok(Ok(read)) => lost(format!(
                "term moved from {term} to {}",
                read.committed_leader_id().term
            )),
            Ok(Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(e)))) => {
                Err(unavailable(format!("no quorum: {e}")))
            }
            Ok(Err(e)) => lost(format!("raft refused the lease read: {e}")),
            Err(_) => Err(unavailable(format!(
                "no quorum acknowledged within the {:?} lease",
                self.shared.lease_ttl
            ))),
        }
    }

    /// A ReadIndex round (`ensure_linearizable(ReadIndex)`, never openraft's LeaseRead, which
    /// was stale during leadership transfer, databendlabs/openraft#1747): true only when this
    /// node still leads `token`'s term and a quorum acknowledged a heartbeat sent after the call.
    /// Changes nothing (unlike `renew`, a refusal here does not end the term).
    async fn confirm_leadership(&self, _me: &str, token: FenceToken) -> ElectorResult<bool> {
        if self.won().map(|t| t as i64) != Some(token.0) {
            return Ok(false);
        }
        let Some(raft) = self.shared.current() else {
            return Ok(false);
        };
        {
            let m = raft.metrics().borrow_watched().clone();
            if m.state != ServerState::Leader || m.current_term as i64 != token.0 {
                return Ok(false);
            }
        }
        count_request(BackendKind::Raft, "confirm");
        match tokio::time::timeout(
            self.shared.election_max,
            raft.ensure_linearizable(ReadPolicy::ReadIndex),
        )
        .await
        {
            Ok(Ok(read)) => Ok(read.committed_leader_id().term as i64 == token.0),
            Ok(Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(e)))) => {
                Err(unavailable(format!("no quorum: {e}")))
            }
            Ok(Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(_)))) => Ok(false),
            Ok(Err(e)) => Err(unavailable(format!("raft refused the read: {e}"))),
            Err(_) => Err(unavailable(format!(
                "no quorum acknowledged within {:?}",
                self.shared.election_max
            ))),
        }
    }

    async fn resign(&self, successor: Option<&str>) -> ElectorResult<()> {
        self.set_won(None);
        let Some(raft) = self.shared.current() else {
            return Ok(());
        };
        let me = self.shared.me;
        let leading = {
            let m = raft.metrics().borrow_watched().clone();
            m.state == ServerState::Leader && m.current_leader == Some(me)
        };
        if !leading {
            return Ok(());
        }
        let target = match successor {
            Some(name) => self.shared.peers.raft_id(name).ok_or_else(|| {
                ElectorError::Config(format!("successor {name} is not in raft.peers"))
            })?,
            None => match self.best_follower(&raft) {
                Some(t) => t,
                None => return Ok(()), // a one-member group has nobody to hand over to
            },
        };
        if target == me {
            return Ok(());
        }
        self.stand_aside(&raft);
        raft.trigger()
            .transfer_leader(target)
            .await
            .map_err(unavailable)?;
        // Wait (bounded) until we no longer lead: the successor's election reaches us.
        let deadline = tokio::time::Instant::now() + self.shared.election_max * 2;
        let mut rx = raft.metrics();
        loop {
            {
                let m = rx.borrow_watched();
                if m.state != ServerState::Leader || m.current_leader != Some(me) {
                    return Ok(());
                }
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                // Timed out or stopped: we no longer heartbeat, so the others elect after the lease.
                _ => return Ok(()),
            }
        }
    }

    async fn leader(&self) -> ElectorResult<Option<LeaderInfo>> {
        let Some(raft) = self.shared.current() else {
            return Ok(None);
        };
        let leader = raft.metrics().borrow_watched().current_leader;
        Ok(leader
            .and_then(|id| self.shared.peers.peer(id))
            .map(|p| LeaderInfo {
                node_id: p.id.clone(),
                http_addr: Some(p.addr.clone()),
            }))
    }

    async fn close(&self) -> ElectorResult<()> {
        self.set_won(None);
        let s = &self.shared;
        let _g = s.lifecycle.lock().await;
        let taken = s.raft.write().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(raft) = taken {
            match tokio::time::timeout(Duration::from_secs(5), raft.shutdown()).await {
                Ok(Ok(())) => tracing::info!(node = %s.node_id, "raft shut down"),
                Ok(Err(e)) => tracing::warn!(node = %s.node_id, error = %e, "raft shutdown"),
                Err(_) => tracing::warn!(node = %s.node_id, "raft shutdown timed out"),
            }
        }
        Ok(())
    }
}
