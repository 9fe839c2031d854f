//! Sharded leadership on raft (`[shards] count = K > 1`): **one raft group per fleet** (the one
//! that already exists), whose replicated state machine also holds a **shard lease table**. The
//! shard electors on every node are clients of that table exactly as pg-lease's electors are
//! clients of their lease rows: the raft group is their store, and its leader is the one that
//! judges expiry.
//!
//! # The table
//!
//! Per shard: the holder (a candidacy id, the node, its published [`LeaderInfo`]) and the
//! **epoch**, the shard's fencing token. Two commands go through the raft log ([`ShardCmd`]):
//!
//! * `Grant { shard, holder, expect, term }`: applied only if the shard's epoch is still
//!   `expect` (what the raft leader judged free or expired) *and* the entry was appended in
//!   `term`, the raft term in which that judgement was made. The new epoch is
//!   `max(epoch + 1, term)`: strictly increasing per shard (every node applies the same log in
//!   the same order), and never below the raft term, so growing a raft fleet from K = 1 (whose
//!   tokens are raft terms) keeps shard 0's fence row moving forward.
//! * `Release { shard, holder, epoch? }`: ends the holder's lease if it still holds it.
//!
//! **Renewals are not log entries.** Expiry cannot be replicated (it is a clock reading, and
//! nodes' clocks differ), so the raft *leader* keeps it in memory, on its own monotonic clock:
//! when it last heard each holder renew (`Leases`). Renewals cost one request to the leader
//! per node per renew interval, for all of the node's shards together
//! (`backends::renew_batch::RenewBatch`), and one ReadIndex round there, never a write.
//!
//! # Requests (`ShardRequest`)
//!
//! Every request goes to the raft leader: in process when this node leads raft, else as one
//! signed `POST /peer/shard` over the peer transport (`network::signed_post`,
//! authenticated like every other peer RPC, [`super::auth`]). The leader answers:
//!
//! * `acquire` — after a ReadIndex round (it still leads, and its state machine has applied
//!   everything committed before), grant if the shard is free, held by this very candidacy (a
//!   grant whose answer was lost), or **expired**: not heard from for a full TTL (below). The
//!   grant is proposed with the epoch it judged, so a concurrent grant makes it fail.
//! * `renew` — after a ReadIndex round, for each lease `(shard, candidacy, epoch)` of the batch:
//!   extended iff the table still names it and it has not expired; then "heard" is set to when
//!   the request arrived. A lapsed lease is never revived.
//! * `confirm` — the same check without extending (a `quorum` read's `confirm_leadership`).
//! * `release` — a `Release` entry.
//! * `leaders` — the holder of every unexpired lease (routing and placement only; no safety
//!   decision uses it). One answer serves all of a node's shards.
//!
//! # Expiry without trusting wall clocks
//!
//! The leader judges a held lease expired when `now − last ≥ TTL`, on its monotonic clock, where
//! `last = max(leader_since, applied_at, heard)`:
//!
//! * `heard`: when the leader received the holder's newest successful renewal of *that* epoch;
//! * `applied_at`: when this node applied the grant (on the granting leader: after the commit,
//!   so after the holder sent its request);
//! * `leader_since`: when this node first served a request as leader of the current raft term.
//!
//! **A new raft leader treats every held shard as renewed the moment it became leader** (the
//! `leader_since` term), so it waits a full TTL before granting a held shard to anyone else. Why
//! that is enough: the holder counts its lease from when it *sent* the request an earlier leader
//! acknowledged (the node's deadline is `sent_at + ttl − margin`, through the clock-rate bound,
//! as on every backend). That leader acknowledged only after a ReadIndex round, i.e. after a
//! quorum accepted its term *after* the request arrived. Any later leader needed a quorum's
//! votes, and one voter of that quorum accepted the old term after the request arrived and so
//! voted for the new one later still: the new leader began after `sent_at`, and waits a TTL from
//! then. Within one term, `heard`/`applied_at` are at or after every acknowledged request's
//! send, and a judgement once made (`now ≥ last + TTL`) stays true, so a renewal arriving after
//! a grant was proposed is refused. A grant judged in one term and appended in another (the
//! node lost and regained raft leadership in between) is refused by its `term` check, and a
//! stale leader's grant can only take effect if a later leader commits it, which that leader
//! applies (ReadIndex) before it serves anything — so it refuses the old holder's renewals.
//!
//! # What this does not give
//!
//! * A raft leader change pauses every shard's renewals for the election (≈ 300 ms with the
//!   default `150-250` timeouts); with a lease shorter than that every holder demotes. Sharded
//!   raft therefore grants `lease_ttl_ms` itself (not capped by the election timeout: the cap is
//!   the raft leader's own lease bound, unused here), and `config/raft-shards.toml` uses the
//!   lease backends' 3 s / 800 ms / 250 ms. A kill -9 of a shard holder leaves its shards dark for
//!   a lease, as on any lease backend; the raft leader's own death adds its election.
//! * No named successor (`/stepdown?shard=S&to=NODE`): like the lease backends, a hand-over is a
//!   release that the new owner, already campaigning, claims at once.
//! * Replays: peer requests are authenticated, with no nonce cache ([`super::auth`]). A replay
//!   inside the 30 s window can at most re-grant a free shard to a candidacy that no longer
//!   campaigns, or renew a lease its holder still holds: shards dark for a lease, never two
//!   holders (the table's checks hold whoever sends the request).
//! * A wiped raft state directory on a majority loses the table (raft's own safety assumption).
//!   Epochs then restart from the raft term and the fence refuses tokens at or below what it has
//!   seen: safe, but shards stay dark until the term passes them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use openraft::async_runtime::WatchReceiver;

