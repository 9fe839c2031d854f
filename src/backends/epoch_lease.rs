//! What an epoch-lease elector (pg-lease, sharded raft) remembers of its own candidacy: the
//! holder id it campaigns under and the epoch it holds while leading. Both backends keep a lease
//! row named by a holder id and numbered by an epoch in a store that judges expiry itself, so the
//! rules for that memory are the same and live here once:
//! - a holder id is made before the first acquisition is sent and kept across failed or dropped
//!   campaigns, because such an acquisition may have landed unseen and `close` must still be able
//!   to withdraw it;
//! - a win counts only if the candidacy was not closed while the request was in flight;
//! - a lost renewal forgets the lease only if it is still the epoch that was renewed.
use std::sync::{Mutex, MutexGuard};

use rand::Rng;

/// One elector's candidacy, behind a lock of its own (held only for these few field updates,
/// never across a request).
#[derive(Default)]
pub(crate) struct EpochLease {
    inner: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    /// This candidacy's holder id (node id + random); set before an acquisition is sent.
    holder: Option<String>,
    /// The epoch held, while leading.
    epoch: Option<i64>,
}

impl EpochLease {
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The holder id to campaign under (a previous failed campaign's, else a new one for
    /// `node_id`); `None` while an epoch is held.
    pub fn holder_for_campaign(&self, node_id: &str) -> Option<String> {
        let mut held = self.lock();
        if held.epoch.is_some() {
            return None;
        }
        Some(
            held.holder
                .get_or_insert_with(|| {
                    format!("{node_id}-{:016x}", rand::thread_rng().gen::<u64>())
                })
                .clone(),
        )
    }

    /// Records `epoch` as won by `holder`; false if the candidacy was closed (or replaced) while
    /// the acquisition was in flight, in which case the caller must release what it was granted.
    pub fn won(&self, holder: &str, epoch: i64) -> bool {
        let mut held = self.lock();
        let ours = held.holder.as_deref() == Some(holder);
        if ours {
            held.epoch = Some(epoch);
        }
        ours
    }

    /// The holder id and epoch while leading.
    pub fn held(&self) -> Option<(String, i64)> {
        let held = self.lock();
        Some((held.holder.clone()?, held.epoch?))
    }

    /// The holder id if it holds exactly `epoch`.
    pub fn holder_at(&self, epoch: i64) -> Option<String> {
        self.held().filter(|(_, e)| *e == epoch).map(|(h, _)| h)
    }

    /// Forgets the lease after a renewal of `epoch` found it gone (unless a newer campaign has
    /// replaced it meanwhile).
    pub fn lost(&self, epoch: i64) {
        let mut held = self.lock();
        if held.epoch == Some(epoch) {
            held.epoch = None;
            held.holder = None;
        }
    }

    /// Takes the held epoch (and its holder) for a resignation; `None` when not leading.
    pub fn take_held(&self) -> Option<(Option<String>, i64)> {
        let mut held = self.lock();
        let epoch = held.epoch.take()?;
        Some((held.holder.take(), epoch))
    }

    /// Takes the holder id for a close, leading or not (a dropped campaign's acquisition may
    /// have landed unseen).
    pub fn take_for_close(&self) -> Option<String> {
        let mut held = self.lock();
        held.epoch = None;
        held.holder.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_campaign_keeps_its_holder_and_a_close_takes_it() {
        let lease = EpochLease::default();
        let h = lease.holder_for_campaign("n1").unwrap();
        assert!(h.starts_with("n1-"));
        assert_eq!(lease.holder_for_campaign("n1").as_deref(), Some(h.as_str()));
        assert_eq!(lease.held(), None);
        assert_eq!(lease.take_for_close().as_deref(), Some(h.as_str()));
        assert_ne!(lease.holder_for_campaign("n1").unwrap(), h);
    }

    #[test]
    fn a_win_after_close_is_not_ours() {
        let lease = EpochLease::default();
        let h = lease.holder_for_campaign("n1").unwrap();
        lease.take_for_close();
        assert!(!lease.won(&h, 4));
        assert_eq!(lease.held(), None);
    }

    #[test]
    fn a_lost_renewal_forgets_only_its_own_epoch() {
        let lease = EpochLease::default();
        let h = lease.holder_for_campaign("n1").unwrap();
        assert!(lease.won(&h, 4));
        assert_eq!(lease.holder_for_campaign("n1"), None);
        assert_eq!(lease.holder_at(4).as_deref(), Some(h.as_str()));
        assert_eq!(lease.holder_at(3), None);
        lease.lost(3);
        assert_eq!(lease.held(), Some((h.clone(), 4)));
        lease.lost(4);
        assert_eq!(lease.held(), None);
        assert_eq!(lease.take_held(), None);
    }

    #[test]
    fn a_resignation_takes_the_epoch_and_its_holder() {
        let lease = EpochLease::default();
        let h = lease.holder_for_campaign("n1").unwrap();
        assert!(lease.won(&h, 9));
        assert_eq!(lease.take_held(), Some((Some(h), 9)));
        assert_eq!(lease.take_held(), None);
    }
}
