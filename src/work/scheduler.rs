//! The Scheduler actor: a tick every T, written through the fence, that runs the next jobs of the
//! work-set and advances an in-memory cursor; the cursor is published through the fence every few
//! ticks and always on demotion. Publishing is one row whatever the size of the work-set, so a
//! handoff costs the same with 10M pending jobs as with none. Job runs are keyed by
//! `(job_id, scheduled_at)`: a replay after a crash that lost the last checkpoint is a no-op.

use std::time::Duration;

use async_trait::async_trait;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::config::SchedulerConfig;
use crate::metrics as m;
use crate::work::{FenceError, LeaderWork, RunningWork, WorkContext, WorkError};

pub const WORKSET_RESOURCE: &str = "workset";

pub enum SchedulerMsg {
    Claimed(Result<i64, FenceError>),
    Tick,
    TickDone(Result<(i64, i64), FenceError>),
    CheckpointDone(Result<(), FenceError>),
    /// Finish the tick in flight, publish the cursor, reply with the outcome.
    Checkpoint(RpcReplyPort<Result<i64, String>>),
}

pub struct SchedulerState {
    ctx: WorkContext,
    cfg: SchedulerConfig,
    position: Option<i64>,
    published: i64,
    ticks_since_checkpoint: u64,
    in_flight: bool,
    /// Set once demotion asked for the final checkpoint: no more ticks.
    final_checkpoint: Option<RpcReplyPort<Result<i64, String>>>,
    stopping: bool,
}

pub struct Scheduler;

#[async_trait]
impl Actor for Scheduler {
    type Msg = SchedulerMsg;
    type State = SchedulerState;
    type Arguments = (WorkContext, SchedulerConfig);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (ctx, cfg): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let (fence, token, me) = (ctx.fence.clone(), ctx.token, myself.clone());
        tokio::spawn(async move {
            let _ = me.cast(SchedulerMsg::Claimed(
                fence.cursor_claim(WORKSET_RESOURCE, token).await,
            ));
        });
        myself.send_interval(Duration::from_millis(cfg.tick_interval_ms.max(1)), || {
            SchedulerMsg::Tick
        });
        ctx.trace.step("scheduler", "started", Some(ctx.token), "");
        Ok(SchedulerState {
            ctx,
            cfg,
            position: None,
            published: 0,
            ticks_since_checkpoint: 0,
            in_flight: false,
            final_checkpoint: None,
            stopping: false,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.ctx.trace.step(
            "scheduler",
            "stopped",
            Some(state.ctx.token),
            &format!("position={:?}", state.position),
        );
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SchedulerMsg::Claimed(Ok(pos)) => state.claimed(&myself, pos),
            SchedulerMsg::Claimed(Err(e)) => {
                state.ctx.trace.step(
                    "scheduler",
                    "claim-failed",
                    Some(state.ctx.token),
                    &e.to_string(),
                );
                if let Some(reply) = state.final_checkpoint.take() {
                    let _ = reply.send(Err(e.to_string()));
                }
                myself.stop(Some(format!("work-set claim failed: {e}")));
            }
            SchedulerMsg::Tick => state.tick(&myself),
            SchedulerMsg::TickDone(res) => state.tick_done(&myself, res),
            SchedulerMsg::CheckpointDone(res) => state.checkpoint_done(&myself, res),
            SchedulerMsg::Checkpoint(reply) => {
                state.final_checkpoint = Some(reply);
                // Otherwise the tick in flight, or the pending claim, starts it when it returns.
                if !state.in_flight && state.position.is_some() {
                    state.start_checkpoint(&myself);
                }
            }
        }
        Ok(())
    }
}

impl SchedulerState {
    /// The claim landed: the cursor starts at `pos` (published), and a final checkpoint that
    /// waited for it starts.
    fn claimed(&mut self, myself: &ActorRef<SchedulerMsg>, pos: i64) {
        self.ctx.trace.step(
            "scheduler",
            "claimed",
            Some(self.ctx.token),
            &format!("position={pos}"),
        );
        self.position = Some(pos);
        self.published = pos;
        self.ctx
            .leadership
            .set_committed_cursor(self.ctx.token, pos);
        if self.final_checkpoint.is_some() {
            self.start_checkpoint(myself);
        }
    }

    /// A tick: the next jobs from the cursor, through the fence, unless one is in flight, a
    /// final checkpoint is asked for, or the term is stopping.
    fn tick(&mut self, myself: &ActorRef<SchedulerMsg>) {
        let Some(from) = self.position else {
            return;
        };
        if self.in_flight || self.final_checkpoint.is_some() || self.stopping {
            return;
        }
        self.in_flight = true;
        let (fence, token, me, limit) = (
            self.ctx.fence.clone(),
            self.ctx.token,
            myself.clone(),
            self.cfg.jobs_per_tick.clamp(0, i32::MAX as i64) as i32,
        );
        tokio::spawn(async move {
            let _ = me.cast(SchedulerMsg::TickDone(
                fence.sched_tick(WORKSET_RESOURCE, token, from, limit).await,
            ));
        });
    }

