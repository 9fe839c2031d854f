//! One round trip renews every lease a node's shards hold, for the backends whose leases are
//! independent records (pg-lease rows, Redis keys, the rows of sharded raft's lease table).
//!
//! Each shard's elector keeps its own renew schedule (the loop in `crate::actors::elector` is
//! unchanged). When a shard's renewal is due, [`RenewBatch::renew`] either reuses the node's
//! newest batch or sends one new batch for every lease the node's shards hold. It reuses the
//! newest batch when another shard sent it, it renewed exactly this shard's lease, it is younger
//! than one renew interval (`interval`), and it moves this shard's grant on by at least half an
//! interval. The last condition is judged against the shard's own previous grant, not against
//! the time the shard's call got the lock, so a slow runtime (hundreds of shards on a loaded
//! machine, renewals queued on the lock) still reuses instead of sending more. A shard never
//! reuses a batch it sent itself: each call of a lone shard is a round trip, exactly as before
//! batching. The grant a shard gets carries the batch's send time, so its deadline is still
//! counted from a request that really extended its lease. A node sends about one batch per renew
//! interval, whatever the number of shards.
//!
//! [`SharedLeaderRead`] does the same for the observe loops' "who leads?" polls (zk: their quiet
//! re-checks of the lowest candidacy znode).
//!
//! A lease is named by its value (`L`: the row's name, holder and epoch; the key and its
//! candidacy), never by the shard alone, so a batch that ran with a shard's *previous* lease
//! cannot be taken as the answer for its current one.

// etcd shares only the leader reads (its renewals ride on one lease, see `etcd.rs`); sharded
// raft only the renewals (its leader reads are one request for all shards, `raft/shards.rs`).
#![cfg_attr(not(any(feature = "pg-lease", feature = "redis")), allow(dead_code))]

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

#[cfg(test)]
use super::ElectorResult;
use super::LeaderInfo;

/// What one batch said of one lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// Extended, by the request sent at this instant.
    At(Instant),
    /// Not extended: expired or taken over. The shard's term is over.
    Lost,
}

struct Batch<L> {
    /// Every lease this node's shards hold, by shard: included in each batch.
    held: BTreeMap<u32, L>,
    /// When each shard's newest grant was sent (its own batch or one it reused).
    granted: BTreeMap<u32, Instant>,
    /// The newest batch: which shard sent it, when, and what it said of each lease it carried.
    newest: Option<Newest<L>>,
}

struct Newest<L> {
    sent_by: u32,
    sent_at: Instant,
    said: Vec<(u32, L, bool)>,
}

/// The node's coalesced renewals (see the module docs). Shared by its shards' electors.
pub(crate) struct RenewBatch<L> {
    interval: Duration,
    batch: Mutex<Batch<L>>,
}

impl<L: Clone + PartialEq + Send> RenewBatch<L> {
    /// `interval`: the renew interval (see the module docs for how it bounds reuse).
    pub(crate) fn new(interval: Duration) -> RenewBatch<L> {
        RenewBatch {
            interval,
            batch: Mutex::new(Batch {
                held: BTreeMap::new(),
                granted: BTreeMap::new(),
                newest: None,
            }),
        }
    }

    /// Renews `shard`'s `lease`, with every other lease the node holds when a batch is due.
    /// `send` gets the leases of one batch and answers, for each, whether it was extended; it is
    /// one round trip. Holding the lock across it makes renewals that arrive meanwhile wait and
    /// then reuse its answer, instead of sending their own.
    pub(crate) async fn renew<F, Fut, E>(&self, shard: u32, lease: L, send: F) -> Result<Renewed, E>
    where
        F: FnOnce(Vec<L>) -> Fut,
        Fut: Future<Output = Result<Vec<bool>, E>>,
    {
        let mut b = self.batch.lock().await;
        if let Some(newest) = &b.newest {
            let sent_at = newest.sent_at;
            let moves_on = b
                .granted
                .get(&shard)
                .is_none_or(|prev| sent_at >= *prev + self.interval / 2);
            let fresh = newest.sent_by != shard && sent_at.elapsed() < self.interval && moves_on;
            let said = newest
                .said
                .iter()
                .find(|(s, l, _)| *s == shard && *l == lease)
                .map(|(_, _, ok)| *ok);
            match (fresh, said) {
                (true, Some(true)) => {
                    b.granted.insert(shard, sent_at);
                    return Ok(Renewed::At(sent_at));
                }
                // A lost lease stays lost, however old the batch that found it.
                (_, Some(false)) => {
                    b.held.remove(&shard);
                    b.granted.remove(&shard);
                    return Ok(Renewed::Lost);
                }
                _ => {}
            }
        }
        b.held.insert(shard, lease.clone());
        let carried: Vec<(u32, L)> = b.held.iter().map(|(s, l)| (*s, l.clone())).collect();
        let sent_at = Instant::now();
        let answers = send(carried.iter().map(|(_, l)| l.clone()).collect()).await?;
        let outcomes: Vec<(u32, L, bool)> = carried
            .into_iter()
            .zip(answers)
            .map(|((s, l), ok)| (s, l, ok))
            .collect();
        for (s, l, ok) in &outcomes {
            if !ok && b.held.get(s) == Some(l) {
                b.held.remove(s);
                b.granted.remove(s);
            }
        }
        let mine = outcomes
            .iter()
            .find(|(s, l, _)| *s == shard && *l == lease)
            .is_some_and(|(_, _, ok)| *ok);
        if mine {
            b.granted.insert(shard, sent_at);
        }
        b.newest = Some(Newest {
            sent_by: shard,
            sent_at,
            said: outcomes,
        });
        Ok(if mine {
            Renewed::At(sent_at)
        } else {
            Renewed::Lost
        })
    }

