//! Window mode (the timestamp oracle): the bound persisted a window ahead, the IDs served from
//! memory below it on the caller's own thread, and the lease-read window that gates them.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ractor::ActorRef;
use tokio::sync::Notify;

use super::{IdBlock, NextCallError, NextError, SequencerMsg};
use crate::backends::FenceToken;
use crate::config::lease_read_until;
use crate::leadership::Leadership;
use crate::metrics as m;

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
pub(super) const EXTEND_RETRY: Duration = Duration::from_millis(100);

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
    pub(super) settings: WindowSettings,
    /// The next ID to hand out (one atomic add per request).
    pub(super) next: AtomicI64,
    /// The highest ID the fence has accepted as this term's bound: none above it is served.
    pub(super) bound: AtomicI64,
    /// Set once the claim has said where `next` starts.
    pub(super) claimed: AtomicBool,
    /// Set when the term's sequencer stops: nothing more is served.
    closed: AtomicBool,
    /// True while the actor is bound to look at the bound again on its own (it was asked, or an
    /// extension or its retry is pending); the caller that finds it false sets it and sends
    /// [`SequencerMsg::Extend`].
    pub(super) extend_asked: AtomicBool,
    /// Woken when `bound` moves, the claim lands or the window closes.
    pub(super) moved: Notify,
    /// Woken when the lease window reopens (or the watch gives up), for callers that found it shut.
    lease_reopened: Notify,
    /// A watch for the lease window's reopening runs.
    lease_watched: AtomicBool,
    pub(super) actor: OnceLock<ActorRef<SequencerMsg>>,
}

impl Window {
    pub(super) fn new(
        token: FenceToken,
        leadership: Arc<Leadership>,
        settings: WindowSettings,
    ) -> Self {
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
    pub(super) fn low_water(&self) -> i64 {
        (self.settings.ids / 2).max(1)
    }

    pub(super) fn close(&self) {
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
    pub(super) async fn next(
        self: &Arc<Self>,
        n: u32,
        timeout: Duration,
    ) -> Result<IdBlock, NextCallError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
