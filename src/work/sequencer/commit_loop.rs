//! The durable sequencer's commit loop: one task per term that owns the term's group-commit
//! connection and everything that paces commits, and loops: take what waits in the intake, send
//! one fenced commit, and when its outcome arrives send the next one and hand the answers out.
//!
//! Why one long-lived task: the serial stage of the sequencer is paid per commit, not per ID
//! (`experiments/FINDINGS.md`), and before this loop each commit cost an actor message (the outcome back to
//! the actor) and a task spawned for its outcome, beside the connection's own I/O. Here a commit
//! costs one wake-up of this task, by the connection that read its answer. The actor keeps the
//! term's lifecycle (the claim, checkpoint, stop) and window mode; this task is the only owner of
//! the next ID, the commits in flight, the pacing and the connection.
//!
//! What it keeps from the actor it replaced: a commit's range is cut and burned before it is
//! sent; up to `commits_in_flight` commits leave in order on one connection, a later one only
//! once it carries at least as many IDs as the last; the linger spaces commits sent one after
//! another; a refusal of the fence stops the term; a checkpoint waits for the commits in flight;
//! commits in flight when the term ends are still answered with their outcome, and everything
//! waiting in the intake is answered "demoting" by its close.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use ractor::{ActorRef, RpcReplyPort};
use tokio::sync::mpsc;

use super::homes::Batch;
use super::intake::Intake;
use super::outcome::{log_unavailable_edge, next_error_of, outcome_of};
use super::{CommitLimits, CommitOutcome, SequencerMsg, SEQUENCE_RESOURCE, SEQ_IDLE_CLOSE};
use crate::metrics as m;
use crate::work::fence::SeqPipe;
use crate::work::{FenceError, WorkContext};

/// What the actor tells its commit loop. The loop learns that the term is over when the actor's
/// sender drops (its state goes with it, however it stopped).
pub(super) enum LoopMsg {
    /// The claim was accepted: the term's first ID is one past this.
    Claimed(i64),
    /// A checkpoint: send nothing more, reply once no commit is in flight.
    Drain(RpcReplyPort<()>),
}

/// A commit's outcome, and the connection it opened if it had to open one.
type Outcome = (Result<(), FenceError>, Option<Arc<SeqPipe>>);
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A group commit sent and not yet answered.
struct InFlight {
    outcome: BoxFuture<Outcome>,
    /// When it was sent (or, without a connection yet, started taking one).
    sent: Instant,
    lo: i64,
    hi: i64,
    batch: Batch,
}

/// A commit answered, whose callers are told after the next commit is sent.
struct Answered {
    batch: Batch,
    lo: i64,
    error: Option<super::NextError>,
}

/// What woke the loop.
enum Event {
    /// The oldest commit in flight was answered.
    Committed(Outcome),
    /// The connection opened beside the claim (`None`: it could not be).
    PipeOpened(Option<Arc<SeqPipe>>),
    /// A message from the actor; `None`: the term is over.
    Control(Option<LoopMsg>),
    /// Requests arrived, or the linger is over: look at the intake.
    Look,
    /// Idle for [`SEQ_IDLE_CLOSE`] without a warm slot: close the connection.
    IdleOver,
}

pub(super) struct CommitLoop {
    ctx: WorkContext,
    limits: CommitLimits,
    intake: Arc<Intake>,
    actor: ActorRef<SequencerMsg>,
    control: mpsc::UnboundedReceiver<LoopMsg>,
    /// The next ID to hand out; `None` until the claim is accepted.
    next_seq: Option<i64>,
    /// Oldest first; at most `limits.in_flight`. Commits on one connection are answered in the
    /// order sent, so only the front one is awaited.
    in_flight: VecDeque<InFlight>,
    /// IDs in the last commit sent: the least a commit sent behind it carries.
    last_batch_ids: usize,
    /// The connection commits are sent on (see [`SeqPipe`]); kept while idle, closed after
    /// [`SEQ_IDLE_CLOSE`] of it without a warm slot.
    pipe: Option<Arc<SeqPipe>>,
    /// The first commit's connection, opening beside the claim (a warm slot's term only).
    opening: Option<BoxFuture<Option<Arc<SeqPipe>>>>,
    /// When the last commit was sent, for `limits.min_interval`.
    last_sent: Option<Instant>,
    /// The next commit waits for this instant (the linger), if set.
    linger_until: Option<Instant>,
    /// This term holds one of the node's warm slots ([`crate::work::Fence::take_warm_slot`]).
    warm: bool,
    /// Without a warm slot: the loop went idle since its connections were last closed, so it
    /// closes them [`SEQ_IDLE_CLOSE`] after the last answer unless busy again by then.
    idle_close_due: bool,
    /// When the last commit was answered.
    last_answered: Instant,
    /// Since when commits have failed for want of the database.
    failing_since: Option<Instant>,
    /// Nothing more is sent: a checkpoint came, the fence refused the term, or it is over.
    closed: bool,
    /// The actor is gone: the loop ends once nothing is in flight.
    term_over: bool,
    /// Checkpoints waiting for the commits in flight.
    drain_waiters: Vec<RpcReplyPort<()>>,
    commit_seconds: metrics::Histogram,
    batch_ids: metrics::Histogram,
}

