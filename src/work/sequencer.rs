//! The Sequencer actor: `POST /next` hands out strictly increasing `(token, seq)`.
//!
//! The leader allocates IDs in memory from the `last_seq` it claimed through the fence, and makes
//! every one durable with a fenced group commit before answering: requests that arrive while a
//! commit is in flight form the next batch, one round trip per batch, no artificial delay. An ID
//! whose commit failed ambiguously is burned, never reused.
//!
//! The actor never awaits PostgreSQL in `handle()`: claims and commits run in spawned tasks that
//! report back with a message.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::Serialize;

use crate::backends::FenceToken;
use crate::leadership::Leadership;
use crate::metrics as m;
use crate::work::{Fence, FenceError, LeaderWork, RunningWork, WorkContext, WorkError};

/// The resource name the sequencer writes under.
pub const SEQUENCE_RESOURCE: &str = "sequence";

/// A block of IDs `[first, last]` issued under `token`.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct IdBlock {
    pub token: FenceToken,
    pub first: i64,
    pub last: i64,
}

#[derive(Debug, thiserror::Error, Clone)]
pub enum NextError {
    #[error("leadership is ending; retry on the new leader")]
    Demoting,
    #[error("the fenced resource refused this leader: {0}")]
    Fenced(String),
    #[error("the fenced resource is unavailable: {0}")]
    Unavailable(String),
}

#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub enum SequencerMsg {
    /// A client wants `n` IDs.
    Next {
        n: u32,
        reply: RpcReplyPort<Result<IdBlock, NextError>>,
    },
    /// The claim task finished: the last committed seq, or why not.
    Claimed(Result<i64, FenceError>),
    /// A group commit finished (the task already answered its clients).
    Committed { fenced_out: Option<String> },
    /// Stop taking requests, let the in-flight commit finish, then reply.
    Checkpoint(RpcReplyPort<()>),
}

struct Pending {
    n: u32,
    reply: RpcReplyPort<Result<IdBlock, NextError>>,
    arrived: Instant,
}

pub struct SequencerState {
    ctx: WorkContext,
    max_batch_ids: usize,
    /// The next seq to hand out; `None` until the claim succeeds.
    next_seq: Option<i64>,
    queue: Vec<Pending>,
    commit_in_flight: bool,
    draining: Option<Vec<RpcReplyPort<()>>>,
}

pub struct Sequencer;

#[async_trait]
impl Actor for Sequencer {
    type Msg = SequencerMsg;
    type State = SequencerState;
    type Arguments = (WorkContext, usize);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (ctx, max_batch_ids): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let (fence, token) = (ctx.fence.clone(), ctx.token);
        tokio::spawn(async move {
            let res = fence.seq_claim(SEQUENCE_RESOURCE, token).await;
            let _ = myself.cast(SequencerMsg::Claimed(res));
        });
        ctx.trace.step("sequencer", "started", Some(ctx.token), "");
        Ok(SequencerState {
            ctx,
            max_batch_ids,
            next_seq: None,
            queue: Vec::new(),
            commit_in_flight: false,
            draining: None,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for p in state.queue.drain(..) {
            let _ = p.reply.send(Err(NextError::Demoting));
        }
        state
            .ctx
            .trace
            .step("sequencer", "stopped", Some(state.ctx.token), "");
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SequencerMsg::Next { n, reply } => {
                if state.draining.is_some() {
                    let _ = reply.send(Err(NextError::Demoting));
                    return Ok(());
                }
                state.queue.push(Pending {
                    n,
                    reply,
                    arrived: Instant::now(),
                });
                state.start_commit(&myself);
            }
            SequencerMsg::Claimed(Ok(last_seq)) => {
                state.ctx.trace.step(
                    "sequencer",
                    "claimed",
                    Some(state.ctx.token),
                    &format!("last_seq={last_seq}"),
                );
                state.next_seq = Some(last_seq + 1);
                // Everything up to last_seq is committed (the claim itself went through the fence).
                state
                    .ctx
                    .leadership
                    .set_committed_seq(state.ctx.token, last_seq);
                state.start_commit(&myself);
            }
            SequencerMsg::Claimed(Err(e)) => {
                // Without a claim this term can never issue an ID: end it, the supervisor demotes.
                state.ctx.trace.step(
                    "sequencer",
                    "claim-failed",
                    Some(state.ctx.token),
                    &e.to_string(),
                );
                myself.stop(Some(format!("sequence claim failed: {e}")));
            }
            SequencerMsg::Committed { fenced_out } => {
                state.commit_in_flight = false;
                if let Some(why) = fenced_out {
                    myself.stop(Some(why));
                    return Ok(());
                }
                if let Some(waiters) = state.draining.take() {
                    for w in waiters {
                        let _ = w.send(());
                    }
                    state.draining = Some(Vec::new());
                    return Ok(());
                }
                state.start_commit(&myself);
            }
            SequencerMsg::Checkpoint(reply) => {
                // Every issued ID is already durable; quiescing is all a checkpoint needs here.
                for p in state.queue.drain(..) {
                    let _ = p.reply.send(Err(NextError::Demoting));
                }
                if state.commit_in_flight {
                    state.draining.get_or_insert_with(Vec::new).push(reply);
                } else {
                    state.draining.get_or_insert_with(Vec::new);
                    let _ = reply.send(());
                }
            }
        }
        Ok(())
    }
}

