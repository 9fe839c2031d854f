//! A job in a few lines: a closure given a [`Term`], run while (and only while) this node leads.
//!
//! ```no_run
//! # async fn demo(cfg: baton::config::NodeConfig) -> anyhow::Result<()> {
//! use baton::node::NodeBuilder;
//! use baton::work::Term;
//!
//! let node = NodeBuilder::new(cfg)
//!     .with_job("compactor", |mut term: Term| async move {
//!         while !term.is_stopping() {
//!             // ... one step of work, its writes through term.fence() with term.token() ...
//!             term.sleep(std::time::Duration::from_secs(1)).await;
//!         }
//!         Ok(()) // checkpoint before returning: demotion waits for it (up to a bound)
//!     })
//!     .start()
//!     .await?;
//! # node.shutdown().await }
//! ```
//!
//! Under the hood the closure runs in a task owned by a small actor linked to the supervisor, so
//! a closure job obeys the same guarantees as any [`LeaderWork`]: it starts only with a token;
//! on demotion [`Term::stopping`] resolves first (that is the checkpoint step: the job finishes
//! its step, publishes its progress and returns), then the actor is stopped, and a job still
//! running after the stop bound is aborted, all before the lease is released. A job that returns
//! or fails on its own during the term is handled by its supervision policy.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef};
use tokio::sync::watch;

use super::{Fence, LeaderWork, RunningWork, WorkContext, WorkError};
use crate::elector::FenceToken;
use crate::tasks::AbortOnDrop;

/// One term of leadership, as a closure job sees it.
pub struct Term {
    token: FenceToken,
    holder: String,
    fence: Fence,
    stopping: watch::Receiver<bool>,
    shard: crate::shard::ShardId,
}

impl Term {
    /// The shard this term is of (shard 0 on an unsharded node). [`Term::fence`] already writes
    /// in this shard's fence domain: `begin("orders", ..)` is fenced as `orders#S`.
    pub fn shard(&self) -> crate::shard::ShardId {
        self.shard
    }

    /// The fencing token of this term: pass it with every protected write.
    pub fn token(&self) -> FenceToken {
        self.token
    }

    /// This node's id, the holder the fence records for this term's writes.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Fenced access to the protected PostgreSQL (see [`Fence::begin`] for your own tables).
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Whether demotion has begun: finish the current step, checkpoint and return.
    pub fn is_stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Resolves when demotion begins (at once if it already has).
    pub async fn stopping(&mut self) {
        let _ = self.stopping.wait_for(|s| *s).await;
    }

    /// Sleeps for `d`, or less if demotion begins meanwhile.
    pub async fn sleep(&mut self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.stopping() => {}
        }
    }
}

type BoxedJob =
    Box<dyn Fn(Term) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> + Send + Sync>;

/// A closure as a [`LeaderWork`] (see [`crate::node::NodeBuilder::with_job`]).
pub struct FnWork {
    name: &'static str,
    job: Arc<BoxedJob>,
}

impl FnWork {
    /// Wraps `job`, called once per term with that term's [`Term`]; `name` is the work's
    /// [`LeaderWork::name`]. A job that ends on its own before demotion begins (returns `Ok` or
    /// `Err`, or panics) has ended its work for the term; its supervision policy decides what
    /// follows.
    pub fn new<F, Fut>(name: &'static str, job: F) -> FnWork
    where
        F: Fn(Term) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        FnWork {
            name,
            job: Arc::new(Box::new(move |t| Box::pin(job(t)))),
        }
    }
}

#[async_trait]
impl LeaderWork for FnWork {
    fn name(&self) -> &'static str {
        self.name
    }

    async fn start(&self, ctx: WorkContext) -> Result<Box<dyn RunningWork>, WorkError> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let (done_tx, done_rx) = watch::channel(None);
        let term = Term {
            token: ctx.token,
            holder: ctx.node_id.clone(),
            fence: ctx.fence.clone(),
            stopping: stop_rx,
            shard: ctx.shard,
        };
        let fut = (self.job)(term);
        let args = JobArgs {
            fut: Some(fut),
            done_tx,
        };
        let (actor, _) = Actor::spawn_linked(None, JobActor, args, ctx.supervisor)
            .await
            .map_err(|e| WorkError::Start {
                work: self.name,
                reason: e.to_string(),
            })?;
        Ok(Box::new(RunningJob {
            name: self.name,
            cell: actor.get_cell(),
            stop_tx,
            done_rx,
        }))
    }
}

/// How the job's future ended: `Ok` when it returned `Ok(())`, else its error chain.
type JobEnd = Result<(), String>;

struct RunningJob {
    name: &'static str,
    cell: ActorCell,
    stop_tx: watch::Sender<bool>,
    /// `Some` once the job's future has ended.
    done_rx: watch::Receiver<Option<JobEnd>>,
}

#[async_trait]
impl RunningWork for RunningJob {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cell(&self) -> ActorCell {
        self.cell.clone()
    }

    /// Tells the job to stop and waits until it has returned: a closure job checkpoints itself
    /// before returning. The supervisor bounds this wait, then stops (and if need be kills) it.
    /// A job that returns an error (a commit the next term cut off, a refused write) fails the
    /// checkpoint with its error chain: the supervisor says it, as the term is already ending.
    async fn checkpoint(&self) -> Result<(), WorkError> {
        let _ = self.stop_tx.send(true);
        let mut done = self.done_rx.clone();
        let end = done
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|d| d.clone());
        match end {
            Some(Err(reason)) => Err(WorkError::Checkpoint {
                work: self.name,
                reason,
            }),
            _ => Ok(()),
        }
    }
}

struct JobArgs {
    fut: Option<Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>>,
    done_tx: watch::Sender<Option<JobEnd>>,
}

enum JobMsg {
    /// The job's future finished: `Ok` when it returned `Ok(())`, else why not.
    Ended(Result<(), String>),
}

struct JobState {
    /// Aborted with the actor, also when the actor is killed after the stop bound.
    _task: AbortOnDrop,
}

struct JobActor;

#[async_trait]
impl Actor for JobActor {
    type Msg = JobMsg;
    type State = JobState;
    type Arguments = JobArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<JobMsg>,
        mut args: JobArgs,
    ) -> Result<JobState, ActorProcessingErr> {
        let fut = args.fut.take().expect("a job future per start");
        let done_tx = args.done_tx;
        let task = tokio::spawn(async move {
            let result = match AssertUnwindSafe(fut).catch_unwind().await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("{e:#}")),
                Err(_) => Err("panicked".to_owned()),
            };
            let _ = done_tx.send(Some(result.clone()));
            let _ = myself.cast(JobMsg::Ended(result));
        });
        Ok(JobState {
            _task: AbortOnDrop(task),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<JobMsg>,
        msg: JobMsg,
        _state: &mut JobState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            // The supervisor names the work: `NAME: returned`.
            JobMsg::Ended(Ok(())) => myself.stop(Some("returned".to_owned())),
            // Failing the actor tells the supervisor why (its policy decides what follows). The
            // supervisor names the work (`NAME: failed: ...`): the error chain alone, so that
            // the name is said once.
            JobMsg::Ended(Err(e)) => return Err(e.into()),
        }
        Ok(())
    }
}
