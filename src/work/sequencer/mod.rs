//! The Sequencer actor: `POST /next` hands out strictly increasing `(token, seq)`.
//!
//! Two modes (`[sequencer] mode`):
//!
//! * **durable** (the default): the leader allocates IDs in memory from the `last_seq` it
//!   claimed through the fence, and makes every one durable with a fenced group commit before
//!   answering: requests that arrive while a commit is in flight form the next batch, one round
//!   trip per batch. An ID whose commit failed ambiguously is burned, never reused. Real-time
//!   order holds across leaders whatever the clocks do: an ID is answered only after the fence
//!   accepted it, and a successor's claim fences every later commit of this term out.
//! * **window** (the timestamp oracle of Percolator and TiDB PD, [`Window`]): the leader persists
//!   an upper bound a window ahead (`[sequencer] window_ids`) with the same fenced write, then
//!   serves IDs from memory below it, on the caller's own thread with one atomic add, and only
//!   while its lease-read window is open (the bound `GET /read?mode=lease` uses). It extends the
//!   bound in the background once half the window is used. A new leader claims above the highest
//!   bound ever persisted, so uniqueness and per-leader monotonicity hold unconditionally; the
//!   real-time order across a change of leader holds only while the clock-rate bound
//!   (`clock_rate_error`) does, as for lease reads.
//!
//! # The durable path: no per-ID work on the committing thread
//!
//! Requests do not reach the actor one message each, and the committer never touches them one
//! by one. Each caller's runtime (an HTTP server thread) has an [`AnswerHome`] per shard
//! ([`AnswerHomes`]), each with a queue of its own: a caller appends its request there (a mutex only the committer ever contends), and
//! only the first append of a home since the actor last took it checks, with one atomic, whether
//! the actor already knows work is waiting ([`Intake`]). The actor starts a commit by swapping
//! out each home's whole queue (O(homes), whatever the number of IDs), cuts one range for the
//! sum, sends one fenced commit, and when it is answered hands each home its sub-range with one
//! task spawned on that home's runtime; that task answers the home's requests in order, each an
//! ID of the sub-range. So the serial stage (the commit loop) costs O(homes) per group commit,
//! and the per-ID work (the reply channel, the latency histogram) runs on the thread that parsed
//! the request and writes its answer. A home's emptied queue is handed back for its next batch,
//! so the steady state allocates nothing per commit.
//!
//! `[sequencer] min_commit_interval_ms` (default 0: no artificial delay) spaces commits sent one
//! after another: under load fewer, larger commits for at most that much more latency. Up to
//! `[sequencer] commits_in_flight` commits (default 1) are outstanding at once, all sent on one
//! connection (a [`SeqPipe`](crate::work::fence::SeqPipe)), so PostgreSQL runs them in the order
//! their ranges were cut and a later range never reaches the fence row first. A batch goes behind
//! one in flight only once it carries at least as many IDs, so the load is not cut into more,
//! smaller commits than one-at-a-time would send.
//!
//! The group commits themselves are one long-lived task per term, the commit loop
//! (`commit_loop`): it owns the term's connection and the next ID, takes the intake, sends the
//! commit, and when the outcome arrives sends the next commit before it hands the last one's
//! answers to the homes, so PostgreSQL works on the next batch while this thread answers. A
//! commit costs that task one wake-up, no actor message and no task spawned (`experiments/FINDINGS.md`). The
//! actor keeps the term's lifecycle (the claim, checkpoint, stop) and window mode, and never
//! awaits PostgreSQL in `handle()`: claims and window extensions run in spawned tasks that report
//! back with a message.
//!
//! Where it all runs: on one of the HTTP server's client threads when there is one (it offers
//! its runtime, [`SequencerHandle::offer_commit_runtime`]), or on a thread of its own with
//! `[http] commit_threads`, else on the node's runtime. On a client thread the actor, its commit
//! loop and its database connection's I/O share the thread that parses the requests and writes
//! the answers, so on a one-thread server a request crosses no thread inside the node
//! (`experiments/FINDINGS.md`); with more server threads each other thread is woken once per commit, not once per
//! request. The price is that the loop, woken by its commit's answer, waits behind that
//! thread's ready requests, a wait that grows with the load; a commit thread of its own trades
//! that for one more wake-up across threads per commit (`experiments/FINDINGS.md`). Nothing timer-critical
//! moves: heartbeats, renewals and the watchdog stay on the node's runtime, and a stopped term is
//! still refused by the fence whatever thread its last commit left from.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, Notify};

use crate::backends::FenceToken;
use crate::config::{lease_read_until, SequencerMode};
use crate::leadership::Leadership;
use crate::metrics as m;
use crate::work::{FenceError, LeaderWork, RunningWork, WorkContext, WorkError};

mod commit_loop;
use commit_loop::{CommitLoop, LoopMsg};

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
    /// The claim task finished: the last committed seq, or why not.
    Claimed(Result<i64, FenceError>),
    /// Stop taking requests, let the in-flight commit finish, then reply.
    Checkpoint(RpcReplyPort<()>),
    /// Window mode: the IDs left below the persisted bound ran low (sent by a caller, at most
    /// one at a time), or the pause after a failed extension is over.
    Extend,
    /// Window mode: the fenced write of the bound `hi` finished.
    Extended { outcome: CommitOutcome, hi: i64 },
    /// A sequencer without a warm slot looks whether it has been idle for [`SEQ_IDLE_CLOSE`],
    /// and if so closes its connection.
    IdleCheck,
}

/// How long a sequencer without a warm slot ([`crate::work::Fence::take_warm_slot`]) keeps its connection
/// open after its last commit was answered. Past it the next commit opens a new one (connect,
/// authenticate, prepare: a few milliseconds on a local server), once; the commits after it
/// reuse that one as before, so a shard under load never pays it twice.
pub const SEQ_IDLE_CLOSE: Duration = Duration::from_secs(10);

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
}

/// Which term's intake a home's queue is for (each [`Intake`] takes a fresh number).
static INTAKE_NUMBERS: AtomicU64 = AtomicU64::new(1);

/// A runtime that callers of [`SequencerHandle::next`] wait on (an HTTP server thread), with
/// the queue its callers' requests wait in for the next group commit, so that the committer
/// takes a whole thread's requests at once and hands the thread its answers as one sub-range
/// (see the module docs). Identity is the `Arc`: callers of one runtime share one home per
/// shard ([`AnswerHomes`]).
#[derive(Clone)]
pub(crate) struct AnswerHome(Arc<Home>);