impl SequencerState {
    /// Takes the waiting requests (up to the batch bound) and commits them in one fenced call.
    fn start_commit(&mut self, myself: &ActorRef<SequencerMsg>) {
        let Some(next) = self.next_seq else { return };
        if self.commit_in_flight || self.queue.is_empty() || self.draining.is_some() {
            return;
        }
        let mut take = 0;
        let mut ids = 0usize;
        while take < self.queue.len()
            && (take == 0 || ids + self.queue[take].n as usize <= self.max_batch_ids)
        {
            ids += self.queue[take].n as usize;
            take += 1;
        }
        let batch: Vec<Pending> = self.queue.drain(..take).collect();
        let (lo, hi) = (next, next + ids as i64 - 1);
        // Burned whatever happens to the commit: an ambiguous failure must never lead to reuse.
        self.next_seq = Some(hi + 1);
        self.commit_in_flight = true;
        let (fence, token, me) = (self.ctx.fence.clone(), self.ctx.token, myself.clone());
        let leadership = self.ctx.leadership.clone();
        tokio::spawn(commit_batch(fence, leadership, token, lo, hi, batch, me));
    }
}

async fn commit_batch(
    fence: Fence,
    leadership: Arc<Leadership>,
    token: FenceToken,
    lo: i64,
    hi: i64,
    batch: Vec<Pending>,
    me: ActorRef<SequencerMsg>,
) {
    let started = Instant::now();
    let res = fence.seq_commit(SEQUENCE_RESOURCE, token, lo, hi).await;
    metrics::histogram!(m::SEQ_COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
    metrics::histogram!(m::SEQ_BATCH_IDS).record((hi - lo + 1) as f64);
    if res.is_ok() {
        // Published before any client hears of these IDs: a read that starts after an
        // acknowledgement sees at least that seq (and never an ID still in flight).
        leadership.set_committed_seq(token, hi);
    }
    let mut fenced_out = None;
    let mut seq = lo;
    for p in batch {
        let answer = match &res {
            Ok(()) => Ok(IdBlock {
                token,
                first: seq,
                last: seq + p.n as i64 - 1,
            }),
            Err(e @ FenceError::Rejected { .. }) => Err(NextError::Fenced(e.to_string())),
            Err(e) => Err(NextError::Unavailable(e.to_string())),
        };
        seq += p.n as i64;
        metrics::histogram!(m::NEXT_SECONDS).record(p.arrived.elapsed().as_secs_f64());
        let _ = p.reply.send(answer);
    }
    if let Err(e @ FenceError::Rejected { .. }) = &res {
        fenced_out = Some(e.to_string());
    }
    let _ = me.cast(SequencerMsg::Committed { fenced_out });
}

/// Where the HTTP layer finds the current term's sequencer (empty while not leading).
#[derive(Clone, Default)]
pub struct SequencerHandle(Arc<RwLock<Option<ActorRef<SequencerMsg>>>>);

// Read by the HTTP layer's POST /next; without the `http` feature nothing calls these.
#[cfg_attr(not(feature = "http"), allow(dead_code))]
impl SequencerHandle {
    pub fn get(&self) -> Option<ActorRef<SequencerMsg>> {
        self.0.read().ok().and_then(|g| g.clone())
    }
    fn set(&self, r: Option<ActorRef<SequencerMsg>>) {
        if let Ok(mut g) = self.0.write() {
            *g = r;
        }
    }

    /// Asks the running sequencer for `n` IDs.
    pub async fn next(&self, n: u32, timeout: Duration) -> Result<IdBlock, NextCallError> {
        let actor = self.get().ok_or(NextCallError::NotRunning)?;
        match actor
            .call(|reply| SequencerMsg::Next { n, reply }, Some(timeout))
            .await
        {
            Ok(ractor::rpc::CallResult::Success(r)) => r.map_err(NextCallError::Next),
            Ok(ractor::rpc::CallResult::Timeout) => Err(NextCallError::Timeout),
            Ok(ractor::rpc::CallResult::SenderError) | Err(_) => Err(NextCallError::NotRunning),
        }
    }
}

#[cfg_attr(not(feature = "http"), allow(dead_code))]
#[derive(Debug, thiserror::Error)]
pub enum NextCallError {
    #[error("no sequencer is running on this node")]
    NotRunning,
    #[error("the sequencer did not answer in time; the IDs, if committed, are burned")]
    Timeout,
    #[error(transparent)]
    Next(NextError),
}

/// The sequencer as registered leader work.
pub struct SequencerWork {
    pub handle: SequencerHandle,
    pub max_batch_ids: usize,
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
        let sup = ctx.supervisor.clone();
        let (actor, _) = Actor::spawn_linked(None, Sequencer, (ctx, self.max_batch_ids), sup)
            .await
            .map_err(|e| WorkError::Start {
                work: "sequencer",
                reason: e.to_string(),
            })?;
        self.handle.set(Some(actor.clone()));
        Ok(Box::new(RunningSequencer {
            actor,
            handle: self.handle.clone(),
        }))
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