use super::client::PeerClient;
use super::lease_server::LeaseServer;
use super::lease_table::*;
use super::network::{signed_post, RaftHandleSource};
use super::shard_wire::*;
use super::RaftElector;
use crate::backends::polling::{
    checked_token, HeldLease, LeaseStore, Poll, PollingElector, Shards, StoreError,
};
use crate::backends::{count_request, BackendKind, ElectorError, ElectorResult, LeaderInfo};
use crate::config::NodeConfig;

// ---------------------------------------------------------------------------------------------
// A node's side: one group per node, one elector per shard
// ---------------------------------------------------------------------------------------------

fn unavailable(e: impl fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("raft shards: {e}"))
}

/// An answer of the wrong kind to `what`.
fn unexpected(what: &str, answer: ShardAnswer) -> StoreError {
    StoreError::Invalid(format!(
        "raft shards: unexpected answer to {what}: {answer:?}"
    ))
}

/// Who leads each shard, from the newest `leaders` answer, or why there was none.
struct View {
    at: Option<Instant>,
    leaders: Result<Arc<BTreeMap<u32, LeaderInfo>>, String>,
}

/// What a node's shard stores share: its raft member, the way to the raft leader and the
/// leader view.
pub(crate) struct ShardGroup {
    raft: RaftElector,
    server: Arc<LeaseServer>,
    client: PeerClient,
    node_id: String,
    info: String,
    /// The least of this node's TTL and every TTL a raft leader said it grants, in ms.
    granted_ms: AtomicU64,
    retry: Duration,
    timeout: Duration,
    view: tokio::sync::Mutex<View>,
}

impl ShardGroup {
    /// The grant a leader's answer gives: the lesser of its TTL and ours (a fleet whose nodes
    /// disagree on `lease_ttl_ms` is judged by the shorter).
    fn grant_ttl(&self, leader_ms: u64) -> Duration {
        let before = self.granted_ms.fetch_min(leader_ms, Ordering::Relaxed);
        if leader_ms < before {
            tracing::warn!(
                node = %self.node_id,
                leader_ttl_ms = leader_ms,
                own_ttl_ms = before,
                "the raft leader grants shard leases shorter than this node's lease_ttl_ms: using its TTL"
            );
        }
        Duration::from_millis(self.granted_ms.load(Ordering::Relaxed))
    }

    /// Sends `req` to the raft leader (in process when that is this node), bounded in time.
    async fn call(&self, op: &'static str, req: ShardRequest) -> Result<ShardAnswer, StoreError> {
        let s = &self.raft.shared;
        let raft = s
            .current()
            .ok_or_else(|| unavailable("raft is not running"))?;
        let leader = raft.metrics().borrow_watched().current_leader;
        let answer = match leader {
            None => return Err(unavailable("no raft leader")),
            Some(id) if id == s.me => self.server.handle(req, Instant::now()).await,
            Some(id) => {
                let addr = s
                    .peers
                    .peer(id)
                    .map(|p| p.peer_addr.clone())
                    .ok_or_else(|| unavailable(format!("raft leader {id} is not in raft.peers")))?;
                count_request(BackendKind::Raft, op);
                let body = serde_json::to_vec(&req).map_err(unavailable)?;
                let bytes = signed_post(
                    &self.client,
                    &s.auth,
                    &s.faults,
                    &s.node_id,
                    &addr,
                    "shard",
                    body,
                    self.timeout,
                )
                .await
                .map_err(unavailable)?;
                serde_json::from_slice(&bytes).map_err(unavailable)?
            }
        };
        match answer {
            ShardAnswer::NotLeader { .. } => {
                Err(unavailable("asked a node that no longer leads raft"))
            }
            ShardAnswer::Unavailable(why) => Err(unavailable(why)),
            a => Ok(a),
        }
    }