/// One runtime's homes, one per shard. A home's queue belongs to one sequencer term at a time
/// and the first request of another term empties it ("demoting": that term is over). Two
/// shards' terms are both live, so a home shared by them would have each shard's requests
/// throw out the other's: every shard needs its own.
#[derive(Clone)]
pub(crate) struct AnswerHomes(Arc<[AnswerHome]>);

#[cfg_attr(not(feature = "http"), allow(dead_code))]
impl AnswerHomes {
    /// `shards` homes on the runtime this is called on.
    pub(crate) fn current(shards: usize) -> Self {
        let rt = tokio::runtime::Handle::current();
        Self::on(Some(rt), shards)
    }

    fn on(rt: Option<tokio::runtime::Handle>, shards: usize) -> Self {
        Self(
            (0..shards.max(1))
                .map(|_| AnswerHome::on(rt.clone()))
                .collect(),
        )
    }

    /// The home of `shard`'s callers on this runtime.
    pub(crate) fn of_shard(&self, shard: usize) -> &AnswerHome {
        &self.0[shard]
    }
}

struct Home {
    /// Where this home's answers are delivered; `None` (the intake's own slot for callers that
    /// name no home): answered straight from the commit task.
    rt: Option<tokio::runtime::Handle>,
    queue: Mutex<HomeQueue>,
}

/// A home's requests waiting for one term's next group commit.
#[derive(Default)]
struct HomeQueue {
    /// The [`Intake`] these are for (its number; 0: none yet). A home outlives terms: the first
    /// append of a new term finds another number here and registers the home with that intake.
    intake: u64,
    waiting: Vec<Pending>,
    /// The IDs `waiting` asks for.
    ids: usize,
    /// Whether an append since the actor last took this queue has made sure the actor will
    /// look (so the next ones need not check).
    announced: bool,
    /// An emptied queue from an earlier batch, swapped in when the actor takes this one: the
    /// steady state allocates nothing per commit.
    spare: Vec<Pending>,
}

