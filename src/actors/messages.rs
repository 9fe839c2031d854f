//! The messages of the supervision tree, in one place below every actor: the supervisor's
//! (from its elector, watchdog, works, placement and the node handle), the elector's and the
//! watchdog's. The supervisor spawns the other two and they report to it; with their messages
//! here, neither child imports its parent.

use std::time::{Duration, Instant};

use ractor::RpcReplyPort;
use serde::Serialize;

use crate::actors::DemotionReason;
use crate::backends::{ElectorError, FenceToken, Grant};
use crate::work::RunningWork;

pub enum SupervisorMsg {
    Elected {
        token: FenceToken,
        lease_deadline: Instant,
        /// When the grant behind `lease_deadline` was requested.
        grant_sent_at: Instant,
    },
    WorkStarted {
        token: FenceToken,
        /// The started works, or why the term gives up at once.
        result: Result<Vec<Slot>, DemotionReason>,
    },
    /// A `Restart` policy's backoff has passed: start work `index` again in term `token`.
    RestartDue {
        token: FenceToken,
        index: usize,
    },
    /// A restarted work is running again (or failed to start).
    WorkRestarted {
        token: FenceToken,
        index: usize,
        result: Result<Box<dyn RunningWork>, String>,
    },
    /// `token`: the term this is about (`None`: whatever term is current).
    Demoted {
        token: Option<FenceToken>,
        reason: DemotionReason,
    },
    WorkStopped {
        token: FenceToken,
    },
    Released {
        result: Result<(), String>,
    },
    StepDown {
        successor: Option<String>,
        reply: RpcReplyPort<Result<StepDownReport, StepDownError>>,
    },
    /// Demote if leading, then reply; the caller stops the tree afterwards.
    Shutdown(RpcReplyPort<()>),
    /// From placement: whether this node should hold this shard's term. `false` while leading
    /// is a hand-over: checkpoint, stop, release (the new owner is already campaigning).
    Placement {
        wanted: bool,
    },
}

/// The outcome of a completed step-down: leader work was checkpointed and stopped, then the lease
/// release was attempted. Sent only after the whole sequence has run.
#[derive(Clone, Debug, Serialize)]
pub struct StepDownReport {
    /// The token of the term given up.
    pub token: FenceToken,
    /// The successor that was requested, if any (not necessarily the node that won next).
    pub successor: Option<String>,
    /// CLOCK_MONOTONIC ns when all leader work had stopped, and when the lease was released.
    pub work_stopped_mono_ns: u64,
    /// CLOCK_MONOTONIC ns when the release answer arrived (see [`crate::clock::monotonic_ns`]);
    /// never before `work_stopped_mono_ns`.
    pub released_mono_ns: u64,
    /// Why the backend's release (resign) failed, if it did. Leader work had stopped regardless;
    /// when other nodes then see the seat free depends on the backend.
    pub release_error: Option<String>,
}

/// Why a step-down was refused or did not complete.
#[derive(Clone, Debug, thiserror::Error, Serialize)]
pub enum StepDownError {
    /// This node holds no term, or is already demoting; nothing was changed.
    #[error("this node is not the leader")]
    NotLeader,
    /// The request could not be served: a successor was named but the backend cannot transfer
    /// (nothing was changed), or the supervisor did not answer (stopping or stopped).
    #[error("{0}")]
    Unsupported(String),
}

/// One running piece of leader work and which registration it came from.
pub struct Slot {
    pub(super) index: usize,
    pub(super) running: Box<dyn RunningWork>,
}

pub enum ElectorMsg {
    Campaign,
    CampaignDone {
        result: Result<crate::backends::Win, ElectorError>,
        started: Instant,
    },
    RenewTick,
    RenewDone(Result<Option<Grant>, ElectorError>),
    /// From the supervisor, after leader work has fully stopped. `pause`: how long to wait
    /// before campaigning again (a renew interval after a voluntary hand-over, more after terms
    /// whose work failed: see `actors::backoff`).
    Release {
        successor: Option<String>,
        pause: Duration,
        /// The longest the release may take (at shutdown); `None`: the backend's own bounds.
        bound: Option<Duration>,
    },
    ReleaseDone {
        result: Result<(), ElectorError>,
        pause: Duration,
    },
    /// From the supervisor, on a placement change: whether this node seeks this shard's term.
    /// Off withdraws a pending candidacy (a term already held is given up by the supervisor's
    /// hand-over, which ends in `Release`); on campaigns at once.
    SetCandidate(bool),
    /// A withdrawn candidacy's session is closed: a campaign may start again.
    Withdrawn,
    /// From the node's failure detector (see [`crate::actors::PeerEvent`]).
    Peer(crate::actors::PeerEvent),
    /// The backend answered an [`Elector::expire_dead_holder`] for `dead`.
    DeadHolderExpired {
        dead: String,
        /// When the detector confirmed it (a failed expiry is retried for one lease TTL).
        confirmed_at: Instant,
        result: Result<crate::backends::DeadHolderExpiry, ElectorError>,
    },
    /// Try again the expiries that failed (the backend was unavailable: with raft, a dead node
    /// that led the raft group leaves no one to ask until the group elects).
    RetryDeadExpiry,
}

pub enum WatchdogMsg {
    /// Start guarding a term.
    Arm {
        token: FenceToken,
        deadline: Instant,
        /// When the grant behind `deadline` was requested.
        sent_at: Instant,
    },
    /// A renewal moved the deadline (only ever later is meaningful; earlier is taken too).
    Extend {
        token: FenceToken,
        deadline: Instant,
        sent_at: Instant,
    },
    /// The term ended through another path.
    Disarm,
    /// A timer armed for `generation` fired.
    Fire { generation: u64 },
}