    /// One round trip renews every lease of `leases`; says which were extended.
    async fn renew_all(&self, leases: Vec<(u32, String, i64)>) -> Result<Vec<bool>, StoreError> {
        let n = leases.len();
        match self
            .call("shard-renew", ShardRequest::Renew { leases })
            .await?
        {
            ShardAnswer::Renewed { ok, ttl_ms } if ok.len() == n => {
                self.grant_ttl(ttl_ms);
                Ok(ok)
            }
            other => Err(unexpected("renew", other)),
        }
    }

    /// Who leads each shard: one `leaders` request per retry interval for all of the node's
    /// shards (a failure, too, is reused for that long).
    async fn leaders(&self) -> Result<Arc<BTreeMap<u32, LeaderInfo>>, StoreError> {
        let mut v = self.view.lock().await;
        if v.at.is_some_and(|at| at.elapsed() < self.retry) {
            return v.leaders.clone().map_err(unavailable);
        }
        let at = Instant::now();
        let got = match self.call("shard-leaders", ShardRequest::Leaders).await {
            Ok(ShardAnswer::Leaders(list)) => Ok(Arc::new(
                list.into_iter()
                    .map(|(s, info)| (s, LeaderInfo::decode(info.as_bytes())))
                    .collect(),
            )),
            Ok(other) => Err(format!("unexpected answer to leaders: {other:?}")),
            Err(e) => Err(e.to_string()),
        };
        *v = View {
            at: Some(at),
            leaders: got.clone(),
        };
        got.map_err(unavailable)
    }

    /// Ends `shard`'s lease if node `dead` holds it; whether it did.
    async fn expire_dead(&self, shard: u32, dead: &str) -> Result<bool, StoreError> {
        let req = ShardRequest::ExpireDead {
            shard,
            node: dead.to_owned(),
        };
        match self.call("expire_dead", req).await? {
            ShardAnswer::Released(ended) => Ok(ended),
            other => Err(unexpected("expire_dead", other)),
        }
    }

    async fn release(
        &self,
        shard: u32,
        holder: String,
        epoch: Option<i64>,
    ) -> Result<(), StoreError> {
        let req = ShardRequest::Release {
            shard,
            holder,
            epoch,
        };
        self.call("shard-release", req).await.map(drop)
    }
}

impl Drop for ShardGroup {
    /// The node's raft member stops with its last shard elector.
    fn drop(&mut self) {
        let taken = self
            .raft
            .shared
            .raft
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let (Some(raft), Ok(rt)) = (taken, tokio::runtime::Handle::try_current()) {
            rt.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(5), raft.shutdown()).await;
            });
        }
    }
}

/// One shard's elector on a sharded raft node (see the module docs): the polling elector on
/// the shard's lease in the raft group's table.
pub type RaftShardElector = PollingElector<RaftShardStore>;

/// One shard's lease in the raft group's table: the [`LeaseStore`] of [`RaftShardElector`].
pub struct RaftShardStore {
    group: Arc<ShardGroup>,
    shard: u32,
}

/// Starts this node's raft member (serving the shard lease table to its peers) and returns one
/// elector per shard config (`NodeConfig::for_shard`), all sharing it.
pub async fn connect_shards(cfgs: &[NodeConfig]) -> ElectorResult<Vec<RaftShardElector>> {
    Ok(stores(cfgs).await?.electors())
}

