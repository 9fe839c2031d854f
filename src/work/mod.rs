//! Leader-only work. Work is *registered* with the node (see [`crate::node::NodeBuilder::with_work`]),
//! not hard-coded into the supervisor: the supervisor starts every registered [`LeaderWork`] on
//! `Elected(token)` and, on demotion, checkpoints then stops each one before releasing the lease.
//!
//! A user's own singleton job plugs in the same way: implement [`LeaderWork`], spawn your actor
//! linked to `ctx.supervisor`, and send every protected write through `ctx.fence` with `ctx.token`.

pub mod fence;
pub mod job;
pub(crate) mod scheduler;
pub(crate) mod sequencer;

use std::time::Duration;

use async_trait::async_trait;
use ractor::ActorCell;

use crate::backends::FenceToken;
use crate::trace::ActorTrace;
pub use fence::{Fence, FenceError, FencedTransaction};
pub use job::Term;

/// What a piece of leader work is given when its node wins.
#[derive(Clone)]
pub struct WorkContext {
    pub token: FenceToken,
    pub node_id: String,
    pub fence: Fence,
    pub trace: ActorTrace,
    /// Link the work's actor to this cell so the supervisor hears when it dies.
    pub supervisor: ActorCell,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkError {
    #[error("could not start {work}: {reason}")]
    Start { work: &'static str, reason: String },
    #[error("checkpoint of {work} failed: {reason}")]
    Checkpoint { work: &'static str, reason: String },
}

/// A kind of leader-only work (a factory: one instance per leadership term).
#[async_trait]
pub trait LeaderWork: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// Starts the work for one term. Called only with a token in hand.
    async fn start(&self, ctx: WorkContext) -> Result<Box<dyn RunningWork>, WorkError>;
}

/// One running term of a [`LeaderWork`].
#[async_trait]
pub trait RunningWork: Send + Sync {
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
    /// Start the work again inside the same term, with the same token, after `backoff`; at most
    /// `max` restarts within any window of `within`, after which the node demotes.
    Restart {
        max: u32,
        within: Duration,
        backoff: Duration,
    },
    /// Demote (checkpoint, stop, release), then stop the whole node.
    Shutdown,
}

/// A registered piece of leader work and its supervision policy.
#[derive(Clone)]
pub struct Registered {
    pub work: std::sync::Arc<dyn LeaderWork>,
    pub policy: SupervisionPolicy,
}
