//! The Sequencer actor: `POST /next` hands out strictly increasing `(token, seq)`.
//!
//! The leader allocates IDs in memory from the `last_seq` it claimed through the fence, and makes
//! every one durable with a fenced group commit before answering: requests that arrive while a
//! commit is in flight form the next batch, one round trip per batch. An ID whose commit failed
//! ambiguously is burned, never reused. `[sequencer] min_commit_interval_ms` (default 0: no
//! artificial delay) spaces commits sent one after another: under load fewer, larger commits
//! for at most that much more latency.
//!
//! Up to `[sequencer] commits_in_flight` commits (default 1) are outstanding at once, all sent
//! on one connection (a [`SeqPipe`]), so PostgreSQL runs them in the order their ranges were cut
//! and a later range never reaches the fence row first. The next batch can then wait in the
//! database's socket while the one before it is flushed, instead of a round trip to the node
//! later. A batch goes behind one in flight only once it carries at least as many IDs, so the
//! load is not cut into more, smaller commits than one-at-a-time would send.
//!
//! The actor never awaits PostgreSQL in `handle()`: claims and commits run in spawned tasks that
//! report back with a message.
//!
//! Requests do not reach the actor one message each. Callers append to the term's [`Intake`] (a
//! short mutex) and only the first caller after the actor last looked sends it a message; the
//! actor takes the whole intake when it starts a commit. At saturation that is one actor message
//! per group commit instead of one per ID (and, from an HTTP thread other than the actor's, one
//! cross-thread wake-up).
//!
//! The way back is batched too. A caller on another runtime (the HTTP server's thread) names its
//! [`AnswerHome`]; the commit hands each home its answers in one spawned task, which completes the
//! callers' reply channels there. Waking a task from outside its runtime costs an `eventfd`
//! write each time (tokio's remote unpark), so per batch that is one such wake-up per home
//! instead of one per request.
//!
//! Where it all runs: on the HTTP server's first client thread when there is one (it offers its
//! runtime, [`SequencerHandle::offer_commit_runtime`]), else on the node's runtime. The actor, its
//! commit tasks and its database connection's I/O then share the thread that parses the requests
//! and writes the answers, so a request crosses no thread inside the node: a group commit's
//! round trip wakes only PostgreSQL's backend and, when the answer comes, this one thread. On the
//! node's runtime the same path woke a runtime worker from the HTTP thread, the connection's task
//! and the commit task on whichever workers were free, and the HTTP thread again: each wake-up a
//! chance to queue behind a neighbour for a scheduler slice (FINDINGS §11.8). Nothing
//! timer-critical moves: heartbeats, renewals and the watchdog stay on the node's runtime, and a
//! stopped term is still refused by the fence whatever thread its last commit left from.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::Serialize;
use tokio::sync::oneshot;

use crate::backends::FenceToken;
use crate::leadership::Leadership;
use crate::metrics as m;
use crate::work::fence::SeqPipe;
use crate::work::{FenceError, LeaderWork, RunningWork, WorkContext, WorkError};

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
    /// A group commit finished (the task already answered its clients). `pipe`: the
    /// connection it took from the pool, for the commits after it.
    Committed {
        outcome: CommitOutcome,
        pipe: Option<Arc<SeqPipe>>,
    },
    /// Stop taking requests, let the in-flight commit finish, then reply.
    Checkpoint(RpcReplyPort<()>),
    /// `[sequencer] min_commit_interval_ms` has passed since the last commit was sent.
    LingerOver,
}

/// How a group commit ended, as the actor needs to know it (its callers are already answered).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    Durable,
    /// The fence refused this term (why): it ends.
    FencedOut(String),
    /// It failed for want of the database (why): the next commit takes a fresh connection.
    Unavailable(String),
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
pub(crate) struct AnswerHome(Arc<Home>);

struct Home {
    rt: tokio::runtime::Handle,
    /// The thread that drives `rt`, if it is a single-threaded runtime: a commit answered on
    /// that very thread completes the reply channels itself instead of spawning a task.
    thread: Option<std::thread::ThreadId>,
}

#[cfg_attr(not(feature = "http"), allow(dead_code))]
impl AnswerHome {
    /// The runtime this is called on.
    pub(crate) fn current() -> Self {
        let rt = tokio::runtime::Handle::current();
        let thread = matches!(
            rt.runtime_flavor(),
            tokio::runtime::RuntimeFlavor::CurrentThread
        )
        .then(|| std::thread::current().id());
        Self(Arc::new(Home { rt, thread }))
    }