impl CommitLoop {
    /// The loop of a term that holds a warm slot (`warm`) opens its connection now, beside the
    /// claim rather than after it: on a node that never led, opening it (connect, authenticate,
    /// prepare) took about as long as the claim itself, and a failover waited for both in turn.
    /// Without one the first commit opens it.
    pub(super) fn new(
        ctx: WorkContext,
        limits: CommitLimits,
        intake: Arc<Intake>,
        actor: ActorRef<SequencerMsg>,
        control: mpsc::UnboundedReceiver<LoopMsg>,
        warm: bool,
    ) -> CommitLoop {
        let opening = warm.then(|| {
            let fence = ctx.fence.clone();
            let open = async move { fence.seq_pipe(SEQUENCE_RESOURCE).await.ok().map(Arc::new) };
            Box::pin(open) as BoxFuture<Option<Arc<SeqPipe>>>
        });
        CommitLoop {
            ctx,
            limits,
            intake,
            actor,
            control,
            next_seq: None,
            in_flight: VecDeque::new(),
            last_batch_ids: 0,
            pipe: None,
            opening,
            last_sent: None,
            linger_until: None,
            warm,
            idle_close_due: false,
            last_answered: Instant::now(),
            failing_since: None,
            closed: false,
            term_over: false,
            drain_waiters: Vec::new(),
            commit_seconds: metrics::histogram!(m::SEQ_COMMIT_SECONDS),
            batch_ids: metrics::histogram!(m::SEQ_BATCH_IDS),
        }
    }

    /// Runs the loop as its own task on this runtime (the actor's: see the module docs of
    /// `work::sequencer`). Boxed so its poll is a function of its own in a profile's stacks.
    pub(super) fn spawn(self) {
        let run: BoxFuture<()> = Box::pin(self.run());
        tokio::spawn(run);
    }

    async fn run(mut self) {
        let _panic = StopTermOnPanic(self.actor.clone());
        loop {
            let answered = match self.next_event().await {
                Event::Committed(outcome) => Some(self.committed(outcome)),
                Event::PipeOpened(pipe) => {
                    self.opening = None;
                    self.adopt(pipe);
                    None
                }
                Event::Control(Some(LoopMsg::Claimed(last_seq))) => {
                    self.next_seq = Some(last_seq + 1);
                    None
                }
                Event::Control(Some(LoopMsg::Drain(reply))) => {
                    self.closed = true;
                    self.drain_waiters.push(reply);
                    None
                }
                Event::Control(None) => {
                    self.end_term();
                    None
                }
                Event::Look => None,
                Event::IdleOver => {
                    self.close_idle();
                    None
                }
            };
            // The next commit goes out before this one's callers are answered: PostgreSQL
            // works on it meanwhile instead of waiting for them.
            self.start_commit();
            if let Some(a) = answered {
                a.batch.answer(self.ctx.token, a.lo, a.error);
            }
            if self.in_flight.is_empty() {
                for w in self.drain_waiters.drain(..) {
                    let _ = w.send(());
                }
                if self.term_over {
                    return;
                }
            }
        }
    }

