//! Leader-only work. Work is *registered* with the node (see [`crate::node::NodeBuilder::with_work`]),
//! not hard-coded into the supervisor: the supervisor starts every registered [`LeaderWork`] on
//! `Elected(token)` and, on demotion, checkpoints then stops each one before releasing the lease.
//!
//! A user's own singleton job plugs in the same way: implement [`LeaderWork`], spawn your actor
//! linked to `ctx.supervisor`, and send every protected write through `ctx.fence` with `ctx.token`.

pub mod child;
pub mod db;
pub mod fence;
pub mod job;
pub(crate) mod scheduler;
pub(crate) mod sequencer;

use std::time::Duration;

use async_trait::async_trait;
use ractor::ActorCell;

use crate::backends::FenceToken;
use crate::leadership::Leadership;
use crate::trace::ActorTrace;
pub use fence::{BudgetState, Fence, FenceError, FencedTransaction, ResourceState};
pub use job::Term;
pub use sequencer::SEQ_IDLE_CLOSE;

/// What a piece of leader work is given when its node wins.
#[derive(Clone)]
pub struct WorkContext {
    /// The fencing token of the term just won: pass it with every protected write.
    pub token: FenceToken,
    /// This node's id, also the holder the fence records for this term's writes.
    pub node_id: String,
    /// The node's handle on the fenced resource (holder = `node_id`).
    pub fence: Fence,
    /// The node's actor-trace log, for the work's own lifecycle steps.
    pub trace: ActorTrace,
    /// Link the work's actor to this cell so the supervisor hears when it dies.
    pub supervisor: ActorCell,
    /// The node's view of its term (e.g. [`Leadership::last_deadline`], the watchdog's deadline).
    pub leadership: std::sync::Arc<Leadership>,
    /// The shard this term is of (shard 0 on an unsharded node). `fence` already writes in
    /// this shard's fence domain.
    pub shard: crate::shard::ShardId,
}

/// Why a piece of leader work could not start or checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum WorkError {
    /// [`LeaderWork::start`] failed. At the start of a term the works already started are stopped
    /// and the node demotes; on a restart the work's [`SupervisionPolicy`] applies.
    #[error("could not start {work}: {reason}")]
    Start {
        /// The [`LeaderWork::name`] of the work.
        work: &'static str,
        /// What went wrong, for logs and the actor trace.
        reason: String,
    },
    /// [`RunningWork::checkpoint`] failed: the failure is traced and demotion goes on (stop,
    /// then release); progress since the last successful checkpoint may not be published.
    #[error("checkpoint of {work} failed: {reason}")]
    Checkpoint {
        /// The [`RunningWork::name`] of the work.
        work: &'static str,
        /// What went wrong, for logs and the actor trace.
        reason: String,
    },
}

/// A kind of leader-only work (a factory: one instance per leadership term).
#[async_trait]
pub trait LeaderWork: Send + Sync + 'static {
    /// A short name for the work: the actor name in the trace, the `work` label of
    /// [`WORK_RESTARTS`](crate::metrics::WORK_RESTARTS), and the prefix of its error messages.
    /// Should be unique among a node's registered works (not checked).
    fn name(&self) -> &'static str;
    /// Starts the work for one term. Called only with a token in hand.
    async fn start(&self, ctx: WorkContext) -> Result<Box<dyn RunningWork>, WorkError>;
    /// The longest this work may need to checkpoint and stop, if it knows (an external program:
    /// its stop timeout plus the kill). A node refuses to start when its `work_stop_timeout_ms`
    /// is shorter, because the supervisor would otherwise give up on the work before it stopped.
    fn stop_bound(&self) -> Option<Duration> {
        None
    }
}

/// One running term of a [`LeaderWork`].
#[async_trait]
pub trait RunningWork: Send + Sync {
    /// The name used for this term's trace lines; normally its [`LeaderWork::name`].
    fn name(&self) -> &'static str;
    /// The actor to stop (and to kill after the stop bound).
    fn cell(&self) -> ActorCell;
    /// Quiesce and publish durable progress through the fence. Called on demotion, before stop.
    async fn checkpoint(&self) -> Result<(), WorkError>;
}

/// What the supervisor does when a piece of leader work fails (or returns) on its own during a
/// term. Whatever the policy, demotion still runs checkpoint → stop → release.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum SupervisionPolicy {
    /// Give up the term so another node tries (the default: the failure may be this node's).
    #[default]
    Demote,
    /// Start the work again inside the same term, with the same token, after `backoff`, doubled
    /// for each earlier restart in the window (capped at 30 s, stretched by up to 20%: see
    /// `actors::backoff`); at most `max` restarts within any window of `within`, after which the
    /// node demotes.
    Restart {
        /// Restarts allowed within any window of `within`; the next failure demotes instead.
        max: u32,
        /// The sliding window the restarts are counted in.
        within: Duration,
        /// The wait before the first restart in the window; each later one waits twice the last.
        backoff: Duration,
    },
    /// Demote (checkpoint, stop, release), then stop the whole node.
    Shutdown,
}

/// A registered piece of leader work and its supervision policy.
#[derive(Clone)]
pub struct Registered {
    /// The factory started on every win.
    pub work: std::sync::Arc<dyn LeaderWork>,
    /// What the supervisor does when the work fails during a term.
    pub policy: SupervisionPolicy,
}