    fn same(&self, other: &AnswerHome) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Whether this is running on the home's own thread (so inside its runtime).
    fn is_here(&self) -> bool {
        self.0.thread == Some(std::thread::current().id())
    }
}

/// Completes each reply channel with its answer (a caller that gave up is skipped).
fn send_all(group: Vec<(Reply, Answer)>) {
    for (reply, answer) in group {
        let _ = reply.send(answer);
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
        if home.is_here() {
            // Waking a task of this same runtime only queues it: no task, no syscall.
            send_all(group);
            continue;
        }
        // If that runtime has shut down the task is dropped with the senders in it, and each
        // caller sees its channel closed ("not running"): its connection is going away anyway.
        home.0.rt.spawn(async move { send_all(group) });
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
    /// The IDs `waiting` asks for.
    waiting_ids: usize,
    actor_due: bool,
    /// While the actor is due, an append that brings `waiting_ids` to this many wakes it anyway:
    /// enough has gathered for a commit to go behind the one in flight (see
    /// [`Intake::take_at_least`]).
    wake_at_ids: Option<usize>,
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
        g.waiting_ids += p.n as usize;
        g.waiting.push(p);
        if !g.actor_due {
            g.actor_due = true;
            Appended::NotifyActor
        } else if g.wake_at_ids.is_some_and(|at| g.waiting_ids >= at) {
            g.wake_at_ids = None;
            Appended::NotifyActor
        } else {
            Appended::Queued
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
        g.waiting_ids -= ids;
        g.actor_due = !g.waiting.is_empty();
        g.wake_at_ids = None;
        (batch, ids)
    }

    /// For a commit behind one in flight: [`Intake::take`] once at least `min_ids` IDs wait,
    /// else nothing, and the append that gets there wakes the actor. (The commit in flight
    /// brings the actor back in any case, so it stays due.) Sending a small batch behind a
    /// large one would only split the load into more commits, each costing the database the
    /// same whatever its size.
    fn take_at_least(&self, min_ids: usize, max_ids: usize) -> (Vec<Pending>, usize) {
        {
            let mut g = self.lock();
            if g.waiting.is_empty() || g.waiting_ids < min_ids {
                g.actor_due = true;
                g.wake_at_ids = Some(min_ids.max(1));
                return (Vec::new(), 0);
            }
        }
        // Appends between the two locks only add to what is taken.
        self.take(max_ids)
    }

    fn has_waiting(&self) -> bool {
        !self.lock().waiting.is_empty()
    }

    /// Closes the intake and answers everything still waiting with "demoting".
    fn close(&self) {
        let waiting = {
            let mut g = self.lock();
            g.closed = true;
            g.waiting_ids = 0;
            std::mem::take(&mut g.waiting)
        };
        for p in waiting {
            let _ = p.reply.send(Err(NextError::Demoting));
        }
    }
}

pub struct SequencerState {
    ctx: WorkContext,
    limits: CommitLimits,
    /// The next seq to hand out; `None` until the claim succeeds.
    next_seq: Option<i64>,
    intake: Arc<Intake>,
    /// Group commits sent and not yet answered (at most `limits.in_flight`).
    in_flight: usize,
    /// IDs in the last commit sent: the least a commit sent behind it carries.
    last_batch_ids: usize,
    /// The connection commits are sent on while any are in flight (see [`SeqPipe`]); given
    /// back to the pool when none are.
    pipe: Option<Arc<SeqPipe>>,
    /// When the last group commit was sent: the next one with none in flight goes no sooner
    /// than `limits.min_interval` after it.
    last_sent: Option<Instant>,
    /// A wake-up for the end of that interval is on its way (at most one at a time).
    linger_armed: bool,
    /// Since when commits have failed for want of the database (logged once at the first
    /// failure and once when one succeeds again, not once per commit).
    failing_since: Option<Instant>,
    draining: Option<Vec<RpcReplyPort<()>>>,
}

/// How the sequencer batches: `[sequencer] max_batch_ids`, `commits_in_flight` and
/// `min_commit_interval_ms`.
#[derive(Clone, Copy, Debug)]
pub struct CommitLimits {
    pub max_batch_ids: usize,
    pub in_flight: usize,
    /// The least time between the starts of two group commits sent one after the other (zero:
    /// the next goes as soon as the last is answered).
    pub min_interval: Duration,
}

pub struct Sequencer;

#[async_trait]
impl Actor for Sequencer {
    type Msg = SequencerMsg;
    type State = SequencerState;
    type Arguments = (WorkContext, CommitLimits, Arc<Intake>);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (ctx, limits, intake): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let (fence, token) = (ctx.fence.clone(), ctx.token);
        tokio::spawn(async move {
            let res = fence.seq_claim(SEQUENCE_RESOURCE, token).await;
            let _ = myself.cast(SequencerMsg::Claimed(res));
        });
        ctx.trace.step("sequencer", "started", Some(ctx.token), "");
        Ok(SequencerState {
            ctx,
            limits,
            next_seq: None,
            intake,
            in_flight: 0,
            last_batch_ids: 0,
            pipe: None,
            last_sent: None,
            linger_armed: false,
            failing_since: None,
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
            SequencerMsg::LingerOver => {
                state.linger_armed = false;
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
                tracing::warn!(token = state.ctx.token.0, error = %e, "sequencer: claiming the sequence failed; ending the term");
                state.ctx.trace.step(
                    "sequencer",
                    "claim-failed",
                    Some(state.ctx.token),
                    &e.to_string(),
                );
                myself.stop(Some(format!("sequence claim failed: {e}")));
            }
            SequencerMsg::Committed { outcome, pipe } => {
                state.in_flight -= 1;
                state.note_outcome(&outcome);
                if state.pipe.is_none() {
                    state.pipe = pipe;
                }
                let unavailable = matches!(outcome, CommitOutcome::Unavailable(_));
                if unavailable || state.pipe.as_ref().is_some_and(|p| p.is_closed()) {
                    state.pipe = None;
                }
                if let CommitOutcome::FencedOut(why) = outcome {
                    myself.stop(Some(why));
                    return Ok(());
                }
                if let Some(waiters) = state.draining.as_mut() {
                    if state.in_flight == 0 {
                        for w in waiters.drain(..) {
                            let _ = w.send(());
                        }
                    }
                    return Ok(());
                }
                state.start_commit(&myself);
                if state.in_flight == 0 {
                    // Idle: the connection goes back to its pool, which checks it is still open
                    // before the next commit takes it.
                    state.pipe = None;
                }
            }
            SequencerMsg::Checkpoint(reply) => {
                // Every issued ID is already durable; quiescing is all a checkpoint needs here.
                state.intake.close();
                let waiters = state.draining.get_or_insert_with(Vec::new);
                if state.in_flight > 0 {
                    waiters.push(reply);
                } else {
                    let _ = reply.send(());
                }
            }
        }
        Ok(())
    }
}

impl SequencerState {
    /// Logs the edges of a run of commits that failed for want of the database (see
    /// [`unavailable_edge`]).
    fn note_outcome(&mut self, outcome: &CommitOutcome) {
        let token = self.ctx.token.0;
        match unavailable_edge(&mut self.failing_since, outcome) {
            Some(UnavailableEdge::Began(why)) => tracing::warn!(
                token,
                error = why,
                "sequencer: a group commit failed for want of the database; its callers were answered unavailable, the next commit takes a new connection"
            ),
            // At warn too: whoever reads the warnings sees where the outage ended.
            Some(UnavailableEdge::Ended { failing_ms }) => tracing::warn!(
                token,
                failing_ms,
                "sequencer: group commits go through again"
            ),
            None => {}
        }
    }

    /// Sends the next group commit if one may go: with none in flight, whatever waits (up to
    /// the batch bound); behind commits in flight (up to `commits_in_flight`, on the same
    /// connection), only a batch at least as large as the last one sent.
    fn start_commit(&mut self, myself: &ActorRef<SequencerMsg>) {
        let Some(next) = self.next_seq else { return };
        if self.draining.is_some() {
            return;
        }
        if self.in_flight == 0 && self.lingering(myself) {
            return;
        }
        let (batch, ids) = match (self.in_flight, &self.pipe) {
            (0, _) => self.intake.take(self.limits.max_batch_ids),
            (n, Some(_)) if n < self.limits.in_flight => self
                .intake
                .take_at_least(self.last_batch_ids, self.limits.max_batch_ids),
            // Full, or the first commit is still taking the connection.
            _ => return,
        };
        if batch.is_empty() {
            return;
        }
        let (lo, hi) = (next, next + ids as i64 - 1);
        // Burned whatever happens to the commit: an ambiguous failure must never lead to reuse.
        self.next_seq = Some(hi + 1);
        self.in_flight += 1;
        self.last_batch_ids = ids;
        let sent = Instant::now();
        self.last_sent = Some(sent);
        let token = self.ctx.token;
        let answer = Answering {
            sent,
            leadership: self.ctx.leadership.clone(),
            token,
            lo,
            hi,
            batch,
            me: myself.clone(),
        };
        match &self.pipe {
            // Sent here, in the actor, so commits leave in the order their ranges were cut.
            Some(pipe) => {
                let outcome = pipe.send_commit(SEQUENCE_RESOURCE, token, lo, hi);
                tokio::spawn(answer.after(outcome, None));
            }
            None => {
                let fence = self.ctx.fence.clone();
                tokio::spawn(async move {
                    match fence.seq_pipe().await {
                        Ok(pipe) => {
                            let pipe = Arc::new(pipe);
                            let outcome = pipe.send_commit(SEQUENCE_RESOURCE, token, lo, hi);
                            answer.after(outcome, Some(pipe)).await
                        }
                        Err(e) => answer.after(async { Err(e) }, None).await,
                    }
                });
            }
        }
    }

    /// Whether the next commit must wait for `limits.min_interval` since the last one to pass;
    /// if so, a [`SequencerMsg::LingerOver`] is (or already was) set to bring the actor back
    /// then. Meanwhile the intake keeps the actor due, so appends send no messages and all
    /// gather into that commit: under load, fewer and larger commits, each costing PostgreSQL
    /// about the same whatever it carries (FINDINGS §11.6), for at most the interval in latency.
    fn lingering(&mut self, myself: &ActorRef<SequencerMsg>) -> bool {
        if self.limits.min_interval.is_zero() {
            return false;
        }
        let Some(until) = self.last_sent.map(|t| t + self.limits.min_interval) else {
            return false;
        };
        // With nothing waiting, `take` finds nothing and leaves the actor not due, so the next
        // append sends `Arrived` and comes back here.
        if Instant::now() >= until || !self.intake.has_waiting() {
            return false;
        }
        if !self.linger_armed {
            self.linger_armed = true;
            let me = myself.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(until.into()).await;
                let _ = me.cast(SequencerMsg::LingerOver);
            });
        }
        true
    }
}