    /// `shard` holds no lease any more (resigned, closed): later batches leave it out.
    pub(crate) async fn forget(&self, shard: u32) {
        let mut b = self.batch.lock().await;
        b.held.remove(&shard);
        b.granted.remove(&shard);
    }
}

/// What one shared read saw of each of a node's elections, by election name: who leads it
/// (`LeaderInfo`: etcd, pg-lease, redis), or zk's lowest candidacy znode (its name).
pub(crate) type Leaders<V = LeaderInfo> = std::sync::Arc<BTreeMap<String, V>>;

/// One backend read answers every shard's "who leads?" (the observe loop's polls), the way
/// [`RenewBatch`] answers their renewals: a shard reuses the newest read if another shard made
/// it less than `reuse_for` ago, else reads every election in one round trip. A lone shard reads
/// each time, as before. Leader reads only route clients and feed placement; no safety decision
/// rests on them (a term is confirmed by `confirm_leadership`, per shard).
pub(crate) struct SharedLeaderRead<V = LeaderInfo> {
    reuse_for: Duration,
    /// Every election name of the node's shards, in shard order.
    pub(crate) names: Vec<String>,
    newest: Mutex<Option<(u32, Instant, Leaders<V>)>>,
}

impl<V: Clone> SharedLeaderRead<V> {
    pub(crate) fn new(reuse_for: Duration, names: Vec<String>) -> SharedLeaderRead<V> {
        SharedLeaderRead {
            reuse_for,
            names,
            newest: Mutex::new(None),
        }
    }

