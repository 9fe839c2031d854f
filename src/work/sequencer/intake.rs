//! The intake: the requests waiting for a term's next group commit, in the queues of the homes
//! they came from, and the hand-off rule that wakes the committer only when it must.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use tokio::sync::Notify;

use super::homes::{AnswerHome, Batch, HomeBatch, Pending};
use super::NextError;

/// Which term's intake a home's queue is for (each [`Intake`] takes a fresh number).
static INTAKE_NUMBERS: AtomicU64 = AtomicU64::new(1);

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
    pub(super) loose: AnswerHome,
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
    pub(super) committer_wake: Notify,
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
pub(super) enum Appended {
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
    pub(super) fn wake_committer(&self) {
        self.committer_wake.notify_one();
    }

    fn homes(&self) -> Vec<AnswerHome> {
        self.homes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(super) fn append(&self, p: Pending, home: Option<&AnswerHome>) -> Appended {
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
    pub(super) fn take(&self, max_ids: usize) -> Batch {
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
    pub(super) fn take_at_least(&self, min_ids: usize, max_ids: usize) -> Batch {
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

    pub(super) fn has_waiting(&self) -> bool {
        self.waiting_ids() > 0
    }

    /// Closes the intake and answers everything still waiting with "demoting".
    pub(super) fn close(&self) {
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

#[cfg(test)]
mod tests {
    use super::super::homes::test_support::*;
    use super::super::homes::AnswerHomes;
    use super::*;
    use std::sync::Arc;

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
}
