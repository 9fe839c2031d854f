//! The one elector of the polling backends (pg-lease, redis and redis-naive, sharded raft):
//! [`PollingElector`], written once over a narrow [`LeaseStore`] that each backend implements
//! with its own requests (its SQL, its Lua scripts, its requests to the raft leader).
//!
//! A polling store keeps one lease record per election, named by a holder id and numbered by an
//! epoch (the fencing token), and judges expiry itself. None of them queues waiters: a campaign
//! polls `acquire` every jittered retry interval until it wins. What the elector adds to the
//! store, once for all three:
//! - the candidacy (`EpochLease`): a holder id made before the first acquisition is sent and
//!   kept across failed or dropped campaigns, because such an acquisition may have landed unseen
//!   and `close` must still be able to withdraw it;
//! - a win counts only if the candidacy was not closed while the request was in flight;
//!   otherwise what was granted is released at once, not left to hold the seat for a lease;
//! - renewals go through the node's `RenewBatch`: one round trip for all of its shards;
//! - a campaign's wait between polls is a `CampaignWake`, which the failure detector's
//!   takeover cuts short instead of restarting the campaign (`experiments/FINDINGS.md`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rand::Rng;

use super::epoch_lease::EpochLease;
use super::renew_batch::{RenewBatch, Renewed};
use super::{
    BackendKind, DeadHolderExpiry, Elector, ElectorError, ElectorResult, FenceToken, Grant,
    LeaderInfo, Win,
};
use crate::config::NodeConfig;

/// Why a [`LeaseStore`] request failed. The elector reports either as
/// [`ElectorError::Unavailable`], with the same text: the caller may retry.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached, did not answer within the request timeout, or answered
    /// with an error.
    #[error("{0}")]
    Unavailable(String),
    /// The store answered what its protocol does not allow: an answer of the wrong kind, or a
    /// counter that is not a usable fencing token.
    #[error("{0}")]
    Invalid(String),
}

impl From<StoreError> for ElectorError {
    fn from(e: StoreError) -> ElectorError {
        match e {
            StoreError::Unavailable(m) | StoreError::Invalid(m) => ElectorError::Unavailable(m),
        }
    }
}

/// A store's counter as a fencing token, checked as [`FenceToken::checked`] checks it.
pub(crate) fn checked_token<T>(what: &str, value: T) -> Result<FenceToken, StoreError>
where
    T: TryInto<i64> + Copy + std::fmt::Display,
{
    FenceToken::checked(what, value).map_err(|e| match e {
        ElectorError::Unavailable(m) => StoreError::Invalid(m),
        other => StoreError::Invalid(other.to_string()),
    })
}

/// What one acquisition attempt found.
#[derive(Clone, Copy, Debug)]
pub enum Poll {
    /// The lease is this candidacy's now, at `token` (its epoch), for `ttl` from the send.
    Won {
        /// The term's fencing token; its value is the epoch the elector records.
        token: FenceToken,
        /// How long the store keeps the lease from the request's send.
        ttl: Duration,
    },
    /// Another candidacy holds the lease.
    Held,
    /// No verdict this time (sharded raft while its group has no leader): poll again.
    Unanswered,
}

/// One held lease as a renewal batch carries it: whose shard (the slot of its store among the
/// node's), which candidacy holds it, at which epoch. A batch names a lease by all three, so an
/// answer about a shard's previous term is never taken for its current one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLease {
    /// The shard (its store's index among the node's stores).
    pub shard: u32,
    /// The candidacy's holder id.
    pub holder: String,
    /// The epoch held (the term's fencing token).
    pub epoch: i64,
}

/// The election name of each lease's shard, from the node's names in shard order.
#[cfg(any(feature = "pg-lease", feature = "redis"))]
pub(crate) fn election_names<'a>(
    names: &'a [String],
    leases: &[HeldLease],
) -> Result<Vec<&'a str>, StoreError> {
    leases
        .iter()
        .map(|l| {
            names
                .get(l.shard as usize)
                .map(String::as_str)
                .ok_or_else(|| {
                    StoreError::Invalid(format!(
                        "no election for shard {} of {}",
                        l.shard,
                        names.len()
                    ))
                })
        })
        .collect()
}