    /// A tick ended: the cursor moves (and is checkpointed every few ticks, or at once when a
    /// final checkpoint waits); a refusal of the fence ends the term.
    fn tick_done(&mut self, myself: &ActorRef<SchedulerMsg>, res: Result<(i64, i64), FenceError>) {
        self.in_flight = false;
        match res {
            Ok((pos, jobs)) => {
                metrics::counter!(m::SCHED_TICKS).increment(1);
                metrics::counter!(m::SCHED_JOBS).increment(jobs.max(0) as u64);
                self.position = Some(pos);
                self.ticks_since_checkpoint += 1;
                if self.final_checkpoint.is_some()
                    || self.ticks_since_checkpoint >= self.cfg.checkpoint_every_ticks.max(1)
                {
                    self.start_checkpoint(myself);
                }
            }
            Err(e @ FenceError::Rejected { .. }) => {
                self.stopping = true;
                myself.stop(Some(e.to_string()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "scheduler tick failed; retrying next tick");
                if self.final_checkpoint.is_some() {
                    self.start_checkpoint(myself);
                }
            }
        }
    }

    /// A checkpoint of the cursor ended: published, and the final checkpoint (if it was that)
    /// answered.
    fn checkpoint_done(&mut self, myself: &ActorRef<SchedulerMsg>, res: Result<(), FenceError>) {
        self.in_flight = false;
        let outcome = match res {
            Ok(()) => {
                self.ticks_since_checkpoint = 0;
                self.published = self.position.unwrap_or(self.published);
                self.ctx
                    .leadership
                    .set_committed_cursor(self.ctx.token, self.published);
                Ok(self.published)
            }
            Err(e) => {
                if matches!(e, FenceError::Rejected { .. }) {
                    self.stopping = true;
                }
                Err(e.to_string())
            }
        };
        if let Some(reply) = self.final_checkpoint.take() {
            self.stopping = true;
            let _ = reply.send(outcome);
        } else if let Err(e) = outcome {
            tracing::warn!(error = %e, "periodic cursor checkpoint failed");
            if self.stopping {
                myself.stop(Some(e));
            }
        }
    }
    fn start_checkpoint(&mut self, myself: &ActorRef<SchedulerMsg>) {
        let Some(pos) = self.position else { return };
        if self.in_flight {
            return;
        }
        self.in_flight = true;
        let (fence, token, me) = (self.ctx.fence.clone(), self.ctx.token, myself.clone());
        tokio::spawn(async move {
            let _ = me.cast(SchedulerMsg::CheckpointDone(
                fence.cursor_checkpoint(WORKSET_RESOURCE, token, pos).await,
            ));
        });
    }
}

/// The scheduler as registered leader work.
pub struct SchedulerWork {
    pub cfg: SchedulerConfig,
}

struct RunningScheduler {
    actor: ActorRef<SchedulerMsg>,
}

#[async_trait]
impl LeaderWork for SchedulerWork {
    fn name(&self) -> &'static str {
        "scheduler"
    }

    async fn start(&self, ctx: WorkContext) -> Result<Box<dyn RunningWork>, WorkError> {
        let sup = ctx.supervisor.clone();
        let (actor, _) = Actor::spawn_linked(None, Scheduler, (ctx, self.cfg.clone()), sup)
            .await
            .map_err(|e| WorkError::Start {
                work: "scheduler",
                reason: e.to_string(),
            })?;
        Ok(Box::new(RunningScheduler { actor }))
    }
}

#[async_trait]
impl RunningWork for RunningScheduler {
    fn name(&self) -> &'static str {
        "scheduler"
    }
    fn cell(&self) -> ActorCell {
        self.actor.get_cell()
    }
    async fn checkpoint(&self) -> Result<(), WorkError> {
        let err = |reason: String| WorkError::Checkpoint {
            work: "scheduler",
            reason,
        };
        match self
            .actor
            .call(SchedulerMsg::Checkpoint, Some(Duration::from_secs(5)))
            .await
        {
            Ok(ractor::rpc::CallResult::Success(r)) => r.map(drop).map_err(err),
            Ok(ractor::rpc::CallResult::Timeout) => Err(err("no answer in 5 s".into())),
            Ok(ractor::rpc::CallResult::SenderError) | Err(_) => {
                Err(err("scheduler already stopped".into()))
            }
        }
    }
}
