//! Where callers reach a term's sequencer ([`SequencerHandle`]), and the sequencer as
//! registered leader work ([`SequencerWork`]): starting a term's actor and checkpointing it.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ractor::{Actor, ActorCell, ActorRef};
use tokio::sync::oneshot;

use super::actor::Sequencer;
use super::homes::{AnswerHome, Pending};
use super::intake::{Appended, Intake};
use super::window::{Window, WindowSettings};
use super::{CommitLimits, IdBlock, NextCallError, NextError, SequencerMsg};
use crate::config::SequencerMode;
use crate::work::{LeaderWork, RunningWork, WorkContext, WorkError};

/// This term's sequencer as callers reach it: its intake (or window).
#[derive(Clone)]
struct Running {
    intake: Arc<Intake>,
    window: Option<Arc<Window>>,
}

/// Where the HTTP layer finds the current term's sequencer (empty while not leading).
#[derive(Clone, Default)]
pub struct SequencerHandle {
    running: Arc<RwLock<Option<Running>>>,
    /// The runtime the sequencer's commit path runs on (see [`SequencerHandle::offer_commit_runtime`]).
    commit_rt: Arc<std::sync::OnceLock<tokio::runtime::Handle>>,
}

// Read by the HTTP layer's POST /next; without the `http` feature nothing calls these.
#[cfg_attr(not(feature = "http"), allow(dead_code))]
impl SequencerHandle {
    fn get(&self) -> Option<Running> {
        self.running.read().ok().and_then(|g| g.clone())
    }
    fn set(&self, r: Option<Running>) {
        if let Ok(mut g) = self.running.write() {
            *g = r;
        }
    }

    /// Offers `rt` as the runtime the sequencer's actor, its commits and its database
    /// connection run on from the next term on; the first offer stands. Without one they run
    /// on the node's runtime.
    pub(crate) fn offer_commit_runtime(&self, rt: tokio::runtime::Handle) {
        let _ = self.commit_rt.set(rt);
    }

    /// Asks the running sequencer for `n` IDs. In durable mode the request waits in `home`'s
    /// queue (the caller's own runtime) and is answered there with the rest of that home's
    /// share of its group commit, or, without a home, straight from the commit; in window mode
    /// it is served here, from memory.
    pub async fn next(
        &self,
        n: u32,
        timeout: Duration,
        home: Option<AnswerHome>,
    ) -> Result<IdBlock, NextCallError> {
        let running = self.get().ok_or(NextCallError::NotRunning)?;
        if let Some(window) = &running.window {
            return window.next(n, timeout).await;
        }
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            n,
            reply,
            arrived: Instant::now(),
        };
        match running.intake.append(pending, home.as_ref()) {
            Appended::Closed => return Err(NextCallError::Next(NextError::Demoting)),
            Appended::Queued => {}
            // If the term is over the intake is closed, and what waits in it answered, by its
            // actor's stop or else by the commit loop's end.
            Appended::WakeCommitter => running.intake.wake_committer(),
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(r)) => r.map_err(NextCallError::Next),
            Ok(Err(_)) => Err(NextCallError::NotRunning),
            Err(_) => Err(NextCallError::Timeout),
        }
    }
}

/// The sequencer as registered leader work: one factory for every shard, each shard's term
/// serving through that shard's handle (`handles[shard]`).
pub struct SequencerWork {
    pub handles: Vec<SequencerHandle>,
    pub limits: CommitLimits,
    /// `[sequencer] mode`.
    pub mode: SequencerMode,
    /// How window mode runs (unused in durable mode).
    pub window: WindowSettings,
}

struct RunningSequencer {
    actor: ActorRef<SequencerMsg>,
    handle: SequencerHandle,
}

#[async_trait]
impl LeaderWork for SequencerWork {
    fn name(&self) -> &'static str {
        "sequencer"
    }

    async fn start(&self, ctx: WorkContext) -> Result<Box<dyn RunningWork>, WorkError> {
        let handle = self
            .handles
            .get(ctx.shard.0 as usize)
            .cloned()
            .ok_or_else(|| WorkError::Start {
                work: "sequencer",
                reason: format!("no sequencer handle for shard {}", ctx.shard),
            })?;
        let sup = ctx.supervisor.clone();
        let intake = Arc::new(Intake::default());
        let window = match self.mode {
            SequencerMode::Durable => None,
            SequencerMode::Window => Some(Arc::new(Window::new(
                ctx.token,
                ctx.leadership.clone(),
                self.window,
            ))),
        };
        let args = (ctx, self.limits, intake.clone(), window.clone());
        // On the offered runtime, else this one (see the module docs): `spawn_linked` starts
        // the actor's task on the runtime it is called on.
        let rt = handle
            .commit_rt
            .get()
            .cloned()
            .unwrap_or_else(tokio::runtime::Handle::current);
        let (actor, _) = rt
            .spawn(Actor::spawn_linked(None, Sequencer, args, sup))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|reason| WorkError::Start {
                work: "sequencer",
                reason,
            })?;
        handle.set(Some(Running { intake, window }));
        Ok(Box::new(RunningSequencer { actor, handle }))
    }
}

#[async_trait]
impl RunningWork for RunningSequencer {
    fn name(&self) -> &'static str {
        "sequencer"
    }
    fn cell(&self) -> ActorCell {
        self.actor.get_cell()
    }
    async fn checkpoint(&self) -> Result<(), WorkError> {
        // Unpublish first: from here on HTTP answers "not leading" instead of queueing.
        self.handle.set(None);
        match self
            .actor
            .call(SequencerMsg::Checkpoint, Some(Duration::from_secs(5)))
            .await
        {
            Ok(ractor::rpc::CallResult::Success(())) => Ok(()),
            // An actor that already stopped has nothing left in flight.
            Ok(ractor::rpc::CallResult::SenderError) | Err(_) => Ok(()),
            Ok(ractor::rpc::CallResult::Timeout) => Err(WorkError::Checkpoint {
                work: "sequencer",
                reason: "in-flight commit did not finish in 5 s".into(),
            }),
        }
    }
}
