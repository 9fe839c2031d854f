//! Answer homes: the runtime a caller of `POST /next` waits on, the queue its requests wait
//! in for the next group commit, and how a commit's answers are handed back to it.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

use super::{IdBlock, NextError};
use crate::backends::FenceToken;
use crate::metrics as m;

pub(super) type Answer = Result<IdBlock, NextError>;
pub(super) type Reply = oneshot::Sender<Answer>;

pub(super) struct Pending {
    pub(super) n: u32,
    pub(super) reply: Reply,
    pub(super) arrived: Instant,
}

/// A runtime that callers of [`SequencerHandle::next`](super::SequencerHandle::next) wait on (an HTTP server thread), with
/// the queue its callers' requests wait in for the next group commit, so that the committer
/// takes a whole thread's requests at once and hands the thread its answers as one sub-range
/// (see the module docs). Identity is the `Arc`: callers of one runtime share one home per
/// shard ([`AnswerHomes`]).
#[derive(Clone)]
pub(crate) struct AnswerHome(pub(super) Arc<Home>);

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

    pub(super) fn on(rt: Option<tokio::runtime::Handle>, shards: usize) -> Self {
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

pub(super) struct Home {
    /// Where this home's answers are delivered; `None` (the intake's own slot for callers that
    /// name no home): answered straight from the commit task.
    rt: Option<tokio::runtime::Handle>,
    queue: Mutex<HomeQueue>,
}

/// A home's requests waiting for one term's next group commit.
#[derive(Default)]
pub(super) struct HomeQueue {
    /// The [`Intake`](super::intake::Intake) these are for (its number; 0: none yet). A home outlives terms: the first
    /// append of a new term finds another number here and registers the home with that intake.
    pub(super) intake: u64,
    pub(super) waiting: Vec<Pending>,
    /// The IDs `waiting` asks for.
    pub(super) ids: usize,
    /// Whether an append since the actor last took this queue has made sure the actor will
    /// look (so the next ones need not check).
    pub(super) announced: bool,
    /// An emptied queue from an earlier batch, swapped in when the actor takes this one: the
    /// steady state allocates nothing per commit.
    pub(super) spare: Vec<Pending>,
}

impl AnswerHome {
    pub(super) fn on(rt: Option<tokio::runtime::Handle>) -> Self {
        Self(Arc::new(Home {
            rt,
            queue: Mutex::new(HomeQueue::default()),
        }))
    }

    pub(super) fn queue(&self) -> std::sync::MutexGuard<'_, HomeQueue> {
        // A panic while holding this lock leaves Vecs and counters: still consistent.
        self.0.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One home's share of a group commit: its requests, answered in order from `first` on.
pub(super) struct HomeBatch {
    pub(super) home: AnswerHome,
    pub(super) pending: Vec<Pending>,
    /// The IDs `pending` asks for.
    pub(super) ids: usize,
}

/// What the actor took for one group commit: O(homes) entries, however many IDs.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) homes: Vec<HomeBatch>,
    pub(super) ids: usize,
}

/// A home's answers for one commit, sent on the home's own runtime.
pub(super) struct HomeAnswers {
    pub(super) home: AnswerHome,
    pub(super) pending: Vec<Pending>,
    pub(super) token: FenceToken,
    pub(super) first: i64,
    /// Why the commit failed, for every caller of the batch; `None`: durable.
    pub(super) error: Option<NextError>,
}

impl HomeAnswers {
    /// On the home's runtime when it has one (the per-ID work runs on the thread that serves
    /// these callers), else right here.
    pub(super) fn deliver(self) {
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

impl Batch {
    /// Hands each home its sub-range of `[first, ..]` (or everyone `error`): O(homes) here, the
    /// per-request work on each home's own runtime.
    pub(super) fn answer(self, token: FenceToken, first: i64, error: Option<NextError>) {
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

/// Requests and homes for the tests of this file and of the intake.
#[cfg(test)]
pub(super) mod test_support {
    use super::*;

    pub(crate) fn pending(n: u32) -> (Pending, oneshot::Receiver<Result<IdBlock, NextError>>) {
        let (reply, rx) = oneshot::channel();
        let p = Pending {
            n,
            reply,
            arrived: Instant::now(),
        };
        (p, rx)
    }

    /// A home whose runtime nobody drives yet (what is delivered there waits until it runs).
    pub(crate) fn idle_home() -> (AnswerHome, tokio::runtime::Runtime) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        (AnswerHome::on(Some(rt.handle().clone())), rt)
    }

    pub(crate) fn answers(home: &AnswerHome, pending: Vec<Pending>, first: i64) -> HomeAnswers {
        HomeAnswers {
            home: home.clone(),
            pending,
            token: FenceToken(1),
            first,
            error: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

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
}
