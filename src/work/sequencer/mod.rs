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
//! * **window** (the timestamp oracle of Percolator and TiDB PD, [`Window`](window::Window)): the leader persists
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
//! by one. Each caller's runtime (an HTTP server thread) has an [`AnswerHome`](homes::AnswerHome) per shard
//! ([`AnswerHomes`]), each with a queue of its own: a caller appends its request there (a mutex only the committer ever contends), and
//! only the first append of a home since the actor last took it checks, with one atomic, whether
//! the actor already knows work is waiting ([`Intake`](intake::Intake)). The actor starts a commit by swapping
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

use std::time::Duration;

use ractor::RpcReplyPort;
use serde::Serialize;

use crate::backends::FenceToken;
use crate::work::FenceError;

mod actor;
mod commit_loop;
mod handle;
mod homes;
mod intake;
mod outcome;
mod window;

pub use handle::{SequencerHandle, SequencerWork};
#[cfg(feature = "http")]
pub(crate) use homes::AnswerHomes;
pub use window::WindowSettings;

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
