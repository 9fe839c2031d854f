//! The per-node supervision tree.
//!
//! ```text
//! NodeSupervisor                 owns the phase: follower -> starting -> leading -> demoting
//!  ├─ Elector                    the one campaign/renew loop over an `Elector` backend;
//!  │                             emits Elected{token, lease_deadline} and Demoted{reason}
//!  ├─ LeaseWatchdog              holds the monotonic deadline; emits Demoted{LeaseDeadline}
//!  └─ (only while leading)       every registered `LeaderWork`, e.g.
//!      ├─ Sequencer              POST /next, group-committed through the fence
//!      └─ Scheduler              a tick every T, durable work-set cursor
//! ```
//!
//! Ordering guarantees, all enforced by the (crate-private) `supervisor` module:
//! * work starts only after `Elected(token)`, and every protected write carries that token;
//! * demotion is **checkpoint → stop (await fully stopped, kill after a bound) → release**; the
//!   lease is never released while work may still run;
//! * no actor awaits slow I/O inside `handle()`: it spawns a task and gets the result as a message.

pub(crate) mod backoff;
pub(crate) mod budget;
#[cfg(feature = "swim")]
pub(crate) mod detector;
pub(crate) mod elector;
pub(crate) mod messages;
pub mod placement;
pub(crate) mod supervisor;
pub(crate) mod watchdog;

pub use messages::{StepDownError, StepDownReport};

use std::fmt;

use serde::Serialize;

/// What a failure detector tells every shard's elector (`[detector] kind = "swim"`). Published on
/// a broadcast channel: each elector subscribes, and one that lags only misses events it would
/// also learn from its backend when the lease runs out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerEvent {
    /// The detector confirmed this node dead (suspected, unrefuted for the suspicion timeout).
    ConfirmedDead(String),
    /// This node learnt that the others declared *it* dead (it has rejoined under a new
    /// identity): a leader demotes, since its lease is about to be ended by the others.
    DeclaredMeDead,
}

/// The sending side of a node's [`PeerEvent`]s.
pub type PeerEvents = tokio::sync::broadcast::Sender<PeerEvent>;

/// Why a node stops leading.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "reason", content = "detail")]
pub enum DemotionReason {
    /// The watchdog's monotonic deadline passed without a renewal.
    LeaseDeadline,
    /// The backend said the lease/session is gone.
    LeaseLost(String),
    /// `POST /stepdown` (optionally naming a successor).
    StepDown {
        /// The node asked to lead next; `None` lets the next candidate win. A request only, not a
        /// guarantee of who wins.
        successor: Option<String>,
    },
    /// A leader-work actor ended on its own (e.g. fenced out by the resource).
    WorkFailed(String),
    /// The node is shutting down.
    Shutdown,
    /// Placement moved this shard to another member: a planned hand-over (the new owner is
    /// already campaigning and claims as soon as this node releases).
    Handover,
    /// The fleet-wide failure budget was found spent as the term began (a campaign under way
    /// when the last allowed failure was recorded): the term gave up without starting its work.
    FailureBudgetExhausted,
}

impl fmt::Display for DemotionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DemotionReason::LeaseDeadline => f.write_str("lease-deadline"),
            DemotionReason::LeaseLost(d) => write!(f, "lease-lost: {d}"),
            DemotionReason::StepDown { successor: None } => f.write_str("step-down"),
            DemotionReason::StepDown { successor: Some(s) } => write!(f, "step-down to {s}"),
            DemotionReason::WorkFailed(d) => write!(f, "work-failed: {d}"),
            DemotionReason::Shutdown => f.write_str("shutdown"),
            DemotionReason::Handover => f.write_str("handover"),
            DemotionReason::FailureBudgetExhausted => f.write_str("failure-budget-exhausted"),
        }
    }
}
