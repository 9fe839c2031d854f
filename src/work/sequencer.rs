//! The Sequencer actor: `POST /next` hands out strictly increasing `(token, seq)`.
//!
//! The leader allocates IDs in memory from the `last_seq` it claimed through the fence, and makes
//! every one durable with a fenced group commit before answering: requests that arrive while a
//! commit is in flight form the next batch, one round trip per batch, no artificial delay. An ID
//! whose commit failed ambiguously is burned, never reused.
//!
//! The actor never awaits PostgreSQL in `handle()`: claims and commits run in spawned tasks that
//! report back with a message.
//!
//! Requests do not reach the actor one message each. Callers append to the term's [`Intake`] (a
//! short mutex) and only the first caller after the actor last looked sends it a message; the
//! actor takes the whole intake when it starts a commit. At saturation that is one actor message
//! and one wake-up of the node's runtime per group commit instead of one per ID.
//!
//! The way back is batched too. A caller on another runtime (the HTTP server's thread) names its
//! [`AnswerHome`]; the commit hands each home its answers in one spawned task, which completes the
//! callers' reply channels there. Waking a task from outside its runtime costs an `eventfd`
//! write each time (tokio's remote unpark), so per batch that is one such wake-up per home
//! instead of one per request.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::Serialize;
use tokio::sync::oneshot;

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
    /// Requests are waiting in the intake (sent by the first caller after the actor last took it).
    Arrived,
    /// The claim task finished: the last committed seq, or why not.
    Claimed(Result<i64, FenceError>),
    /// A group commit finished (the task already answered its clients).
    Committed { fenced_out: Option<String> },
    /// Stop taking requests, let the in-flight commit finish, then reply.
    Checkpoint(RpcReplyPort<()>),
}

type Answer = Result<IdBlock, NextError>;
type Reply = oneshot::Sender<Answer>;

struct Pending {
    n: u32,
    reply: Reply,
    arrived: Instant,
    /// Where the answer is delivered; `None`: sent straight from the commit task.
    home: Option<AnswerHome>,
}

/// A runtime that callers of [`SequencerHandle::next`] wait on, named so a group commit can
/// deliver all of that runtime's answers with one task spawned there (see the module docs).
/// Identity is the `Arc`: callers of one runtime share one home.
#[derive(Clone)]
pub(crate) struct AnswerHome(Arc<tokio::runtime::Handle>);

#[cfg_attr(not(feature = "http"), allow(dead_code))]
impl AnswerHome {
    /// The runtime this is called on.
    pub(crate) fn current() -> Self {
        Self(Arc::new(tokio::runtime::Handle::current()))
    }

    fn same(&self, other: &AnswerHome) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Delivers a batch's answers: each caller without a home at once, the rest grouped by home and
/// sent from one task on that home's runtime, where completing a reply channel wakes its caller
/// without a syscall.
fn deliver(answers: Vec<(Reply, Answer, Option<AnswerHome>)>) {
    let mut by_home: Vec<(AnswerHome, Vec<(Reply, Answer)>)> = Vec::new();
    for (reply, answer, home) in answers {
        let Some(home) = home else {
            let _ = reply.send(answer);
            continue;
        };
        match by_home.iter_mut().find(|(h, _)| h.same(&home)) {
            Some((_, group)) => group.push((reply, answer)),
            None => by_home.push((home, vec![(reply, answer)])),
        }
    }
    for (home, group) in by_home {
        // If that runtime has shut down the task is dropped with the senders in it, and each
        // caller sees its channel closed ("not running"): its connection is going away anyway.
        home.0.spawn(async move {
            for (reply, answer) in group {
                let _ = reply.send(answer);
            }
        });
    }
}

/// The requests waiting for this term's next group commit. Callers on any runtime append; the
/// actor alone takes. `actor_due` is the hand-off rule: true while the actor is bound to look
/// again on its own (a message is on its way, a claim or commit is in flight and will end in
/// [`SequencerState::start_commit`]), so appending needs no message; the append that finds it
/// false sets it and sends one.
#[derive(Default)]
pub struct Intake(Mutex<IntakeState>);

#[derive(Default)]
struct IntakeState {
    waiting: Vec<Pending>,
    actor_due: bool,
    /// Set by checkpoint and stop: every later append is answered "demoting" at once.
    closed: bool,
}

#[cfg_attr(not(feature = "http"), allow(dead_code))]
enum Appended {
    /// Queued; the caller must send the actor [`SequencerMsg::Arrived`].
    NotifyActor,
    /// Queued; the actor will look on its own.
    Queued,
    /// Not queued: this term's sequencer is stopping.
    Closed,
}

impl Intake {
    fn lock(&self) -> std::sync::MutexGuard<'_, IntakeState> {
        // A panic while holding this lock leaves a Vec and two flags: still consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    fn append(&self, p: Pending) -> Appended {
        let mut g = self.lock();
        if g.closed {
            return Appended::Closed;
        }
        g.waiting.push(p);
        if g.actor_due {
            Appended::Queued
        } else {
            g.actor_due = true;
            Appended::NotifyActor
        }
    }