/// A change in whether group commits reach the database.
#[derive(Debug, PartialEq, Eq)]
enum UnavailableEdge<'a> {
    /// The first commit of a run failed for want of the database (why).
    Began(&'a str),
    /// A commit went through after such a run, which lasted this long.
    Ended { failing_ms: u64 },
}

/// Tracks a run of commits that failed for want of the database in `failing_since`, and says
/// when one begins or ends: that is what gets logged, one line each. A line per commit would be
/// up to a thousand a second against a database that is down; no line at all left a term that
/// served nothing but 503s with nothing in its log to say why.
fn unavailable_edge<'a>(
    failing_since: &mut Option<Instant>,
    outcome: &'a CommitOutcome,
) -> Option<UnavailableEdge<'a>> {
    match (outcome, *failing_since) {
        (CommitOutcome::Unavailable(why), None) => {
            *failing_since = Some(Instant::now());
            Some(UnavailableEdge::Began(why))
        }
        (CommitOutcome::Durable, Some(since)) => {
            *failing_since = None;
            Some(UnavailableEdge::Ended {
                failing_ms: since.elapsed().as_millis() as u64,
            })
        }
        _ => None,
    }
}

/// One sent group commit's batch, answered when its outcome arrives.
struct Answering {
    /// When the actor sent the commit (or, without a connection yet, started taking one).
    sent: Instant,
    leadership: Arc<Leadership>,
    token: FenceToken,
    lo: i64,
    hi: i64,
    batch: Vec<Pending>,
    me: ActorRef<SequencerMsg>,
}