impl AnswerHome {
    fn on(rt: Option<tokio::runtime::Handle>) -> Self {
        Self(Arc::new(Home {
            rt,
            queue: Mutex::new(HomeQueue::default()),
        }))
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, HomeQueue> {
        // A panic while holding this lock leaves Vecs and counters: still consistent.
        self.0.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One home's share of a group commit: its requests, answered in order from `first` on.
struct HomeBatch {
    home: AnswerHome,
    pending: Vec<Pending>,
    /// The IDs `pending` asks for.
    ids: usize,
}

/// What the actor took for one group commit: O(homes) entries, however many IDs.
#[derive(Default)]
struct Batch {
    homes: Vec<HomeBatch>,
    ids: usize,
}

/// A home's answers for one commit, sent on the home's own runtime.
struct HomeAnswers {
    home: AnswerHome,
    pending: Vec<Pending>,
    token: FenceToken,
    first: i64,
    /// Why the commit failed, for every caller of the batch; `None`: durable.
    error: Option<NextError>,
}

impl HomeAnswers {
    /// On the home's runtime when it has one (the per-ID work runs on the thread that serves
    /// these callers), else right here.
    fn deliver(self) {
        match self.home.0.rt.clone() {
            // From a task of that same runtime this only queues the task: no syscall. If that
            // runtime has shut down the task is dropped with the senders in it, and each caller
            // sees its channel closed ("not running"): its connection is going away anyway.
            Some(rt) => {
                rt.spawn(async move { self.send() });
            }
            None => self.send(),
        }
    }

    /// Completes each reply channel (a caller that gave up is skipped), then hands the emptied
    /// queue back to the home.
    fn send(mut self) {
        let next_seconds = metrics::histogram!(m::NEXT_SECONDS);
        let now = Instant::now();
        let mut seq = self.first;
        for p in self.pending.drain(..) {
            let answer = match &self.error {
                None => Ok(IdBlock {
                    token: self.token,
                    first: seq,
                    last: seq + p.n as i64 - 1,
                }),
                Some(e) => Err(e.clone()),
            };
            seq += p.n as i64;
            next_seconds.record(now.saturating_duration_since(p.arrived).as_secs_f64());
            let _ = p.reply.send(answer);
        }
        let mut q = self.home.queue();
        if q.spare.capacity() < self.pending.capacity() {
            q.spare = std::mem::take(&mut self.pending);
        }
    }
}

/// The requests waiting for this term's next group commit, in the queues of the homes they came
/// from. Callers on any runtime append to their own home's queue; the commit loop alone takes.
/// `committer_due` is the hand-off rule: true while the committer (the commit loop) is bound to
/// look again on its own (a wake-up is on its way, a claim or commit is in flight and will end in
/// its next look), so appending needs no wake-up; the first append of a home since its queue was
/// last taken checks it, and the one that finds it false sets it and wakes the committer.
pub struct Intake {
    number: u64,
    /// Every home that has appended in this term (the committer's O(homes) walk).
    homes: Mutex<Vec<AnswerHome>>,
    /// The queue of callers that name no home.
    loose: AnswerHome,
    committer_due: AtomicBool,
    /// Set by checkpoint and stop: every later append is answered "demoting" at once.
    closed: AtomicBool,
    /// While the committer waits for enough IDs to send a commit behind the one in flight
    /// ([`Intake::take_at_least`]): that many (0: not waiting). Appends then count into
    /// `counted_ids`, and the one that gets there wakes the committer.
    wake_at_ids: AtomicUsize,
    counted_ids: AtomicUsize,
    /// Where the next take starts its walk, so no home always goes first.
    rotate: AtomicUsize,
    /// Wakes the commit loop ([`Intake::wake_committer`]); a wake-up given while it is busy
    /// is kept for its next wait.
    committer_wake: Notify,
}

impl Default for Intake {
    fn default() -> Self {
        Intake {
            number: INTAKE_NUMBERS.fetch_add(1, Ordering::Relaxed),
            homes: Mutex::new(Vec::new()),
            loose: AnswerHome::on(None),
            committer_due: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            wake_at_ids: AtomicUsize::new(0),
            counted_ids: AtomicUsize::new(0),
            rotate: AtomicUsize::new(0),
            committer_wake: Notify::new(),
        }
    }
}

#[cfg_attr(not(feature = "http"), allow(dead_code))]
enum Appended {
    /// Queued; the caller must call [`Intake::wake_committer`].
    WakeCommitter,
    /// Queued; the committer will look on its own.
    Queued,
    /// Not queued: this term's sequencer is stopping.
    Closed,
}

impl Intake {
    /// Tells the commit loop that requests wait (see [`Appended::WakeCommitter`]).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    fn wake_committer(&self) {
        self.committer_wake.notify_one();
    }

    fn homes(&self) -> Vec<AnswerHome> {
        self.homes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    fn append(&self, p: Pending, home: Option<&AnswerHome>) -> Appended {
        let home = home.unwrap_or(&self.loose);
        let n = p.n as usize;
        let (announce, stale) = {
            let mut q = home.queue();
            let mut stale = Vec::new();
            if q.intake != self.number {
                // The first request of this term from this home. Whatever still waits here was
                // for an earlier term whose close did not reach it: answered "demoting" below.
                stale = std::mem::take(&mut q.waiting);
                q.ids = 0;
                q.announced = false;
                q.intake = self.number;
                self.homes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(home.clone());
            }
            // Checked after registering: a close either sees this home in its walk or is seen here.
            if self.closed.load(Ordering::SeqCst) {
                drop(q);
                for p in stale {
                    let _ = p.reply.send(Err(NextError::Demoting));
                }
                return Appended::Closed;
            }
            q.waiting.push(p);
            q.ids += n;
            let announce = !q.announced;
            q.announced = true;
            (announce, stale)
        };
        for p in stale {
            let _ = p.reply.send(Err(NextError::Demoting));
        }
        if announce && !self.committer_due.swap(true, Ordering::SeqCst) {
            return Appended::WakeCommitter;
        }
        let at = self.wake_at_ids.load(Ordering::SeqCst);
        if at != 0
            && self.counted_ids.fetch_add(n, Ordering::SeqCst) + n >= at
            && self.wake_at_ids.swap(0, Ordering::SeqCst) != 0
        {
            return Appended::WakeCommitter;
        }
        Appended::Queued
    }

    /// Every home's waiting requests, whole queues at a time, up to `max_ids` IDs (always at
    /// least one request: a single home above the bound gives its oldest requests up to it).
    /// O(homes): a queue is swapped out, never walked. The committer stays due while any are
    /// left: it comes back for them when this commit ends.
    fn take(&self, max_ids: usize) -> Batch {
        self.committer_due.store(false, Ordering::SeqCst);
        self.wake_at_ids.store(0, Ordering::SeqCst);
        let homes = self.homes();
        let start = self.rotate.fetch_add(1, Ordering::Relaxed);
        let mut batch = Batch::default();
        let mut left = false;
        for i in 0..homes.len() {
            let home = &homes[(start + i) % homes.len()];
            let mut q = home.queue();
            if q.intake != self.number || q.waiting.is_empty() {
                continue;
            }
            if batch.ids > 0 && batch.ids + q.ids > max_ids {
                left = true;
                continue;
            }
            let (pending, ids) = if q.ids > max_ids && q.waiting.len() > 1 {
                // Only the first home of a batch gets here. Rare (one thread alone holding
                // more than a batch), and the one place the committer copies requests.
                let (mut k, mut ids) = (0, 0);
                while k < q.waiting.len() && (k == 0 || ids + q.waiting[k].n as usize <= max_ids) {
                    ids += q.waiting[k].n as usize;
                    k += 1;
                }
                let rest = q.waiting.split_off(k);
                let taken = std::mem::replace(&mut q.waiting, rest);
                q.ids -= ids;
                left = true;
                (taken, ids)
            } else {
                let spare = std::mem::take(&mut q.spare);
                let taken = std::mem::replace(&mut q.waiting, spare);
                q.announced = false;
                (taken, std::mem::take(&mut q.ids))
            };
            batch.ids += ids;
            batch.homes.push(HomeBatch {
                home: home.clone(),
                pending,
                ids,
            });
        }
        if left {
            self.committer_due.store(true, Ordering::SeqCst);
        }
        batch
    }

    /// The IDs waiting in every home (O(homes)).
    fn waiting_ids(&self) -> usize {
        self.homes()
            .iter()
            .map(|h| {
                let q = h.queue();
                if q.intake == self.number {
                    q.ids
                } else {
                    0
                }
            })
            .sum()
    }

    /// For a commit behind one in flight: [`Intake::take`] once at least `min_ids` IDs wait,
    /// else nothing, and the append that gets there wakes the committer. (The commit in flight
    /// brings the committer back in any case, so it stays due.) Sending a small batch behind a
    /// large one would only split the load into more commits, each costing the database the
    /// same whatever its size.
    fn take_at_least(&self, min_ids: usize, max_ids: usize) -> Batch {
        let waiting = self.waiting_ids();
        if waiting == 0 || waiting < min_ids {
            self.committer_due.store(true, Ordering::SeqCst);
            // Appends between the walk and here are not counted: the committer then looks a
            // little later than it could, at the latest when the commit in flight ends.
            self.counted_ids.store(waiting, Ordering::SeqCst);
            self.wake_at_ids.store(min_ids.max(1), Ordering::SeqCst);
            return Batch::default();
        }
        self.take(max_ids)
    }

    fn has_waiting(&self) -> bool {
        self.waiting_ids() > 0
    }

    /// Closes the intake and answers everything still waiting with "demoting".
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        for home in self.homes() {
            let waiting = {
                let mut q = home.queue();
                if q.intake != self.number {
                    continue;
                }
                q.ids = 0;
                q.announced = false;
                std::mem::take(&mut q.waiting)
            };
            for p in waiting {
                let _ = p.reply.send(Err(NextError::Demoting));
            }
        }
    }
}

/// Window mode's settings: `[sequencer] window_ids`, and the lease-read window's bound
/// (`clock_rate_error`, `read_lease_margin_ms`), the same `GET /read?mode=lease` uses.
#[derive(Clone, Copy, Debug)]
pub struct WindowSettings {
    /// How far ahead of the IDs served the bound is persisted; it is extended once fewer than
    /// half of these are left.
    pub ids: i64,
    pub rate_bound: f64,
    pub margin: Duration,
}

/// How long a caller that found the lease window shut is kept waiting for it to reopen by
/// one watch (it starts another while its own deadline allows).
const LEASE_WATCH_LIMIT: Duration = Duration::from_secs(1);
/// How often that watch looks (one timer for all the callers waiting, not one each).
const LEASE_WATCH_EVERY: Duration = Duration::from_millis(1);
/// The pause before a window extension that failed for want of the database is tried again
/// (the IDs still below the bound are served meanwhile).
const EXTEND_RETRY: Duration = Duration::from_millis(100);

/// Window mode's state, shared by the actor (which moves the bound) and every caller (which
/// take IDs below it on their own threads).
///
/// Why it is safe: `bound` only ever holds a value the fence accepted under this term
/// (`seq_commit` with `seq_hi = bound`, which also sets the sequence's `last_seq` a successor
/// claims from), and no ID above it is answered. So a successor, whose claim fences every later
/// write of this term out, starts above every ID this term served: unique and increasing per
/// leader, whatever the clocks do. Real-time order across the change needs one more thing: that
/// no ID is answered once a successor may have been elected. That is the lease-read window,
/// checked after the ID is taken and before it is answered; it is only as good as the clock-rate
/// bound (`config::lease_read_until`).
pub struct Window {
    token: FenceToken,
    leadership: Arc<Leadership>,
    settings: WindowSettings,
    /// The next ID to hand out (one atomic add per request).
    next: AtomicI64,
    /// The highest ID the fence has accepted as this term's bound: none above it is served.
    bound: AtomicI64,
    /// Set once the claim has said where `next` starts.
    claimed: AtomicBool,
    /// Set when the term's sequencer stops: nothing more is served.
    closed: AtomicBool,
    /// True while the actor is bound to look at the bound again on its own (it was asked, or an
    /// extension or its retry is pending); the caller that finds it false sets it and sends
    /// [`SequencerMsg::Extend`].
    extend_asked: AtomicBool,
    /// Woken when `bound` moves, the claim lands or the window closes.
    moved: Notify,
    /// Woken when the lease window reopens (or the watch gives up), for callers that found it shut.
    lease_reopened: Notify,
    /// A watch for the lease window's reopening runs.
    lease_watched: AtomicBool,
    actor: OnceLock<ActorRef<SequencerMsg>>,
}

impl Window {
    fn new(token: FenceToken, leadership: Arc<Leadership>, settings: WindowSettings) -> Self {
        Window {
            token,
            leadership,
            settings,
            next: AtomicI64::new(0),
            bound: AtomicI64::new(0),
            claimed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            // The claim is on its way: the actor extends right after it.
            extend_asked: AtomicBool::new(true),
            moved: Notify::new(),
            lease_reopened: Notify::new(),
            lease_watched: AtomicBool::new(false),
            actor: OnceLock::new(),
        }
    }

    /// Extend once fewer IDs than this are left below the bound.
    fn low_water(&self) -> i64 {
        (self.settings.ids / 2).max(1)
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.moved.notify_waiters();
        self.lease_reopened.notify_waiters();
    }

    /// Asks the actor to look at the bound, unless it already will.
    fn ask_extend(&self) {
        if !self.extend_asked.load(Ordering::SeqCst)
            && !self.extend_asked.swap(true, Ordering::SeqCst)
        {
            if let Some(actor) = self.actor.get() {
                let _ = actor.cast(SequencerMsg::Extend);
            }
        }
    }

    /// `n` IDs from memory: taken with one atomic add, answered once they are below the
    /// persisted bound (waiting for an extension if the window ran out) and the lease window is
    /// open (waiting for a renewal if it shut). An ID taken and then not answered (timeout, end
    /// of term) is burned.
    async fn next(self: &Arc<Self>, n: u32, timeout: Duration) -> Result<IdBlock, NextCallError> {
        let arrived = Instant::now();
        let deadline = arrived + timeout;
        while !self.claimed.load(Ordering::SeqCst) {
            self.wait_moved(deadline, || self.claimed.load(Ordering::SeqCst))
                .await?;
        }
        let n = n as i64;
        let first = self.next.fetch_add(n, Ordering::SeqCst);
        let last = first + n - 1;
        let bound = self.bound.load(Ordering::SeqCst);
        if bound - last < self.low_water() {
            self.ask_extend();
        }
        while last > self.bound.load(Ordering::SeqCst) {
            self.ask_extend();
            self.wait_moved(deadline, || last <= self.bound.load(Ordering::SeqCst))
                .await?;
        }
        self.lease_open(deadline).await?;
        // Only a request that waited is timed: the rest are answered in place (the histogram is
        // one more atomic on a line every server thread shares).
        let waited = arrived.elapsed();
        if waited > Duration::from_micros(100) {
            metrics::histogram!(m::NEXT_SECONDS).record(waited.as_secs_f64());
        }
        Ok(IdBlock {
            token: self.token,
            first,
            last,
        })
    }

    /// Waits until `ready` (the caller checks it again), the next move of the bound, or the end
    /// of the term.
    async fn wait_moved(
        &self,
        deadline: Instant,
        ready: impl Fn() -> bool,
    ) -> Result<(), NextCallError> {
        let moved = self.moved.notified();
        tokio::pin!(moved);
        moved.as_mut().enable();
        if self.closed.load(Ordering::SeqCst) {
            return Err(NextCallError::Next(NextError::Demoting));
        }
        // What it waits for may have happened before `enable`.
        if ready() {
            return Ok(());
        }
        match tokio::time::timeout_at(deadline.into(), moved).await {
            Ok(()) if self.closed.load(Ordering::SeqCst) => {
                Err(NextCallError::Next(NextError::Demoting))
            }
            Ok(()) => Ok(()),
            Err(_) => Err(NextCallError::Timeout),
        }
    }

    /// Whether this term's lease-read window is open now (`Err`: the term is over here).
    fn lease_is_open(&self) -> Result<bool, NextCallError> {
        let view = self
            .leadership
            .read_view()
            .filter(|v| v.token == self.token)
            .ok_or(NextCallError::Next(NextError::Demoting))?;
        Ok(match (view.lease_sent_at, view.lease_deadline) {
            (Some(sent), Some(deadline)) => lease_read_until(
                sent,
                deadline,
                self.settings.rate_bound,
                self.settings.margin,
            )
            .is_some_and(|until| Instant::now() < until),
            _ => false,
        })
    }

    /// Returns once the lease window is open; while it is shut, waits for a renewal to reopen
    /// it (one shared watch for every caller waiting), until `deadline`.
    async fn lease_open(self: &Arc<Self>, deadline: Instant) -> Result<(), NextCallError> {
        loop {
            let reopened = self.lease_reopened.notified();
            tokio::pin!(reopened);
            reopened.as_mut().enable();
            if self.closed.load(Ordering::SeqCst) {
                return Err(NextCallError::Next(NextError::Demoting));
            }
            if self.lease_is_open()? {
                return Ok(());
            }
            metrics::counter!(m::SEQ_WINDOW_LEASE_WAITS).increment(1);
            if !self.lease_watched.swap(true, Ordering::SeqCst) {
                let w = self.clone();
                tokio::spawn(async move { w.watch_lease().await });
            }
            if tokio::time::timeout_at(deadline.into(), reopened)
                .await
                .is_err()
            {
                return Err(NextCallError::Timeout);
            }
        }
    }

    /// Looks at the lease window every millisecond until it reopens, the term ends here, or
    /// [`LEASE_WATCH_LIMIT`] passes, then wakes every caller waiting for it.
    async fn watch_lease(&self) {
        let give_up = Instant::now() + LEASE_WATCH_LIMIT;
        loop {
            tokio::time::sleep(LEASE_WATCH_EVERY).await;
            let done = self.closed.load(Ordering::SeqCst)
                || !matches!(self.lease_is_open(), Ok(false))
                || Instant::now() >= give_up;
            if done {
                self.lease_watched.store(false, Ordering::SeqCst);
                self.lease_reopened.notify_waiters();
                return;
            }
        }
    }
}

pub struct SequencerState {
    ctx: WorkContext,
    intake: Arc<Intake>,
    /// Durable mode: the commit loop's line (see `commit_loop`); dropped when the term ends,
    /// which is how the loop learns it.
    commit_loop: Option<mpsc::UnboundedSender<LoopMsg>>,
    /// Window mode's shared state (`None` in durable mode).
    window: Option<Arc<Window>>,
    /// Window mode: the bound being written (at most one at a time).
    extending: Option<i64>,
    /// Window mode: a retry of a failed extension is armed.
    extend_retry_armed: bool,
    /// Window mode: this term holds one of the node's warm slots
    /// ([`crate::work::Fence::take_warm_slot`]): its connection stays open while idle. Without
    /// one it closes after [`SEQ_IDLE_CLOSE`] idle. (In durable mode the commit loop holds it.)
    warm: bool,
    /// Window mode: when the last extension was answered.
    last_answered: Instant,
    /// An [`SequencerMsg::IdleCheck`] is on its way (at most one at a time).
    idle_check_armed: bool,
    /// Window mode: since when extensions have failed for want of the database (logged once at
    /// the first failure and once when one succeeds again, not once per write).
    failing_since: Option<Instant>,
    /// Window mode: checkpoints waiting for the extension in flight.
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
    type Arguments = (WorkContext, CommitLimits, Arc<Intake>, Option<Arc<Window>>);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (ctx, limits, intake, window): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        if let Some(w) = &window {
            let _ = w.actor.set(myself.clone());
        }
        let (fence, token) = (ctx.fence.clone(), ctx.token);
        // A warm slot: the node's first WARM_SEQ_PIPES (8) terms take one, so an unsharded node
        // (and any node leading at most 8 shards) behaves as it always did, failover included;
        // beyond that a node's idle shards hold no connection each (at K = 1024 they held
        // 1024 and exhausted PostgreSQL's max_connections). A bound per node rather than a
        // rule on K: K is not what costs connections, the shards a node leads at once are.
        let mut warm = fence.take_warm_slot();
        let commit_loop = window.is_none().then(|| {
            // Spawned from here, its connection's I/O runs where the actor does (see the module
            // doc). It holds the warm slot from now on.
            let (tx, rx) = mpsc::unbounded_channel();
            let me = myself.clone();
            CommitLoop::new(ctx.clone(), limits, intake.clone(), me, rx, warm).spawn();
            warm = false;
            tx
        });
        tokio::spawn(async move {
            let res = fence.seq_claim(SEQUENCE_RESOURCE, token).await;
            let _ = myself.cast(SequencerMsg::Claimed(res));
        });
        ctx.trace.step(
            "sequencer",
            "started",
            Some(ctx.token),
            if window.is_some() { "mode=window" } else { "" },
        );
        Ok(SequencerState {
            ctx,
            intake,
            commit_loop,
            window,
            extending: None,
            extend_retry_armed: false,
            warm,
            last_answered: Instant::now(),
            idle_check_armed: false,
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
        if let Some(w) = &state.window {
            w.close();
        }
        // The term's connection does not outlive it: the commit loop's closes when its last
        // commit is answered (dropping its line tells it), one idle in the pool closes now. (A
        // node that kept one per shard it had ever led held up to K connections whatever it
        // led now.)
        state.commit_loop = None;
        state.ctx.fence.close_idle_seq_pipe();
        if state.warm {
            state.warm = false;
            state.ctx.fence.release_warm_slot();
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
            SequencerMsg::Claimed(Ok(last_seq)) => {
                state.ctx.trace.step(
                    "sequencer",
                    "claimed",
                    Some(state.ctx.token),
                    &format!("last_seq={last_seq}"),
                );
                // Everything up to last_seq is committed (the claim itself went through the fence).
                state
                    .ctx
                    .leadership
                    .set_committed_seq(state.ctx.token, last_seq);
                if let Some(w) = &state.window {
                    // In window mode last_seq is the highest bound any term persisted: this
                    // term serves nothing at or below it, and nothing above it until its own
                    // bound is accepted.
                    w.next.store(last_seq + 1, Ordering::SeqCst);
                    w.bound.store(last_seq, Ordering::SeqCst);
                    w.claimed.store(true, Ordering::SeqCst);
                    w.moved.notify_waiters();
                    state.maybe_extend(&myself);
                } else if let Some(commit_loop) = &state.commit_loop {
                    let _ = commit_loop.send(LoopMsg::Claimed(last_seq));
                }
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
            SequencerMsg::IdleCheck => {
                state.idle_check_armed = false;
                if state.warm || state.extending.is_some() {
                    // Busy: the commit's answer looks again when it goes idle.
                    return Ok(());
                }
                if state.last_answered.elapsed() >= SEQ_IDLE_CLOSE {
                    if state.ctx.fence.close_idle_seq_pipe() {
                        state
                            .ctx
                            .trace
                            .step("sequencer", "idle-close", Some(state.ctx.token), "");
                    }
                } else {
                    state.idle(&myself);
                }
            }
            SequencerMsg::Extend => {
                state.extend_retry_armed = false;
                state.maybe_extend(&myself);
            }
            SequencerMsg::Extended { outcome, hi } => {
                state.extending = None;
                log_unavailable_edge(&mut state.failing_since, state.ctx.token, &outcome, true);
                match outcome {
                    CommitOutcome::Durable => {
                        if let Some(w) = &state.window {
                            // Published before any ID under it is answered, like a group
                            // commit's end: a read never trails an acknowledged ID.
                            state.ctx.leadership.set_committed_seq(state.ctx.token, hi);
                            w.bound.store(hi, Ordering::SeqCst);
                            w.moved.notify_waiters();
                        }
                    }
                    CommitOutcome::FencedOut(why) => {
                        myself.stop(Some(why));
                        return Ok(());
                    }
                    CommitOutcome::Unavailable(_) => {
                        // The IDs left below the bound are still served; try again shortly.
                        if !state.extend_retry_armed {
                            state.extend_retry_armed = true;
                            let me = myself.clone();
                            tokio::spawn(async move {
                                tokio::time::sleep(EXTEND_RETRY).await;
                                let _ = me.cast(SequencerMsg::Extend);
                            });
                        }
                    }
                }
                state.last_answered = Instant::now();
                if state.drained() {
                    return Ok(());
                }
                state.maybe_extend(&myself);
                if state.extending.is_none() {
                    state.idle(&myself);
                }
            }
            SequencerMsg::Checkpoint(reply) => {
                // Every issued ID is already durable (window mode: below a durable bound);
                // quiescing is all a checkpoint needs here.
                state.intake.close();
                if let Some(w) = &state.window {
                    w.close();
                }
                if let Some(commit_loop) = &state.commit_loop {
                    // Durable mode: the loop replies once its commits in flight are answered.
                    if let Err(mpsc::error::SendError(LoopMsg::Drain(reply))) =
                        commit_loop.send(LoopMsg::Drain(reply))
                    {
                        let _ = reply.send(());
                    }
                    return Ok(());
                }
                let busy = state.extending.is_some();
                let waiters = state.draining.get_or_insert_with(Vec::new);
                if busy {
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
    /// Window mode, nothing in flight, the connection back in its pool: a sequencer with a warm
    /// slot keeps it there, one without takes a slot if one has come free since, or else looks
    /// again [`SEQ_IDLE_CLOSE`] after the last answer whether it is still idle, and closes it
    /// then.
    fn idle(&mut self, myself: &ActorRef<SequencerMsg>) {
        if self.warm || self.idle_check_armed {
            return;
        }
        if self.ctx.fence.take_warm_slot() {
            self.warm = true;
            return;
        }
        self.idle_check_armed = true;
        let (me, at) = (myself.clone(), self.last_answered + SEQ_IDLE_CLOSE);
        tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let _ = me.cast(SequencerMsg::IdleCheck);
        });
    }

    /// While draining (a checkpoint came): answers the checkpoint once nothing is in flight.
    /// True when draining, so the caller starts nothing new.
    fn drained(&mut self) -> bool {
        let idle = self.extending.is_none();
        match self.draining.as_mut() {
            Some(waiters) => {
                if idle {
                    for w in waiters.drain(..) {
                        let _ = w.send(());
                    }
                }
                true
            }
            None => false,
        }
    }

    /// Window mode: writes the next bound through the fence if fewer than half a window of IDs
    /// is left below the current one (or callers already wait above it), unless a write or its
    /// retry is pending. When there is nothing to do it lets callers ask again.
    fn maybe_extend(&mut self, myself: &ActorRef<SequencerMsg>) {
        let Some(w) = self.window.clone() else { return };
        if !w.claimed.load(Ordering::SeqCst)
            || self.extending.is_some()
            || self.extend_retry_armed
            || self.draining.is_some()
        {
            // What is pending brings the actor back here; callers need not ask meanwhile.
            return;
        }
        let bound = w.bound.load(Ordering::SeqCst);
        let low = |w: &Window| bound - (w.next.load(Ordering::SeqCst) - 1) < w.low_water();
        if !low(&w) {
            w.extend_asked.store(false, Ordering::SeqCst);
            // A caller may have taken IDs between the look and the store, and seen the flag
            // still set: look once more now that callers will ask again.
            if !low(&w) {
                return;
            }
            w.extend_asked.store(true, Ordering::SeqCst);
        }
        let (lo, hi) = (bound + 1, bound + w.settings.ids);
        self.extending = Some(hi);
        let (fence, token, me) = (self.ctx.fence.clone(), self.ctx.token, myself.clone());
        let sent = Instant::now();
        tokio::spawn(async move {
            let res = match fence.seq_pipe(SEQUENCE_RESOURCE).await {
                Ok(pipe) => Arc::new(pipe).send_commit(token, lo, hi).await,
                Err(e) => Err(e),
            };
            metrics::histogram!(m::SEQ_COMMIT_SECONDS).record(sent.elapsed().as_secs_f64());
            metrics::histogram!(m::SEQ_BATCH_IDS).record((hi - lo + 1) as f64);
            let outcome = outcome_of(&res);
            let _ = me.cast(SequencerMsg::Extended { outcome, hi });
        });
    }
}

/// Logs the edges of a run of fenced writes (group commits, or window mode's extensions) that
/// failed for want of the database (see [`unavailable_edge`]).
fn log_unavailable_edge(
    failing_since: &mut Option<Instant>,
    token: FenceToken,
    outcome: &CommitOutcome,
    window: bool,
) {
    let token = token.0;
    match unavailable_edge(failing_since, outcome) {
        Some(UnavailableEdge::Began(why)) if window => tracing::warn!(
            token,
            error = why,
            "sequencer: writing the window's next bound failed for want of the database; the IDs left below the bound are still served, and it is tried again every 100 ms"
        ),
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

/// How a fenced sequence write ended, as the actor needs to know it.
fn outcome_of(res: &Result<(), FenceError>) -> CommitOutcome {
    match res {
        Ok(()) => CommitOutcome::Durable,
        Err(e @ FenceError::Rejected { .. }) => CommitOutcome::FencedOut(e.to_string()),
        Err(e) => CommitOutcome::Unavailable(e.to_string()),
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

/// Why a group commit's callers are refused (`None`: its IDs are durable).
fn next_error_of(res: &Result<(), FenceError>) -> Option<NextError> {
    match res {
        Ok(()) => None,
        Err(e @ FenceError::Rejected { .. }) => Some(NextError::Fenced(e.to_string())),
        Err(e) => Some(NextError::Unavailable(e.to_string())),
    }
}

impl Batch {
    /// Hands each home its sub-range of `[first, ..]` (or everyone `error`): O(homes) here, the
    /// per-request work on each home's own runtime.
    fn answer(self, token: FenceToken, first: i64, error: Option<NextError>) {
        let mut next = first;
        for part in self.homes {
            let ids = part.ids as i64;
            HomeAnswers {
                home: part.home,
                pending: part.pending,
                token,
                first: next,
                error: error.clone(),
            }
            .deliver();
            next += ids;
        }
        debug_assert_eq!(next - first, self.ids as i64);
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(n: u32) -> (Pending, oneshot::Receiver<Result<IdBlock, NextError>>) {
        let (reply, rx) = oneshot::channel();
        let p = Pending {
            n,
            reply,
            arrived: Instant::now(),
        };
        (p, rx)
    }

    /// A home whose runtime nobody drives yet (what is delivered there waits until it runs).
    fn idle_home() -> (AnswerHome, tokio::runtime::Runtime) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        (AnswerHome::on(Some(rt.handle().clone())), rt)
    }

    fn answers(home: &AnswerHome, pending: Vec<Pending>, first: i64) -> HomeAnswers {
        HomeAnswers {
            home: home.clone(),
            pending,
            token: FenceToken(1),
            first,
            error: None,
        }
    }

    #[test]
    fn a_homes_answers_are_sent_on_its_runtime_in_order_from_its_first_id() {
        let (home, rt) = idle_home();
        let (a, mut ra) = pending(1);
        let (b, mut rb) = pending(3);
        let (c, mut rc) = pending(1);
        answers(&home, vec![a, b, c], 10).deliver();
        assert!(ra.try_recv().is_err(), "delivered before its home ran");
        rt.block_on(async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        });
        let got = |r: &mut oneshot::Receiver<Answer>| match r.try_recv() {
            Ok(Ok(b)) => (b.first, b.last),
            other => panic!("{other:?}"),
        };
        assert_eq!(got(&mut ra), (10, 10));
        assert_eq!(got(&mut rb), (11, 13));
        assert_eq!(got(&mut rc), (14, 14));
        // The emptied queue went back to the home for its next batch.
        assert!(home.queue().spare.capacity() >= 3);
        // A home whose runtime is gone drops its answers: the callers see the channel closed.
        let (d, mut rd) = pending(1);
        drop(rt);
        answers(&home, vec![d], 20).deliver();
        assert!(matches!(
            rd.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
    }

    #[test]
    fn callers_without_a_home_are_answered_at_once_errors_included() {
        let intake = Intake::default();
        let (a, mut ra) = pending(2);
        let mut batch = answers(&intake.loose, vec![a], 5);
        batch.error = Some(NextError::Unavailable("down".into()));
        batch.deliver();
        assert!(matches!(ra.try_recv(), Ok(Err(NextError::Unavailable(_)))));
    }

    #[test]
    fn only_the_first_append_after_a_take_wakes_the_actor() {
        let intake = Intake::default();
        let (h1, _rt1) = idle_home();
        let (h2, _rt2) = idle_home();
        let (a, _ra) = pending(1);
        let (b, _rb) = pending(1);
        let (c, _rc) = pending(1);
        assert!(matches!(
            intake.append(a, Some(&h1)),
            Appended::WakeCommitter
        ));
        assert!(matches!(intake.append(b, Some(&h1)), Appended::Queued));
        // Another home's first append finds the actor already due.
        assert!(matches!(intake.append(c, Some(&h2)), Appended::Queued));
        let batch = intake.take(100);
        assert_eq!((batch.homes.len(), batch.ids), (2, 3));
        // Taken whole: the actor will not look again by itself, so the next append must wake it.
        let (d, _rd) = pending(1);
        assert!(matches!(
            intake.append(d, Some(&h2)),
            Appended::WakeCommitter
        ));
    }

    #[test]
    fn a_take_swaps_each_homes_queue_out_whole_without_copying_a_request() {
        let intake = Intake::default();
        let homes: Vec<_> = (0..3).map(|_| idle_home()).collect();
        let mut rxs = Vec::new();
        for (home, _) in &homes {
            for _ in 0..500 {
                let (p, rx) = pending(1);
                rxs.push(rx);
                let _ = intake.append(p, Some(home));
            }
        }
        let before: Vec<*const Pending> = homes
            .iter()
            .map(|(h, _)| h.queue().waiting.as_ptr())
            .collect();
        let batch = intake.take(10_000);
        assert_eq!((batch.homes.len(), batch.ids), (3, 1500));
        for part in &batch.homes {
            let at = homes
                .iter()
                .position(|(h, _)| Arc::ptr_eq(&h.0, &part.home.0))
                .unwrap();
            assert_eq!(
                part.pending.as_ptr(),
                before[at],
                "the queue itself, not a copy"
            );
            assert_eq!(part.ids, 500);
        }
        assert_eq!(intake.waiting_ids(), 0);
    }

    #[test]
    fn a_take_bounded_by_the_batch_leaves_the_committer_due_for_the_rest() {
        let intake = Intake::default();
        let (h1, _rt1) = idle_home();
        let (h2, _rt2) = idle_home();
        let mut rxs = Vec::new();
        let mut append = |n, h: &AnswerHome| {
            let (p, rx) = pending(n);
            rxs.push(rx);
            intake.append(p, Some(h))
        };
        let _ = append(3, &h1);
        let _ = append(3, &h1);
        let _ = append(3, &h2);
        // Whole homes while they fit: one of them now, the other when this commit ends.
        let batch = intake.take(7);
        assert_eq!((batch.homes.len(), batch.ids), (1, 6));
        let (d, _rd) = pending(1);
        assert!(
            matches!(intake.append(d, Some(&h1)), Appended::Queued),
            "the actor is still due for what was left"
        );
        let rest = intake.take(7);
        assert_eq!(batch.ids + rest.ids, 10);
        // One home holding more than a batch gives its oldest requests up to the bound (always
        // at least one).
        let intake = Intake::default();
        let mut rxs = Vec::new();
        for n in [3, 3, 3] {
            let (p, rx) = pending(n);
            rxs.push(rx);
            let _ = intake.append(p, Some(&h1));
        }
        assert_eq!(intake.take(6).ids, 6);
        assert_eq!(intake.take(6).ids, 3);
        let (big, _rbig) = pending(50);
        let _ = intake.append(big, Some(&h1));
        assert_eq!(intake.take(6).ids, 50);
    }

    #[test]
    fn a_commit_goes_behind_one_in_flight_only_once_a_full_batch_waits() {
        let intake = Intake::default();
        let (h, _rt) = idle_home();
        let mut rxs = Vec::new();
        let mut append = |n| {
            let (p, rx) = pending(n);
            rxs.push(rx);
            intake.append(p, Some(&h))
        };
        assert!(matches!(append(5), Appended::WakeCommitter));
        assert_eq!(intake.take(100).ids, 5);
        // A commit of 5 is in flight. 3 waiting IDs are too few to go behind it: nothing is
        // taken, and no append wakes the actor until 5 wait.
        assert!(matches!(append(2), Appended::WakeCommitter));
        assert!(matches!(append(1), Appended::Queued));
        let batch = intake.take_at_least(5, 100);
        assert!(batch.homes.is_empty() && batch.ids == 0);
        assert!(matches!(append(1), Appended::Queued), "4 of 5");
        assert!(
            matches!(append(1), Appended::WakeCommitter),
            "5 of 5 wakes it"
        );
        assert!(matches!(append(5), Appended::Queued), "woken once");
        assert_eq!(intake.take_at_least(5, 100).ids, 10);
        // A plain take clears the threshold: with the actor due, appends send nothing.
        assert!(matches!(append(1), Appended::WakeCommitter));
        assert_eq!(intake.take_at_least(2, 100).ids, 0);
        assert_eq!(intake.take(100).ids, 1);
        assert!(matches!(append(9), Appended::WakeCommitter));
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
    fn one_runtime_keeps_each_shards_waiting_requests_apart() {
        // Two shards' terms live at once, callers of both on one runtime: neither shard's
        // append may answer the other's waiting request (a shared home did: 503 not_ready).
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let homes = AnswerHomes::on(Some(rt.handle().clone()), 2);
        let (shard0, shard1) = (Intake::default(), Intake::default());
        let (a, mut ra) = pending(1);
        let (b, mut rb) = pending(2);
        let _ = shard0.append(a, Some(homes.of_shard(0)));
        let _ = shard1.append(b, Some(homes.of_shard(1)));
        assert!(ra.try_recv().is_err(), "shard 0's request still waits");
        assert!(rb.try_recv().is_err(), "shard 1's request still waits");
        assert_eq!(shard0.take(10).ids, 1);
        assert_eq!(shard1.take(10).ids, 2);
    }

    #[test]
    fn closing_answers_the_waiting_and_refuses_later_appends() {
        let intake = Intake::default();
        let (h, _rt) = idle_home();
        let (a, mut ra) = pending(1);
        let (b, mut rb) = pending(1);
        let _ = intake.append(a, Some(&h));
        let _ = intake.append(b, None);
        intake.close();
        assert!(matches!(ra.try_recv(), Ok(Err(NextError::Demoting))));
        assert!(matches!(rb.try_recv(), Ok(Err(NextError::Demoting))));
        let (c, _rc) = pending(1);
        assert!(matches!(intake.append(c, Some(&h)), Appended::Closed));
        assert!(intake.take(10).homes.is_empty());
        // The next term's intake finds the home free; a request an earlier term left behind
        // (its close never reached the home) is answered "demoting", not carried over.
        let (d, mut rd) = pending(1);
        h.queue().waiting.push(d);
        let next_term = Intake::default();
        let (e, _re) = pending(1);
        assert!(matches!(
            next_term.append(e, Some(&h)),
            Appended::WakeCommitter
        ));
        assert!(matches!(rd.try_recv(), Ok(Err(NextError::Demoting))));
        assert_eq!(next_term.take(10).ids, 1);
    }

    fn window(ids: i64) -> Window {
        let (_tx, rx) = tokio::sync::watch::channel(None);
        let leadership = Arc::new(Leadership::new(
            "n1".into(),
            None,
            crate::backends::BackendKind::Raft,
            rx,
        ));
        Window::new(
            FenceToken(3),
            leadership,
            WindowSettings {
                ids,
                rate_bound: 0.01,
                margin: Duration::from_millis(50),
            },
        )
    }

    #[test]
    fn a_window_serves_nothing_without_a_term_nor_an_open_lease_window() {
        let w = window(10);
        // Not leading at all: the term is over here.
        assert!(matches!(
            w.lease_is_open(),
            Err(NextCallError::Next(NextError::Demoting))
        ));
        w.leadership.set_term(Some(FenceToken(3)));
        // Leading, but no renewal yet: shut.
        assert!(matches!(w.lease_is_open(), Ok(false)));
        let now = Instant::now();
        w.leadership
            .set_deadline(FenceToken(3), Some((now + Duration::from_millis(500), now)));
        assert!(matches!(w.lease_is_open(), Ok(true)));
        // A deadline too close for the margin: the window is already shut.
        w.leadership
            .set_deadline(FenceToken(3), Some((now + Duration::from_millis(40), now)));
        assert!(matches!(w.lease_is_open(), Ok(false)));
        // Another term's view is not this term's.
        w.leadership.set_term(Some(FenceToken(4)));
        assert!(w.lease_is_open().is_err());
    }

    #[tokio::test]
    async fn a_window_hands_out_ids_below_the_persisted_bound_only() {
        let w = Arc::new(window(10));
        w.leadership.set_term(Some(FenceToken(3)));
        let now = Instant::now();
        w.leadership
            .set_deadline(FenceToken(3), Some((now + Duration::from_secs(60), now)));
        // Claimed at 100 and a bound of 104 persisted: 101..=104 are served, in order.
        w.next.store(101, Ordering::SeqCst);
        w.bound.store(104, Ordering::SeqCst);
        w.claimed.store(true, Ordering::SeqCst);
        w.extend_asked.store(false, Ordering::SeqCst);
        let t = Duration::from_millis(50);
        assert_eq!(w.next(1, t).await.unwrap().first, 101);
        let b = w.next(3, t).await.unwrap();
        assert_eq!((b.first, b.last), (102, 104));
        assert!(
            w.extend_asked.load(Ordering::SeqCst),
            "fewer than half a window left: an extension was asked for"
        );
        // 105 is above the bound: not served until the bound moves (here it never does).
        assert!(matches!(w.next(1, t).await, Err(NextCallError::Timeout)));
        // Once it moves, the waiting caller gets its ID.
        let waiting = {
            let w = w.clone();
            tokio::spawn(async move { w.next(1, Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        w.bound.store(120, Ordering::SeqCst);
        w.moved.notify_waiters();
        assert_eq!(waiting.await.unwrap().unwrap().first, 106, "105 was burned");
        // A closed window serves nothing, and wakes whoever waits.
        w.close();
        assert!(matches!(
            w.next(1, t).await,
            Err(NextCallError::Next(NextError::Demoting))
        ));
    }

    #[tokio::test]
    async fn a_window_waits_for_the_lease_window_to_reopen() {
        let w = Arc::new(window(1000));
        w.leadership.set_term(Some(FenceToken(3)));
        w.next.store(1, Ordering::SeqCst);
        w.bound.store(1000, Ordering::SeqCst);
        w.claimed.store(true, Ordering::SeqCst);
        // No renewal yet: the caller waits, and is served once one arrives.
        let waiting = {
            let w = w.clone();
            tokio::spawn(async move { w.next(1, Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiting.is_finished(), "served with the lease window shut");
        let now = Instant::now();
        w.leadership
            .set_deadline(FenceToken(3), Some((now + Duration::from_secs(60), now)));
        let got = tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .expect("still waiting after the renewal")
            .unwrap()
            .unwrap();
        assert_eq!(got.first, 1);
    }
}