    /// What a fresh shared read saw of `name` (shard `shard`'s election), or what `fetch` sees:
    /// it reads all of [`SharedLeaderRead::names`] at once (an election it leaves out has no
    /// leader).
    pub(crate) async fn leader<F, Fut, E>(
        &self,
        shard: u32,
        name: &str,
        fetch: F,
    ) -> Result<Option<V>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<BTreeMap<String, V>, E>>,
    {
        let mut newest = self.newest.lock().await;
        if let Some((by, at, leaders)) = &*newest {
            if *by != shard && at.elapsed() < self.reuse_for {
                return Ok(leaders.get(name).cloned());
            }
        }
        let at = Instant::now();
        let leaders: Leaders<V> = std::sync::Arc::new(fetch().await?);
        let mine = leaders.get(name).cloned();
        *newest = Some((shard, at, leaders));
        Ok(mine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A backend whose leases named in `alive` are extended.
    async fn send_to(
        alive: &[&str],
        sent: &AtomicUsize,
        leases: Vec<String>,
    ) -> ElectorResult<Vec<bool>> {
        sent.fetch_add(1, Ordering::SeqCst);
        Ok(leases.iter().map(|l| alive.contains(&l.as_str())).collect())
    }

    /// The renew interval of these tests: batches a moment apart do not renew each other's
    /// shards (half an interval is required), batches `HALF` apart do.
    const INTERVAL: Duration = Duration::from_millis(400);
    const HALF: Duration = Duration::from_millis(220);

    #[tokio::test]
    async fn shards_renewing_together_share_one_round_trip() {
        let batch = Arc::new(RenewBatch::new(INTERVAL));
        let sent = AtomicUsize::new(0);
        let alive = ["a", "b", "c"];
        // a, b and c start one after the other: each sends (the others' batches did not carry
        // its lease yet, or move its grant on).
        for (s, l) in [(0, "a"), (1, "b"), (2, "c")] {
            batch
                .renew(s, l.to_string(), |ls| send_to(&alive, &sent, ls))
                .await
                .unwrap();
        }
        assert_eq!(sent.load(Ordering::SeqCst), 3);
        // Their next renewals, half an interval on: b sends one batch for all three, and a and
        // c take its answer.
        tokio::time::sleep(HALF).await;
        let mut grants = Vec::new();
        for (s, l) in [(1, "b"), (0, "a"), (2, "c")] {
            grants.push(
                batch
                    .renew(s, l.to_string(), |ls| send_to(&alive, &sent, ls))
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(sent.load(Ordering::SeqCst), 4);
        assert!(matches!(grants[0], Renewed::At(_)));
        assert_eq!(grants[0], grants[1]);
        assert_eq!(grants[1], grants[2]);
    }

    #[tokio::test]
    async fn a_lost_lease_is_lost_for_its_shard_only_and_a_new_lease_is_not_judged_by_it() {
        let batch = RenewBatch::new(INTERVAL);
        let sent = AtomicUsize::new(0);
        let alive = ["a1", "b1", "b2"];
        batch
            .renew(0, "a1".into(), |l| send_to(&alive, &sent, l))
            .await
            .unwrap();
        // b's lease "b0" is gone (expired): lost; a's is still renewed by the same batch.
        tokio::time::sleep(HALF).await;
        let b = batch
            .renew(1, "b0".into(), |l| send_to(&alive, &sent, l))
            .await
            .unwrap();
        assert_eq!(b, Renewed::Lost);
        let a = batch
            .renew(0, "a1".into(), |l| send_to(&alive, &sent, l))
            .await
            .unwrap();
        assert!(matches!(a, Renewed::At(_)));
        assert_eq!(sent.load(Ordering::SeqCst), 2, "a reused b's batch");
        // b wins again with a new lease: the old verdict does not apply to it.
        let b = batch
            .renew(1, "b2".into(), |l| send_to(&alive, &sent, l))
            .await
            .unwrap();
        assert!(matches!(b, Renewed::At(_)));
        assert_eq!(sent.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn one_read_answers_every_shard_but_never_the_shard_that_made_it() {
        let read = SharedLeaderRead::new(
            Duration::from_secs(10),
            vec!["e".into(), "e-shard-1".into()],
        );
        let reads = AtomicUsize::new(0);
        let fetch = || async {
            reads.fetch_add(1, Ordering::SeqCst);
            let who = LeaderInfo {
                node_id: "n2".into(),
                http_addr: None,
            };
            ElectorResult::Ok(BTreeMap::from([("e-shard-1".to_string(), who)]))
        };
        assert_eq!(read.leader(0, "e", fetch).await.unwrap(), None);
        let l = read.leader(1, "e-shard-1", fetch).await.unwrap();
        assert_eq!(l.map(|l| l.node_id).as_deref(), Some("n2"));
        assert_eq!(
            reads.load(Ordering::SeqCst),
            1,
            "shard 1 reused shard 0's read"
        );
        read.leader(0, "e", fetch).await.unwrap();
        assert_eq!(
            reads.load(Ordering::SeqCst),
            2,
            "shard 0 made the newest read: read again"
        );
    }

    #[tokio::test]
    async fn a_batch_is_reused_only_if_it_moves_the_shards_grant_on_by_half_an_interval() {
        let batch = RenewBatch::new(Duration::from_secs(10));
        let sent = AtomicUsize::new(0);
        let alive = ["a", "b"];
        batch
            .renew(0, "a".to_string(), |l| send_to(&alive, &sent, l))
            .await
            .unwrap();
        // b's first renewal sends (b was not in a's batch) and a reuses it...
        batch
            .renew(1, "b".to_string(), |l| send_to(&alive, &sent, l))
            .await
            .unwrap();
        assert_eq!(sent.load(Ordering::SeqCst), 2);
        // ... but only if it moves a's grant on by 5 s: it was sent a moment after a's own.
        batch
            .renew(0, "a".to_string(), |l| send_to(&alive, &sent, l))
            .await
            .unwrap();
        assert_eq!(
            sent.load(Ordering::SeqCst),
            3,
            "a batch a moment newer is not a renewal"
        );
    }

    #[tokio::test]
    async fn a_shard_never_reuses_its_own_batch() {
        let batch = RenewBatch::new(Duration::from_secs(10));
        let sent = AtomicUsize::new(0);
        for _ in 0..3 {
            batch
                .renew(0, "a".to_string(), |l| send_to(&["a"], &sent, l))
                .await
                .unwrap();
        }
        assert_eq!(
            sent.load(Ordering::SeqCst),
            3,
            "one shard: a round trip per renewal"
        );
    }

    #[tokio::test]
    async fn a_stale_batch_is_not_reused() {
        let batch = RenewBatch::new(Duration::from_millis(0));
        let sent = AtomicUsize::new(0);
        let alive = ["a"];
        for _ in 0..3 {
            batch
                .renew(0, "a".to_string(), |l| send_to(&alive, &sent, l))
                .await
                .unwrap();
        }
        assert_eq!(sent.load(Ordering::SeqCst), 3);
        batch.forget(0).await;
        batch
            .renew(1, "x".to_string(), |l| {
                assert_eq!(l, vec!["x".to_string()], "a forgotten lease is not carried");
                send_to(&alive, &sent, l)
            })
            .await
            .unwrap();
    }
}