impl Answering {
    /// Waits for the commit's outcome, answers every caller in the batch, and tells the actor
    /// (handing it `pipe`, the connection this commit took, if it took one).
    async fn after(
        self,
        outcome: impl std::future::Future<Output = Result<(), FenceError>>,
        pipe: Option<Arc<SeqPipe>>,
    ) {
        let Answering {
            sent,
            leadership,
            token,
            lo,
            hi,
            batch,
            me,
        } = self;
        let res = outcome.await;
        metrics::histogram!(m::SEQ_COMMIT_SECONDS).record(sent.elapsed().as_secs_f64());
        metrics::histogram!(m::SEQ_BATCH_IDS).record((hi - lo + 1) as f64);
        if res.is_ok() {
            // Published before any client hears of these IDs: a read that starts after an
            // acknowledgement sees at least that seq (and never an ID still in flight).
            leadership.set_committed_seq(token, hi);
        }
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
        let outcome = match &res {
            Ok(()) => CommitOutcome::Durable,
            Err(e @ FenceError::Rejected { .. }) => CommitOutcome::FencedOut(e.to_string()),
            Err(e) => CommitOutcome::Unavailable(e.to_string()),
        };
        let _ = me.cast(SequencerMsg::Committed { outcome, pipe });
        // The actor first: it sends the next group commit (and the connection's task writes it)
        // before this thread spends the next millisecond writing this batch's answers, so
        // PostgreSQL works on the next batch meanwhile instead of waiting for them. Yielding
        // puts this task behind both (tokio runs a yielded task after those already woken).
        tokio::task::yield_now().await;
        deliver(answers);
    }
}