/// One election's lease in a store that judges expiry itself (see the module docs): single
/// requests, none of which loops or sleeps. Each request counts itself
/// ([`count_request`](crate::elector::count_request)) under the backend's own `op` names.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// The refusal of a campaign while a term is held ([`ElectorError::Unavailable`]).
    const ALREADY_HOLDING: &'static str = "campaign while already holding the lease";

    /// What a resignation naming a successor is refused as ([`ElectorError::Unsupported`]).
    const NO_SUCCESSOR: &'static str = "naming a successor";

    /// Which backend this store is.
    fn kind(&self) -> BackendKind;

    /// The text of [`ElectorError::LeaseLost`] when a renewal of `epoch` found the lease gone.
    fn lease_lost(&self, epoch: i64) -> String;

    /// How long a renewal keeps a lease, from the renewal's send, where the store grants
    /// other than the configured lease TTL (sharded raft: the raft leader's TTL, if shorter).
    fn renewed_ttl(&self) -> Option<Duration> {
        None
    }

    /// One acquisition attempt for `holder` (a lease already naming `holder`, whose grant's
    /// answer was lost, is re-taken at once with a new epoch).
    async fn acquire(&self, holder: &str) -> Result<Poll, StoreError>;

    /// One round trip: extends every lease of `leases` (any of the node's shards') that still
    /// holds and has not run out; says which were extended, in order.
    async fn renew_all(&self, leases: Vec<HeldLease>) -> Result<Vec<bool>, StoreError>;

    /// Ends `holder`'s lease at `epoch` (at any epoch with `None`), if it still holds it.
    async fn release(&self, holder: &str, epoch: Option<i64>) -> Result<(), StoreError>;

    /// Ends the lease if a candidacy of node `dead` holds it (a compare-and-delete in the
    /// store); whether it did.
    async fn expire_dead(&self, dead: &str) -> Result<bool, StoreError>;

    /// Whether `holder` still holds the lease at `epoch` and it has not run out, judged by the
    /// store now.
    async fn confirm(&self, holder: &str, epoch: i64) -> Result<bool, StoreError>;

    /// Who holds the lease (a read the node's shards may share).
    async fn leader(&self) -> Result<Option<LeaderInfo>, StoreError>;
}

/// A polling campaign's wait between polls, which
/// [`Elector::wake_campaign`](crate::elector::Elector::wake_campaign) cuts short: the detector's
/// takeover wakes the campaign instead of restarting it, so an `acquire` already at the store
/// is never dropped for a closed candidacy (`experiments/FINDINGS.md`). A wake given while no
/// campaign waits is kept for the next wait.
#[derive(Default)]
pub(crate) struct CampaignWake(tokio::sync::Notify);

impl CampaignWake {
    /// Ends the current (or the next) [`CampaignWake::nap`] now.
    pub(crate) fn wake(&self) {
        self.0.notify_one();
    }

    /// Waits `d`, or less if woken.
    pub(crate) async fn nap(&self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.0.notified() => {}
        }
    }
}

/// `retry`, jittered by ±50 % so that waiters do not poll in step.
fn jittered(retry: Duration) -> Duration {
    let ms = retry.as_millis().max(2) as u64;
    Duration::from_millis(rand::thread_rng().gen_range(ms / 2..=ms + ms / 2))
}

/// A node's stores, one per shard, before they become electors ([`Shards::electors`]).
pub struct Shards<S> {
    stores: Vec<S>,
    node_id: String,
    ttl: Duration,
    renew_interval: Duration,
    retry: Duration,
}

impl<S: LeaseStore> Shards<S> {
    /// The stores of `cfg`'s node's shards (in shard order), renewed every renew interval and
    /// polled every retry interval (jittered).
    pub(crate) fn new(stores: Vec<S>, cfg: &NodeConfig) -> Shards<S> {
        Shards {
            stores,
            node_id: cfg.node_id.clone(),
            ttl: cfg.lease_ttl(),
            renew_interval: cfg.renew_interval(),
            retry: cfg.retry_interval(),
        }
    }

    /// Each store wrapped by `wrap` (a test's store that delays answers, say).
    pub fn map<T: LeaseStore>(self, wrap: impl FnMut(S) -> T) -> Shards<T> {
        Shards {
            stores: self.stores.into_iter().map(wrap).collect(),
            node_id: self.node_id,
            ttl: self.ttl,
            renew_interval: self.renew_interval,
            retry: self.retry,
        }
    }

    /// One elector per shard, all renewing through one `RenewBatch`.
    pub fn electors(self) -> Vec<PollingElector<S>> {
        let batch = Arc::new(RenewBatch::new(self.renew_interval));
        (0u32..)
            .zip(self.stores)
            .map(|(shard, store)| PollingElector {
                store,
                shard,
                node_id: self.node_id.clone(),
                ttl: self.ttl,
                retry: self.retry,
                batch: batch.clone(),
                lease: EpochLease::default(),
                wake: CampaignWake::default(),
            })
            .collect()
    }
}

/// The elector of one shard on a polling store (see the module docs).
pub struct PollingElector<S: LeaseStore> {
    store: S,
    /// This elector's shard: its slot in the node's renewal batch.
    shard: u32,
    node_id: String,
    /// The configured lease TTL: what a renewal grants unless the store says otherwise.
    ttl: Duration,
    retry: Duration,
    /// The node's coalesced renewals, shared by its shards.
    batch: Arc<RenewBatch<HeldLease>>,
    /// This elector's candidacy: its holder id and, while leading, its epoch.
    lease: EpochLease,
    /// Cuts a waiting campaign's poll interval short ([`Elector::wake_campaign`]).
    wake: CampaignWake,
}