    async fn next_event(&mut self) -> Event {
        let idle_close_at = self.idle_close_at();
        let (linger_until, busy) = (self.linger_until, !self.in_flight.is_empty());
        let (opening, term_over) = (self.opening.is_some(), self.term_over);
        let oldest = &mut self.in_flight;
        let pipe = &mut self.opening;
        // Only the oldest commit is awaited: one connection answers its commits in order.
        let committed = std::future::poll_fn(|cx| match oldest.front_mut() {
            Some(c) => c.outcome.as_mut().poll(cx),
            None => std::task::Poll::Pending,
        });
        let opened = std::future::poll_fn(|cx| match pipe.as_mut() {
            Some(p) => p.as_mut().poll(cx),
            None => std::task::Poll::Pending,
        });
        tokio::select! {
            biased;
            outcome = committed, if busy => Event::Committed(outcome),
            msg = self.control.recv(), if !term_over => Event::Control(msg),
            opened = opened, if opening => Event::PipeOpened(opened),
            () = self.intake.committer_wake.notified() => Event::Look,
            () = sleep_until(linger_until) => Event::Look,
            () = sleep_until(idle_close_at) => Event::IdleOver,
        }
    }

    /// The connection opened beside the claim, kept only by an idle loop: a commit in flight
    /// went out on a connection of its own, and the next must follow it on that one (commits
    /// leave in order). Otherwise it goes back to its pool.
    fn adopt(&mut self, pipe: Option<Arc<SeqPipe>>) {
        let Some(pipe) = pipe else { return };
        if self.pipe.is_none() && self.in_flight.is_empty() && !self.closed {
            self.pipe = Some(pipe);
        } else if self.term_over {
            pipe.retire();
        }
    }

    /// Sends the next group commit if one may go: with none in flight, whatever waits (up to
    /// the batch bound); behind commits in flight (up to `commits_in_flight`, on the same
    /// connection), only a batch at least as large as the last one sent.
    fn start_commit(&mut self) {
        self.linger_until = None;
        let Some(next) = self.next_seq else { return };
        if self.closed || (self.in_flight.is_empty() && self.lingering()) {
            return;
        }
        let batch = match (self.in_flight.len(), &self.pipe) {
            (0, _) => self.intake.take(self.limits.max_batch_ids),
            (n, Some(_)) if n < self.limits.in_flight => self
                .intake
                .take_at_least(self.last_batch_ids, self.limits.max_batch_ids),
            // Full, or the first commit is still taking the connection.
            _ => return,
        };
        if batch.ids == 0 {
            return;
        }
        let (lo, hi) = (next, next + batch.ids as i64 - 1);
        // Burned whatever happens to the commit: an ambiguous failure must never lead to reuse.
        self.next_seq = Some(hi + 1);
        self.last_batch_ids = batch.ids;
        let sent = Instant::now();
        self.last_sent = Some(sent);
        if self.pipe.as_ref().is_some_and(|p| p.is_closed()) && self.in_flight.is_empty() {
            // Died while idle: the commit takes a fresh one, as from the pool.
            self.pipe = None;
        }
        let outcome = self.send(lo, hi);
        self.in_flight.push_back(InFlight {
            outcome,
            sent,
            lo,
            hi,
            batch,
        });
    }

    /// The fenced commit of `[lo, hi]`: on the loop's connection, written before this returns
    /// (so commits leave in the order their ranges were cut), or on one it takes from the pool.
    fn send(&self, lo: i64, hi: i64) -> BoxFuture<Outcome> {
        let token = self.ctx.token;
        match &self.pipe {
            Some(pipe) => {
                let outcome = pipe.send_commit(token, lo, hi);
                Box::pin(async move { (outcome.await, None) })
            }
            None => {
                let fence = self.ctx.fence.clone();
                Box::pin(async move {
                    match fence.seq_pipe(SEQUENCE_RESOURCE).await {
                        Ok(pipe) => {
                            let pipe = Arc::new(pipe);
                            let res = pipe.send_commit(token, lo, hi).await;
                            (res, Some(pipe))
                        }
                        Err(e) => (Err(e), None),
                    }
                })
            }
        }
    }