/// This term's sequencer as callers reach it: its intake, and the actor to wake.
#[derive(Clone)]
struct Running {
    actor: ActorRef<SequencerMsg>,
    intake: Arc<Intake>,
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

/// The sequencer as registered leader work: one factory for every shard, each shard's term
/// serving through that shard's handle (`handles[shard]`).
pub struct SequencerWork {
    pub handles: Vec<SequencerHandle>,
    pub limits: CommitLimits,
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
        let args = (ctx, self.limits, intake.clone());
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
        handle.set(Some(Running {
            actor: actor.clone(),
            intake,
        }));
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
        let home = AnswerHome(Arc::new(Home {
            rt: rt.handle().clone(),
            thread: None,
        }));
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
    fn answers_for_the_home_on_this_thread_are_sent_at_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let home = AnswerHome::current();
            assert!(home.is_here());
            let (a, mut ra) = pending(1);
            deliver(vec![(a.reply, id(1), Some(home.clone()))]);
            // No task spawned, nothing yielded: the channel is already complete.
            assert!(matches!(ra.try_recv(), Ok(Ok(IdBlock { first: 1, .. }))));
            // The same home seen from another thread is not "here": that thread spawns.
            let other = std::thread::spawn(move || home.is_here()).join().unwrap();
            assert!(!other);
        });
        // A multi-threaded runtime has no one thread to be on.
        let mt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        assert!(!mt.block_on(async { AnswerHome::current().is_here() }));
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
    fn a_commit_goes_behind_one_in_flight_only_once_a_full_batch_waits() {
        let intake = Intake::default();
        let mut rxs = Vec::new();
        let mut append = |n| {
            let (p, rx) = pending(n);
            rxs.push(rx);
            intake.append(p)
        };
        assert!(matches!(append(5), Appended::NotifyActor));
        assert_eq!(intake.take(100).1, 5);
        // A commit of 5 is in flight. 3 waiting IDs are too few to go behind it: nothing is
        // taken, and no append wakes the actor until 5 wait.
        assert!(matches!(append(2), Appended::NotifyActor));
        assert!(matches!(append(1), Appended::Queued));
        let (batch, ids) = intake.take_at_least(5, 100);
        assert!(batch.is_empty() && ids == 0);
        assert!(matches!(append(1), Appended::Queued), "4 of 5");
        assert!(
            matches!(append(1), Appended::NotifyActor),
            "5 of 5 wakes it"
        );
        assert!(matches!(append(5), Appended::Queued), "woken once");
        let (batch, ids) = intake.take_at_least(5, 100);
        assert_eq!((batch.len(), ids), (5, 10));
        // A plain take clears the threshold: with the actor due, appends send nothing.
        assert!(matches!(append(1), Appended::NotifyActor));
        assert_eq!(intake.take_at_least(2, 100).1, 0);
        assert_eq!(intake.take(100).1, 1);
        assert!(matches!(append(9), Appended::NotifyActor));
        assert!(
            matches!(append(9), Appended::Queued),
            "no threshold left over"
        );
    }

    #[test]
    fn a_run_of_unavailable_commits_is_reported_at_its_edges_only() {
        let down = CommitOutcome::Unavailable("connection refused".into());
        let fenced = CommitOutcome::FencedOut("stale-token".into());
        let mut since = None;
        assert_eq!(
            unavailable_edge(&mut since, &CommitOutcome::Durable),
            None,
            "healthy stays quiet"
        );
        assert_eq!(
            unavailable_edge(&mut since, &down),
            Some(UnavailableEdge::Began("connection refused"))
        );
        assert!(since.is_some());
        assert_eq!(
            unavailable_edge(&mut since, &down),
            None,
            "the second failure in a row is not reported again"
        );
        assert_eq!(
            unavailable_edge(&mut since, &fenced),
            None,
            "a fenced-out commit is not a recovery"
        );
        assert!(matches!(
            unavailable_edge(&mut since, &CommitOutcome::Durable),
            Some(UnavailableEdge::Ended { .. })
        ));
        assert_eq!(since, None);
        assert_eq!(
            unavailable_edge(&mut since, &down),
            Some(UnavailableEdge::Began("connection refused")),
            "a new run is reported again"
        );
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