impl<S: LeaseStore> PollingElector<S> {
    /// The store this elector campaigns on.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// A granted acquisition: the term, unless the candidacy was closed while the request was
    /// in flight. Then close() did not see this grant, so it is released here, at once: left
    /// alone, it would hold the seat for a whole lease with nobody renewing it.
    async fn claim(
        &self,
        holder: &str,
        token: FenceToken,
        grant: Grant,
        vacant_since: Instant,
    ) -> ElectorResult<Win> {
        if !self.lease.won(holder, token.0) {
            let _ = self.store.release(holder, Some(token.0)).await;
            return Err(ElectorError::LeaseLost(
                "candidacy withdrawn during campaign".into(),
            ));
        }
        Ok(Win {
            token,
            grant,
            vacant_since: Some(vacant_since),
        })
    }

    /// Releases `holder`'s lease, if there is a holder.
    async fn release(&self, holder: Option<String>, epoch: Option<i64>) -> ElectorResult<()> {
        match holder {
            Some(h) => Ok(self.store.release(&h, epoch).await?),
            None => Ok(()),
        }
    }
}

#[async_trait]
impl<S: LeaseStore> Elector for PollingElector<S> {
    fn kind(&self) -> BackendKind {
        self.store.kind()
    }

    async fn campaign(&self) -> ElectorResult<Win> {
        // A failed or dropped campaign's holder id is reused: its acquisition may have landed,
        // and close() must still be able to release it (and a retry re-takes it at once).
        let holder = self
            .lease
            .holder_for_campaign(&self.node_id)
            .ok_or_else(|| ElectorError::Unavailable(S::ALREADY_HOLDING.into()))?;
        let mut seen_held_at: Option<Instant> = None;
        loop {
            let sent_at = Instant::now();
            match self.store.acquire(&holder).await? {
                Poll::Won { token, ttl } => {
                    let grant = Grant { sent_at, ttl };
                    let vacant_since = seen_held_at.unwrap_or(sent_at);
                    return self.claim(&holder, token, grant, vacant_since).await;
                }
                Poll::Held => seen_held_at = Some(sent_at),
                Poll::Unanswered => {}
            }
            self.wake.nap(jittered(self.retry)).await;
        }
    }

    async fn renew(&self) -> ElectorResult<Option<Grant>> {
        let Some((holder, epoch)) = self.lease.held() else {
            return Ok(None); // waiting: the store's record is the only state, nothing to keep alive
        };
        let lease = HeldLease {
            shard: self.shard,
            holder,
            epoch,
        };
        let renewed = self
            .batch
            .renew(self.shard, lease, |leases| self.store.renew_all(leases))
            .await?;
        if let Renewed::At(sent_at) = renewed {
            return Ok(Some(Grant {
                sent_at,
                ttl: self.store.renewed_ttl().unwrap_or(self.ttl),
            }));
        }
        self.lease.lost(epoch);
        Err(ElectorError::LeaseLost(self.store.lease_lost(epoch)))
    }

    async fn resign(&self, successor: Option<&str>) -> ElectorResult<()> {
        if successor.is_some() {
            return Err(ElectorError::Unsupported {
                backend: self.store.kind(),
                what: S::NO_SUCCESSOR,
            });
        }
        let Some((holder, epoch)) = self.lease.take_held() else {
            return Ok(());
        };
        self.batch.forget(self.shard).await;
        self.release(holder, Some(epoch)).await
    }

    async fn leader(&self) -> ElectorResult<Option<LeaderInfo>> {
        Ok(self.store.leader().await?)
    }

    /// A compare on the store's record: ours while it names this candidacy at `token`'s epoch
    /// and has not run out, judged by the store.
    async fn confirm_leadership(&self, _me: &str, token: FenceToken) -> ElectorResult<bool> {
        let Some(holder) = self.lease.holder_at(token.0) else {
            return Ok(false);
        };
        Ok(self.store.confirm(&holder, token.0).await?)
    }

    /// A waiting campaign polls the store: it is woken to see the seat free now.
    async fn expire_dead_holder(&self, dead: &str) -> ElectorResult<DeadHolderExpiry> {
        if dead == self.node_id {
            return Ok(DeadHolderExpiry::NotEnded);
        }
        Ok(if self.store.expire_dead(dead).await? {
            DeadHolderExpiry::EndedCampaignPolls
        } else {
            DeadHolderExpiry::NotEnded
        })
    }

    fn wake_campaign(&self) {
        self.wake.wake();
    }

    async fn close(&self) -> ElectorResult<()> {
        let holder = self.lease.take_for_close();
        self.batch.forget(self.shard).await;
        // Any epoch: a dropped campaign's acquisition may have landed unseen.
        self.release(holder, None).await
    }
}