    /// Whether the next commit must wait for `limits.min_interval` since the last one; if so
    /// the loop looks again then. Meanwhile the intake keeps the committer due, so appends
    /// wake nobody and all gather into that commit: under load, fewer and larger commits,
    /// each costing PostgreSQL about the same whatever it carries (`experiments/FINDINGS.md`), for at most
    /// the interval in latency.
    fn lingering(&mut self) -> bool {
        if self.limits.min_interval.is_zero() {
            return false;
        }
        let Some(until) = self.last_sent.map(|t| t + self.limits.min_interval) else {
            return false;
        };
        // With nothing waiting, `take` finds nothing and leaves the committer not due, so the
        // next append wakes the loop and it comes back here.
        if Instant::now() >= until || !self.intake.has_waiting() {
            return false;
        }
        self.linger_until = Some(until);
        true
    }

    /// The oldest commit's outcome: published, logged at the edges of an outage, and the
    /// connection kept or given up. Its callers are answered by the caller of this.
    fn committed(&mut self, (res, opened): Outcome) -> Answered {
        let done = self
            .in_flight
            .pop_front()
            .expect("an outcome comes from the oldest commit in flight");
        self.commit_seconds
            .record(done.sent.elapsed().as_secs_f64());
        self.batch_ids.record((done.hi - done.lo + 1) as f64);
        if res.is_ok() {
            // Published before any client hears of these IDs: a read that starts after an
            // acknowledgement sees at least that seq (and never an ID still in flight).
            self.ctx
                .leadership
                .set_committed_seq(self.ctx.token, done.hi);
        }
        let outcome = outcome_of(&res);
        log_unavailable_edge(&mut self.failing_since, self.ctx.token, &outcome, false);
        if self.pipe.is_none() {
            self.pipe = opened;
        }
        let unavailable = matches!(outcome, CommitOutcome::Unavailable(_));
        if unavailable || self.pipe.as_ref().is_some_and(|p| p.is_closed()) {
            // The next commit takes a fresh connection.
            self.pipe = None;
        }
        if let CommitOutcome::FencedOut(why) = outcome {
            self.closed = true;
            self.actor.stop(Some(why));
        }
        self.last_answered = Instant::now();
        if self.in_flight.is_empty() && !self.warm {
            // Idle: with a slot that has come free since the term began the connection stays
            // open, else it is closed if the loop is still idle in SEQ_IDLE_CLOSE.
            self.warm = self.ctx.fence.take_warm_slot();
            self.idle_close_due = !self.warm;
        }
        Answered {
            error: next_error_of(&res),
            batch: done.batch,
            lo: done.lo,
        }
    }

    /// Without a warm slot, the connections are closed [`SEQ_IDLE_CLOSE`] after the last
    /// answer if the loop is idle then (so K idle shards do not hold K PostgreSQL connections).
    fn idle_close_at(&self) -> Option<Instant> {
        let idle = self.in_flight.is_empty() && self.idle_close_due && !self.warm;
        idle.then(|| self.last_answered + SEQ_IDLE_CLOSE)
    }

    /// Closes the loop's connection, and the one in the shard's pool if a commit that failed
    /// for want of the database gave one back there.
    fn close_idle(&mut self) {
        self.idle_close_due = false;
        let held = self.pipe.take().inspect(|p| p.retire()).is_some();
        let pooled = self.ctx.fence.close_idle_seq_pipe();
        if held || pooled {
            self.ctx
                .trace
                .step("sequencer", "idle-close", Some(self.ctx.token), "");
        }
    }

    /// The actor is gone: nothing more is sent, the connection closes once the commits in
    /// flight are answered, and the warm slot is free for the next term.
    fn end_term(&mut self) {
        self.closed = true;
        self.term_over = true;
        // The actor's stop closed the intake already, unless it was killed: what waits there
        // is answered "demoting" rather than at its timeout.
        self.intake.close();
        if let Some(pipe) = &self.pipe {
            pipe.retire();
        }
        if let Some(opening) = self.opening.take() {
            // Finished rather than dropped: a connection dropped while being prepared would go
            // back to the pool and stay open there.
            tokio::spawn(async move {
                if let Some(pipe) = opening.await {
                    pipe.retire();
                }
            });
        }
        if self.warm {
            self.warm = false;
            self.ctx.fence.release_warm_slot();
        }
    }
}

/// Ends the term if the loop panics: its callers would otherwise wait for commits no one sends
/// until their timeouts, term after term. (The actor's stop answers what waits "demoting".)
struct StopTermOnPanic(ActorRef<SequencerMsg>);

impl Drop for StopTermOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0
                .stop(Some("the sequencer's commit loop panicked".into()));
        }
    }
}

/// Until `at`, or forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
