//! One leadership confirmation serves every `quorum` read that arrived before it started.
//!
//! A `quorum` read needs the backend to confirm this node's term at some instant *after the read
//! arrived* (raft: a ReadIndex heartbeat round; etcd: a revision-checked read; and so on). One
//! confirmation per read costs a backend round trip each, and under load the reads queue behind
//! each other's round trips. The standard remedy (raft's ReadIndex batching) is sound here too: a
//! confirmation that *started* after a read arrived is as good for that read as its own.
//!
//! So at most one confirmation runs at a time. A read notes how many had started when it arrived
//! (`started`), takes the lock, and if a confirmation numbered above that has finished meanwhile,
//! for the same term, it uses that outcome; otherwise it runs the next one itself. Reads that
//! arrive while one runs share the one after it: a read never uses a confirmation that began
//! before it arrived (that could predate a new leader's first write it must see).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backends::FenceToken;

/// What one confirmation found (cloned to every read that shares it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Confirmed {
    /// The backend named this node's term as leader at an instant during the call.
    Held,
    /// The backend names another term (or no term of this node).
    NotLeader,
    /// The backend could not answer; the text says why.
    Unavailable(String),
    /// No answer within the read's bound.
    Timeout,
}

#[derive(Default)]
pub(crate) struct ConfirmBatches {
    /// Confirmations started so far (the number of the newest one).
    started: AtomicU64,
    /// Held while a confirmation runs; holds the newest finished one: (number, term, outcome).
    last: tokio::sync::Mutex<Option<(u64, FenceToken, Confirmed)>>,
}

impl ConfirmBatches {
    /// Confirms `token`'s term with a confirmation that started after this call, running
    /// `confirm` only when no such confirmation has finished by the time the lock is ours.
    pub async fn confirm<F, Fut>(&self, token: FenceToken, confirm: F) -> Confirmed
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Confirmed>,
    {
        // SeqCst pairs with the increment below: a confirmation numbered above `arrived` was
        // numbered (and so started) after this load.
        let arrived = self.started.load(Ordering::SeqCst);
        let mut last = self.last.lock().await;
        if let Some((n, t, outcome)) = last.as_ref() {
            if *n > arrived && *t == token {
                metrics::counter!(crate::metrics::READ_CONFIRMS_SHARED_TOTAL).increment(1);
                return outcome.clone();
            }
        }
        let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        let outcome = confirm().await;
        *last = Some((n, token, outcome.clone()));
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    /// Counts the confirmations it ran; each takes `ms` and returns `Held`.
    async fn slow_confirm(calls: Arc<AtomicU64>, ms: u64) -> Confirmed {
        calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Confirmed::Held
    }

    /// A read of `token`'s term, on its own task, whose confirmation (if it runs one) takes `ms`.
    fn spawn_read(
        batches: &Arc<ConfirmBatches>,
        calls: &Arc<AtomicU64>,
        token: i64,
        ms: u64,
    ) -> tokio::task::JoinHandle<Confirmed> {
        let (b, c) = (batches.clone(), calls.clone());
        tokio::spawn(async move { b.confirm(FenceToken(token), || slow_confirm(c, ms)).await })
    }

    #[tokio::test(start_paused = true)]
    async fn reads_that_arrive_during_a_confirmation_share_the_next_one() {
        let batches = Arc::new(ConfirmBatches::default());
        let calls = Arc::new(AtomicU64::new(0));
        let first = spawn_read(&batches, &calls, 3, 50);
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Ten reads arrive while the first confirmation runs: none may use it.
        let later: Vec<_> = (0..10)
            .map(|_| spawn_read(&batches, &calls, 3, 50))
            .collect();
        assert_eq!(first.await.unwrap(), Confirmed::Held);
        for r in later {
            assert_eq!(r.await.unwrap(), Confirmed::Held);
        }
        // The first, then exactly one more for all ten.
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_never_uses_a_confirmation_that_started_before_it_arrived() {
        let batches = ConfirmBatches::default();
        let calls = Arc::new(AtomicU64::new(0));
        batches
            .confirm(FenceToken(3), || slow_confirm(calls.clone(), 5))
            .await;
        // Arrives after that one finished: it runs its own.
        batches
            .confirm(FenceToken(3), || slow_confirm(calls.clone(), 5))
            .await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn another_terms_confirmation_is_never_shared() {
        let batches = Arc::new(ConfirmBatches::default());
        let calls = Arc::new(AtomicU64::new(0));
        let old = spawn_read(&batches, &calls, 3, 50);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let new_term = spawn_read(&batches, &calls, 4, 5);
        let same_term = spawn_read(&batches, &calls, 3, 5);
        old.await.unwrap();
        assert_eq!(new_term.await.unwrap(), Confirmed::Held);
        // Term 3's second read arrived during the first confirmation and after it the lock
        // went to term 4's: it cannot share either, so it ran its own.
        assert_eq!(same_term.await.unwrap(), Confirmed::Held);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }
}