    /// The oldest waiting requests, up to `max_ids` IDs (always at least one request). The actor
    /// stays due while any are left: it comes back for them when this commit ends.
    fn take(&self, max_ids: usize) -> (Vec<Pending>, usize) {
        let mut g = self.lock();
        let (mut take, mut ids) = (0, 0usize);
        while take < g.waiting.len() && (take == 0 || ids + g.waiting[take].n as usize <= max_ids) {
            ids += g.waiting[take].n as usize;
            take += 1;
        }
        let batch: Vec<Pending> = g.waiting.drain(..take).collect();
        g.actor_due = !g.waiting.is_empty();
        (batch, ids)
    }

    /// Closes the intake and answers everything still waiting with "demoting".
    fn close(&self) {
        let waiting = {
            let mut g = self.lock();
            g.closed = true;
            std::mem::take(&mut g.waiting)
        };
        for p in waiting {
            let _ = p.reply.send(Err(NextError::Demoting));
        }
    }
}

pub struct SequencerState {
    ctx: WorkContext,
    max_batch_ids: usize,
    /// The next seq to hand out; `None` until the claim succeeds.
    next_seq: Option<i64>,
    intake: Arc<Intake>,
    commit_in_flight: bool,
    draining: Option<Vec<RpcReplyPort<()>>>,
}

pub struct Sequencer;

#[async_trait]
impl Actor for Sequencer {
    type Msg = SequencerMsg;
    type State = SequencerState;
    type Arguments = (WorkContext, usize, Arc<Intake>);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (ctx, max_batch_ids, intake): Self::Arguments,
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
            intake,
            commit_in_flight: false,
            draining: None,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.intake.close();
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
            SequencerMsg::Arrived => state.start_commit(&myself),
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
                state.intake.close();
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
        if self.commit_in_flight || self.draining.is_some() {
            return;
        }
        let (batch, ids) = self.intake.take(self.max_batch_ids);
        if batch.is_empty() {
            return;
        }
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
    // One registry lookup per batch, not per ID.
    let next_seconds = metrics::histogram!(m::NEXT_SECONDS);
    let mut answers = Vec::with_capacity(batch.len());
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
        next_seconds.record(p.arrived.elapsed().as_secs_f64());
        answers.push((p.reply, answer, p.home));
    }
    deliver(answers);
    if let Err(e @ FenceError::Rejected { .. }) = &res {
        fenced_out = Some(e.to_string());
    }
    let _ = me.cast(SequencerMsg::Committed { fenced_out });
}

/// This term's sequencer as callers reach it: its intake, and the actor to wake.
#[derive(Clone)]
struct Running {
    actor: ActorRef<SequencerMsg>,
    intake: Arc<Intake>,
}

/// Where the HTTP layer finds the current term's sequencer (empty while not leading).
#[derive(Clone, Default)]
pub struct SequencerHandle(Arc<RwLock<Option<Running>>>);

// Read by the HTTP layer's POST /next; without the `http` feature nothing calls these.
#[cfg_attr(not(feature = "http"), allow(dead_code))]
impl SequencerHandle {
    fn get(&self) -> Option<Running> {
        self.0.read().ok().and_then(|g| g.clone())
    }
    fn set(&self, r: Option<Running>) {
        if let Ok(mut g) = self.0.write() {
            *g = r;
        }
    }