/// Starts this node's raft member and returns one store per shard config (see
/// [`connect_shards`]).
pub async fn stores(cfgs: &[NodeConfig]) -> ElectorResult<Shards<RaftShardStore>> {
    let cfg = cfgs
        .first()
        .ok_or_else(|| ElectorError::Config("no shard to elect for".into()))?;
    let ttl = cfg.lease_ttl();
    let (_, emax) = cfg
        .election_timeout_range_ms()
        .map_err(|e| ElectorError::Config(e.to_string()))?;
    if ttl < Duration::from_millis(2 * emax) {
        tracing::warn!(
            lease_ttl_ms = cfg.lease_ttl_ms,
            election_timeout_max_ms = emax,
            "sharded raft: a shard lease shorter than twice the election timeout does not outlive a raft leader change, so every shard's holder demotes when the raft leader changes; config/raft-shards.toml uses 3000 ms"
        );
    }
    // A request must be answered well inside the lease, or its grant is worth little.
    let timeout = (ttl / 3).clamp(Duration::from_millis(200), Duration::from_secs(2));
    let raft = RaftElector::start_sharded(cfg, ttl, timeout).await?;
    let server = raft
        .lease
        .clone()
        .ok_or_else(|| ElectorError::Config("raft started without its shard table".into()))?;
    let me = LeaderInfo {
        node_id: cfg.node_id.clone(),
        http_addr: cfg.advertise_addr.clone(),
    };
    let group = Arc::new(ShardGroup {
        raft,
        server,
        client: PeerClient::new(),
        node_id: cfg.node_id.clone(),
        info: String::from_utf8(me.encode()).expect("JSON is UTF-8"),
        granted_ms: AtomicU64::new(ttl.as_millis() as u64),
        retry: cfg.retry_interval(),
        timeout,
        view: tokio::sync::Mutex::new(View {
            at: None,
            leaders: Err("not read yet".into()),
        }),
    });
    let stores = (0u32..)
        .zip(cfgs)
        .map(|(shard, _)| RaftShardStore {
            group: group.clone(),
            shard,
        })
        .collect();
    Ok(Shards::new(stores, cfg))
}

impl RaftShardElector {
    /// The raft group this node's shards share (tests and diagnostics).
    pub fn raft(&self) -> &RaftElector {
        &self.store().group.raft
    }
}

#[async_trait]
impl LeaseStore for RaftShardStore {
    const ALREADY_HOLDING: &'static str = "raft shards: campaign while already holding the lease";
    const NO_SUCCESSOR: &'static str =
        "naming a successor for one shard (a hand-over is a release)";

    fn kind(&self) -> BackendKind {
        BackendKind::Raft
    }

    fn lease_lost(&self, epoch: i64) -> String {
        format!(
            "shard {} lease epoch {epoch} expired or taken over",
            self.shard
        )
    }

    /// The least of this node's TTL and every TTL a raft leader said it grants.
    fn renewed_ttl(&self) -> Option<Duration> {
        Some(Duration::from_millis(
            self.group.granted_ms.load(Ordering::Relaxed),
        ))
    }

    /// Any answer but a grant is a held shard; no answer (no raft leader yet, or it is
    /// changing) is asked again.
    async fn acquire(&self, holder: &str) -> Result<Poll, StoreError> {
        let req = ShardRequest::Acquire {
            shard: self.shard,
            holder: Holder {
                id: holder.to_owned(),
                node: self.group.node_id.clone(),
                info: self.group.info.clone(),
            },
        };
        match self.group.call("shard-acquire", req).await {
            Ok(ShardAnswer::Granted { epoch, ttl_ms }) => Ok(Poll::Won {
                ttl: self.group.grant_ttl(ttl_ms),
                token: checked_token("shard lease epoch", epoch)?,
            }),
            Ok(_) => Ok(Poll::Held),
            Err(e) => {
                tracing::debug!(shard = self.shard, error = %e, "shard acquire");
                Ok(Poll::Unanswered)
            }
        }
    }

    async fn renew_all(&self, leases: Vec<HeldLease>) -> Result<Vec<bool>, StoreError> {
        let leases = leases
            .into_iter()
            .map(|l| (l.shard, l.holder, l.epoch))
            .collect();
        self.group.renew_all(leases).await
    }

    async fn release(&self, holder: &str, epoch: Option<i64>) -> Result<(), StoreError> {
        self.group
            .release(self.shard, holder.to_owned(), epoch)
            .await
    }

    /// A `Release` of the table's holder of this shard if it is on node `dead`, at the epoch
    /// the raft leader sees (a log entry, like every release).
    async fn expire_dead(&self, dead: &str) -> Result<bool, StoreError> {
        let ended = self.group.expire_dead(self.shard, dead).await?;
        if ended {
            tracing::info!(
                shard = self.shard,
                dead,
                "ended a dead holder's shard lease"
            );
        }
        Ok(ended)
    }

    /// A ReadIndex round on the raft leader, then a compare on the table: ours while it names
    /// this candidacy at `epoch` and the leader has not judged it expired.
    async fn confirm(&self, holder: &str, epoch: i64) -> Result<bool, StoreError> {
        let req = ShardRequest::Confirm {
            shard: self.shard,
            holder: holder.to_owned(),
            epoch,
        };
        match self.group.call("shard-confirm", req).await? {
            ShardAnswer::Confirmed(b) => Ok(b),
            other => Err(unexpected("confirm", other)),
        }
    }

    async fn leader(&self) -> Result<Option<LeaderInfo>, StoreError> {
        Ok(self.group.leaders().await?.get(&self.shard).cloned())
    }
}