    /// Asks the running sequencer for `n` IDs. The answer is delivered on `home` (the caller's
    /// own runtime) together with the rest of its batch's answers there, or, without one,
    /// straight from the commit.
    pub async fn next(
        &self,
        n: u32,
        timeout: Duration,
        home: Option<AnswerHome>,
    ) -> Result<IdBlock, NextCallError> {
        let running = self.get().ok_or(NextCallError::NotRunning)?;
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            n,
            reply,
            arrived: Instant::now(),
            home,
        };
        match running.intake.append(pending) {
            Appended::Closed => return Err(NextCallError::Next(NextError::Demoting)),
            Appended::Queued => {}
            Appended::NotifyActor => {
                if running.actor.cast(SequencerMsg::Arrived).is_err() {
                    // The actor is gone (its post_stop closes the intake too): nobody will take
                    // what waits, so answer it all now rather than at the timeout.
                    running.intake.close();
                }
            }
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(r)) => r.map_err(NextCallError::Next),
            Ok(Err(_)) => Err(NextCallError::NotRunning),
            Err(_) => Err(NextCallError::Timeout),
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
        let intake = Arc::new(Intake::default());
        let args = (ctx, self.max_batch_ids, intake.clone());
        let (actor, _) = Actor::spawn_linked(None, Sequencer, args, sup)
            .await
            .map_err(|e| WorkError::Start {
                work: "sequencer",
                reason: e.to_string(),
            })?;
        self.handle.set(Some(Running {
            actor: actor.clone(),
            intake,
        }));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(n: u32) -> (Pending, oneshot::Receiver<Result<IdBlock, NextError>>) {
        let (reply, rx) = oneshot::channel();
        let p = Pending {
            n,
            reply,
            arrived: Instant::now(),
            home: None,
        };
        (p, rx)
    }

    fn id(seq: i64) -> Answer {
        Ok(IdBlock {
            token: FenceToken(1),
            first: seq,
            last: seq,
        })
    }

    #[test]
    fn answers_with_a_home_are_delivered_there_the_rest_at_once() {
        // A runtime nobody drives yet: what is delivered through it stays undelivered until it runs.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let home = AnswerHome(Arc::new(rt.handle().clone()));
        let (a, mut ra) = pending(1);
        let (b, mut rb) = pending(1);
        let (c, mut rc) = pending(1);
        deliver(vec![
            (a.reply, id(1), Some(home.clone())),
            (b.reply, id(2), None),
            (c.reply, id(3), Some(home.clone())),
        ]);
        assert!(matches!(rb.try_recv(), Ok(Ok(IdBlock { first: 2, .. }))));
        assert!(ra.try_recv().is_err(), "delivered before its home ran");
        assert!(rc.try_recv().is_err(), "delivered before its home ran");
        rt.block_on(async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        });
        assert!(matches!(ra.try_recv(), Ok(Ok(IdBlock { first: 1, .. }))));
        assert!(matches!(rc.try_recv(), Ok(Ok(IdBlock { first: 3, .. }))));
        // A home whose runtime is gone drops its answers: the callers see the channel closed.
        let (d, mut rd) = pending(1);
        drop(rt);
        deliver(vec![(d.reply, id(4), Some(home))]);
        assert!(matches!(
            rd.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
    }

    #[test]
    fn only_the_first_append_after_a_take_wakes_the_actor() {
        let intake = Intake::default();
        let (a, _ra) = pending(1);
        let (b, _rb) = pending(1);
        assert!(matches!(intake.append(a), Appended::NotifyActor));
        assert!(matches!(intake.append(b), Appended::Queued));
        let (batch, ids) = intake.take(100);
        assert_eq!((batch.len(), ids), (2, 2));
        // Taken whole: the actor will not look again by itself, so the next append must wake it.
        let (c, _rc) = pending(1);
        assert!(matches!(intake.append(c), Appended::NotifyActor));
    }

    #[test]
    fn a_take_bounded_by_the_batch_leaves_the_actor_due_for_the_rest() {
        let intake = Intake::default();
        let mut rxs = Vec::new();
        for n in [3, 3, 3] {
            let (p, rx) = pending(n);
            rxs.push(rx);
            let _ = intake.append(p);
        }
        let (batch, ids) = intake.take(6);
        assert_eq!((batch.len(), ids), (2, 6));
        // One request is left: the actor comes back for it when this commit ends, so appends
        // meanwhile send no message.
        let (d, _rd) = pending(1);
        assert!(matches!(intake.append(d), Appended::Queued));
        let (batch, ids) = intake.take(6);
        assert_eq!((batch.len(), ids), (2, 4));
        // A single request above the bound still goes alone rather than waiting forever.
        let (big, _rbig) = pending(50);
        let _ = intake.append(big);
        assert_eq!(intake.take(6).1, 50);
    }

    #[test]
    fn closing_answers_the_waiting_and_refuses_later_appends() {
        let intake = Intake::default();
        let (a, mut ra) = pending(1);
        let _ = intake.append(a);
        intake.close();
        assert!(matches!(ra.try_recv(), Ok(Err(NextError::Demoting))));
        let (b, _rb) = pending(1);
        assert!(matches!(intake.append(b), Appended::Closed));
        assert!(intake.take(10).0.is_empty());
    }
}
