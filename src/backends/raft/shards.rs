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
//!   lease backends' 3 s / 1 s / 250 ms. A kill -9 of a shard holder leaves its shards dark for
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
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, LinearizableReadError, RaftError};
use openraft::{ReadPolicy, ServerState};
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::client::PeerClient;
use super::network::{signed_post, PeerRpcError, RaftHandleSource};
use super::storage::StateMachine;
use super::{RaftElector, RaftHandle};
use crate::backends::epoch_lease::EpochLease;
use crate::backends::renew_batch::{RenewBatch, Renewed};
use crate::backends::{
    count_request, BackendKind, DeadHolderExpiry, Elector, ElectorError, ElectorResult, FenceToken,
    Grant, LeaderInfo, Win,
};
use crate::config::NodeConfig;

// ---------------------------------------------------------------------------------------------
// The replicated table
// ---------------------------------------------------------------------------------------------

/// Who holds a shard's lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The candidacy: the node id and a random suffix, one per campaign of one elector (a
    /// restarted node is a new candidacy: its old lease must run out first).
    pub id: String,
    /// The node id.
    pub node: String,
    /// The node's [`LeaderInfo`] as JSON (where its clients go).
    pub info: String,
}

/// One shard's row of the table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    /// The newest grant's epoch, the shard's fencing token (0: never granted). Kept when the
    /// lease is released, so the next grant is higher.
    pub epoch: i64,
    /// The holder, while the lease has not been released (it may have expired: only the raft
    /// leader can tell).
    pub holder: Option<Holder>,
}

/// The replicated part of the table: what snapshots carry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTable {
    slots: BTreeMap<u32, Slot>,
}

impl LeaseTable {
    /// Whether no shard was ever granted (a K = 1 fleet's table).
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Shard `shard`'s row, if it was ever granted.
    pub fn slot(&self, shard: u32) -> Option<&Slot> {
        self.slots.get(&shard)
    }
}

/// A command of the shard lease table, carried by the raft log (the log's application data).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardCmd {
    /// Grant `shard` to `holder` if its epoch is still `expect` and this entry was appended in
    /// raft term `term` (the term in which the leader judged the shard free or expired).
    Grant {
        /// The shard.
        shard: u32,
        /// Who gets it.
        holder: Holder,
        /// The epoch the leader judged free or expired.
        expect: i64,
        /// The raft term the judgement was made in.
        term: u64,
    },
    /// End `holder`'s lease on `shard` (at `epoch`, or any epoch when `None`).
    Release {
        /// The shard.
        shard: u32,
        /// The candidacy id releasing it.
        holder: String,
        /// The epoch released (`None`: whichever this candidacy holds).
        epoch: Option<i64>,
    },
}

impl fmt::Display for ShardCmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShardCmd::Grant {
                shard,
                holder,
                expect,
                term,
            } => write!(
                f,
                "grant shard {shard} to {} (expect epoch {expect}, term {term})",
                holder.id
            ),
            ShardCmd::Release {
                shard,
                holder,
                epoch,
            } => write!(f, "release shard {shard} by {holder} (epoch {epoch:?})"),
        }
    }
}

/// What applying a log entry did (the raft log's application response).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardOutcome {
    /// A blank or membership entry.
    #[default]
    None,
    /// Granted.
    Granted {
        /// The new epoch: the shard's fencing token for this term.
        epoch: i64,
    },
    /// Not granted: the shard's epoch moved since the judgement, or the term did.
    Refused {
        /// The shard's epoch as it is.
        epoch: i64,
    },
    /// Whether a release ended a lease.
    Released(bool),
}

/// What the raft leader judged of an `acquire`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Judged {
    /// Free, expired, or already this candidacy's: propose a grant expecting this epoch.
    Grant { expect: i64 },
    /// Held by this node, unexpired.
    Held { node: String },
}

/// The table and this node's own clocks for it, under the state machine's lock. The clocks are
/// never replicated nor persisted: a node that restarts or installs a snapshot counts every
/// held shard as granted at that moment (later is always the safe side).
#[derive(Debug, Default)]
pub(crate) struct Leases {
    table: LeaseTable,
    /// When this node applied each shard's newest grant.
    applied_at: BTreeMap<u32, Instant>,
    /// When this node (as raft leader) received each shard's newest successful renewal, and
    /// of which epoch.
    heard: BTreeMap<u32, (i64, Instant)>,
}

impl Leases {
    /// A table restored at `now` (from a snapshot, or the disk at start): every held shard
    /// counts as granted at `now`.
    pub fn restored(table: LeaseTable, now: Instant) -> Leases {
        let applied_at = table
            .slots
            .iter()
            .filter(|(_, s)| s.holder.is_some())
            .map(|(shard, _)| (*shard, now))
            .collect();
        Leases {
            table,
            applied_at,
            heard: BTreeMap::new(),
        }
    }

    /// The replicated part.
    pub fn table(&self) -> &LeaseTable {
        &self.table
    }

    /// Applies one committed command, appended in raft term `term`, at `now` on this node's
    /// clock. Deterministic in everything replicated.
    pub fn apply(&mut self, cmd: &ShardCmd, term: u64, now: Instant) -> ShardOutcome {
        match cmd {
            ShardCmd::Grant {
                shard,
                holder,
                expect,
                term: judged_in,
            } => {
                let slot = self.table.slots.entry(*shard).or_default();
                if *judged_in != term || slot.epoch != *expect {
                    return ShardOutcome::Refused { epoch: slot.epoch };
                }
                // A term that is not a usable token is refused (the node would not act on it).
                let Ok(term_floor) = i64::try_from(term) else {
                    return ShardOutcome::Refused { epoch: slot.epoch };
                };
                let Some(next) = slot.epoch.checked_add(1) else {
                    return ShardOutcome::Refused { epoch: slot.epoch };
                };
                slot.epoch = next.max(term_floor);
                slot.holder = Some(holder.clone());
                self.applied_at.insert(*shard, now);
                ShardOutcome::Granted { epoch: slot.epoch }
            }
            ShardCmd::Release {
                shard,
                holder,
                epoch,
            } => {
                let Some(slot) = self.table.slots.get_mut(shard) else {
                    return ShardOutcome::Released(false);
                };
                let ours = slot.holder.as_ref().is_some_and(|h| h.id == *holder)
                    && epoch.is_none_or(|e| e == slot.epoch);
                if ours {
                    slot.holder = None;
                }
                ShardOutcome::Released(ours)
            }
        }
    }

    /// The latest moment the holder of `shard` at `epoch` may count its lease from, as this
    /// node knows it; never before `since` (when this node became raft leader).
    fn last_heard(&self, shard: u32, epoch: i64, since: Instant) -> Instant {
        let mut last = since;
        if let Some(at) = self.applied_at.get(&shard) {
            last = last.max(*at);
        }
        if let Some((e, at)) = self.heard.get(&shard) {
            if *e == epoch {
                last = last.max(*at);
            }
        }
        last
    }

    /// The holder of `shard` if its lease has not expired at `now` (judged as in the module
    /// docs, with this node raft leader since `since`).
    fn live_holder(
        &self,
        shard: u32,
        since: Instant,
        now: Instant,
        ttl: Duration,
    ) -> Option<&Holder> {
        let slot = self.table.slots.get(&shard)?;
        let holder = slot.holder.as_ref()?;
        let last = self.last_heard(shard, slot.epoch, since);
        (now < last + ttl).then_some(holder)
    }

    /// The raft leader's judgement of `candidacy`'s acquisition of `shard` at `now`.
    pub fn judge(
        &self,
        shard: u32,
        candidacy: &str,
        since: Instant,
        now: Instant,
        ttl: Duration,
    ) -> Judged {
        let expect = self.table.slots.get(&shard).map_or(0, |s| s.epoch);
        match self.live_holder(shard, since, now, ttl) {
            Some(h) if h.id != candidacy => Judged::Held {
                node: h.node.clone(),
            },
            _ => Judged::Grant { expect },
        }
    }

    /// Whether `candidacy` holds `shard` at `epoch`, unexpired at `now`.
    pub fn holds(
        &self,
        shard: u32,
        candidacy: &str,
        epoch: i64,
        since: Instant,
        now: Instant,
        ttl: Duration,
    ) -> bool {
        self.table
            .slots
            .get(&shard)
            .is_some_and(|s| s.epoch == epoch)
            && self
                .live_holder(shard, since, now, ttl)
                .is_some_and(|h| h.id == candidacy)
    }

    /// A renewal of `candidacy`'s lease on `shard` at `epoch`, received at `received` and judged
    /// at `now`: extended (heard at `received`) iff it still holds, unexpired.
    #[allow(clippy::too_many_arguments)]
    pub fn renew(
        &mut self,
        shard: u32,
        candidacy: &str,
        epoch: i64,
        since: Instant,
        now: Instant,
        ttl: Duration,
        received: Instant,
    ) -> bool {
        if !self.holds(shard, candidacy, epoch, since, now, ttl) {
            return false;
        }
        let at = match self.heard.get(&shard) {
            Some((e, prev)) if *e == epoch => received.max(*prev),
            _ => received,
        };
        self.heard.insert(shard, (epoch, at));
        true
    }

    /// Every shard's unexpired holder: `(shard, LeaderInfo JSON)`.
    pub fn live_holders(&self, since: Instant, now: Instant, ttl: Duration) -> Vec<(u32, String)> {
        self.table
            .slots
            .keys()
            .filter_map(|s| {
                self.live_holder(*s, since, now, ttl)
                    .map(|h| (*s, h.info.clone()))
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The wire: requests to the raft leader
// ---------------------------------------------------------------------------------------------

/// A request to the raft leader's shard lease table (`POST /peer/shard`, or in process).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ShardRequest {
    Acquire {
        shard: u32,
        holder: Holder,
    },
    /// `(shard, candidacy, epoch)` per lease of the batch.
    Renew {
        leases: Vec<(u32, String, i64)>,
    },
    Confirm {
        shard: u32,
        holder: String,
        epoch: i64,
    },
    Release {
        shard: u32,
        holder: String,
        epoch: Option<i64>,
    },
    /// End `shard`'s lease if its holder is on node `node` (the failure detector confirmed
    /// that node dead): a `Release` of the holder and epoch the table names now.
    ExpireDead {
        shard: u32,
        node: String,
    },
    Leaders,
}

/// The raft leader's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ShardAnswer {
    /// Granted at `epoch`, for `ttl_ms` (the leader's TTL) from the request's send.
    Granted {
        epoch: i64,
        ttl_ms: u64,
    },
    /// Held by another candidacy (`node`, when known).
    Held {
        node: Option<String>,
    },
    /// One verdict per lease of the batch, in order.
    Renewed {
        ok: Vec<bool>,
        ttl_ms: u64,
    },
    Confirmed(bool),
    Released(bool),
    /// `(shard, LeaderInfo JSON)` for every unexpired lease.
    Leaders(Vec<(u32, String)>),
    /// This node does not lead raft (the leader it knows of, by raft id).
    NotLeader {
        leader: Option<u64>,
    },
    /// No answer now (no quorum, a timeout, raft stopped); ask again.
    Unavailable(String),
}

// ---------------------------------------------------------------------------------------------
// The raft leader's side
// ---------------------------------------------------------------------------------------------

/// The table's server: every node has one; only the raft leader's answers anything but
/// `NotLeader`.
pub(crate) struct LeaseServer {
    source: Arc<dyn RaftHandleSource>,
    sm: StateMachine,
    me: u64,
    ttl: Duration,
    /// Bound on each raft round (ReadIndex, a write).
    bound: Duration,
    /// `(raft term, when this node first served a request as its leader)`.
    leading: StdMutex<Option<(u64, Instant)>>,
}

fn not_leader(raft: &RaftHandle) -> ShardAnswer {
    ShardAnswer::NotLeader {
        leader: raft.metrics().borrow_watched().current_leader,
    }
}

impl LeaseServer {
    pub(crate) fn new(
        source: Arc<dyn RaftHandleSource>,
        sm: StateMachine,
        me: u64,
        ttl: Duration,
        bound: Duration,
    ) -> LeaseServer {
        LeaseServer {
            source,
            sm,
            me,
            ttl,
            bound,
            leading: StdMutex::new(None),
        }
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl.as_millis() as u64
    }

    /// Decodes, serves and encodes one authenticated `POST /peer/shard`.
    pub(crate) async fn handle_rpc(&self, body: &Bytes) -> Result<Bytes, PeerRpcError> {
        let received = Instant::now();
        let req: ShardRequest =
            serde_json::from_slice(body).map_err(|e| PeerRpcError::BadRequest(e.to_string()))?;
        let answer = self.handle(req, received).await;
        serde_json::to_vec(&answer)
            .map(Bytes::from)
            .map_err(|e| PeerRpcError::Failed(e.to_string()))
    }

    /// Serves one request that arrived at `received` (see the module docs).
    pub(crate) async fn handle(&self, req: ShardRequest, received: Instant) -> ShardAnswer {
        match self.serve(req, received).await {
            Ok(a) | Err(a) => a,
        }
    }

    async fn serve(
        &self,
        req: ShardRequest,
        received: Instant,
    ) -> Result<ShardAnswer, ShardAnswer> {
        let raft = self.leader_raft()?;
        match req {
            ShardRequest::Leaders => {
                let term = raft.metrics().borrow_watched().current_term;
                let now = Instant::now();
                let since = self.since(term, now)?;
                let live = self
                    .sm
                    .with_leases(|l| l.live_holders(since, now, self.ttl));
                Ok(ShardAnswer::Leaders(live))
            }
            ShardRequest::Acquire { shard, holder } => {
                let term = self.read_index(&raft).await?;
                let now = Instant::now();
                let since = self.since(term, now)?;
                let judged = self
                    .sm
                    .with_leases(|l| l.judge(shard, &holder.id, since, now, self.ttl));
                let expect = match judged {
                    Judged::Held { node } => return Ok(ShardAnswer::Held { node: Some(node) }),
                    Judged::Grant { expect } => expect,
                };
                let cmd = ShardCmd::Grant {
                    shard,
                    holder,
                    expect,
                    term,
                };
                match self.write(&raft, cmd).await? {
                    ShardOutcome::Granted { epoch } => Ok(ShardAnswer::Granted {
                        epoch,
                        ttl_ms: self.ttl_ms(),
                    }),
                    _ => Ok(ShardAnswer::Held { node: None }),
                }
            }
            ShardRequest::Renew { leases } => {
                let term = self.read_index(&raft).await?;
                let now = Instant::now();
                let since = self.since(term, now)?;
                let ok = self.sm.with_leases(|l| {
                    leases
                        .iter()
                        .map(|(s, h, e)| l.renew(*s, h, *e, since, now, self.ttl, received))
                        .collect()
                });
                Ok(ShardAnswer::Renewed {
                    ok,
                    ttl_ms: self.ttl_ms(),
                })
            }
            ShardRequest::Confirm {
                shard,
                holder,
                epoch,
            } => {
                let term = self.read_index(&raft).await?;
                let now = Instant::now();
                let since = self.since(term, now)?;
                let holds = self
                    .sm
                    .with_leases(|l| l.holds(shard, &holder, epoch, since, now, self.ttl));
                Ok(ShardAnswer::Confirmed(holds))
            }
            ShardRequest::Release {
                shard,
                holder,
                epoch,
            } => {
                // Most releases are withdrawn candidacies that were never granted (placement
                // moved on while they waited): answered from the table, with no log entry. A
                // grant still in flight that lands after this look is a lease nobody renews:
                // it runs out (a shard dark for a lease, never two holders).
                self.read_index(&raft).await?;
                let named = self.sm.with_leases(|l| {
                    l.table().slot(shard).is_some_and(|s| {
                        s.holder.as_ref().is_some_and(|h| h.id == holder)
                            && epoch.is_none_or(|e| e == s.epoch)
                    })
                });
                if !named {
                    return Ok(ShardAnswer::Released(false));
                }
                let cmd = ShardCmd::Release {
                    shard,
                    holder,
                    epoch,
                };
                self.release_entry(&raft, cmd).await
            }
            ShardRequest::ExpireDead { shard, node } => {
                self.read_index(&raft).await?;
                let named = self.sm.with_leases(|l| {
                    l.table().slot(shard).and_then(|s| {
                        s.holder
                            .as_ref()
                            .filter(|h| h.node == node)
                            .map(|h| (h.id.clone(), s.epoch))
                    })
                });
                let Some((holder, epoch)) = named else {
                    return Ok(ShardAnswer::Released(false));
                };
                // That epoch only: a grant that lands first (the holder was not dead after
                // all and renewed, or a new owner won) is not ended by this.
                let cmd = ShardCmd::Release {
                    shard,
                    holder,
                    epoch: Some(epoch),
                };
                self.release_entry(&raft, cmd).await
            }
        }
    }

    /// Appends a `Release` entry and says whether it ended a lease.
    async fn release_entry(
        &self,
        raft: &RaftHandle,
        cmd: ShardCmd,
    ) -> Result<ShardAnswer, ShardAnswer> {
        match self.write(raft, cmd).await? {
            ShardOutcome::Released(r) => Ok(ShardAnswer::Released(r)),
            _ => Ok(ShardAnswer::Released(false)),
        }
    }

    /// The running raft, if this node leads it.
    fn leader_raft(&self) -> Result<RaftHandle, ShardAnswer> {
        let raft = self
            .source
            .current()
            .ok_or_else(|| ShardAnswer::Unavailable("raft is not running on this node".into()))?;
        let leading = {
            let m = raft.metrics();
            let m = m.borrow_watched();
            m.state == ServerState::Leader && m.current_leader == Some(self.me)
        };
        if leading {
            Ok(raft)
        } else {
            Err(not_leader(&raft))
        }
    }

    /// When this node began to lead raft term `term`, as it counts it: the first time it
    /// served a request in that term (after the election, so on the safe side). A request
    /// whose ReadIndex saw an older term than the newest served is refused.
    fn since(&self, term: u64, now: Instant) -> Result<Instant, ShardAnswer> {
        let mut g = self.leading.lock().unwrap_or_else(|p| p.into_inner());
        match *g {
            Some((t, since)) if t == term => Ok(since),
            Some((t, _)) if t > term => Err(ShardAnswer::Unavailable(format!(
                "raft term {term} is behind the term this node leads ({t})"
            ))),
            _ => {
                *g = Some((term, now));
                Ok(now)
            }
        }
    }

    /// A ReadIndex round: this node still leads (a quorum accepted its term after the call
    /// began) and its state machine has applied everything committed before. The term.
    async fn read_index(&self, raft: &RaftHandle) -> Result<u64, ShardAnswer> {
        match tokio::time::timeout(self.bound, raft.ensure_linearizable(ReadPolicy::ReadIndex))
            .await
        {
            Ok(Ok(read)) => Ok(read.committed_leader_id().term),
            Ok(Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(_)))) => {
                Err(not_leader(raft))
            }
            Ok(Err(e)) => Err(ShardAnswer::Unavailable(format!("raft read: {e}"))),
            Err(_) => Err(ShardAnswer::Unavailable(format!(
                "no quorum acknowledged within {:?}",
                self.bound
            ))),
        }
    }

    /// Appends `cmd`, waits for it to be applied here, and returns what applying it did.
    async fn write(&self, raft: &RaftHandle, cmd: ShardCmd) -> Result<ShardOutcome, ShardAnswer> {
        match tokio::time::timeout(self.bound, raft.client_write(cmd)).await {
            Ok(Ok(resp)) => Ok(resp.data),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_)))) => {
                Err(not_leader(raft))
            }
            Ok(Err(e)) => Err(ShardAnswer::Unavailable(format!("raft write: {e}"))),
            // It may still be applied: a lost grant is re-taken by the same candidacy, a lost
            // release runs out with its lease.
            Err(_) => Err(ShardAnswer::Unavailable(format!(
                "raft write not applied within {:?}",
                self.bound
            ))),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A node's side: one group per node, one elector per shard
// ---------------------------------------------------------------------------------------------

fn unavailable(e: impl fmt::Display) -> ElectorError {
    ElectorError::Unavailable(format!("raft shards: {e}"))
}

/// Who leads each shard, from the newest `leaders` answer, or why there was none.
struct View {
    at: Option<Instant>,
    leaders: Result<Arc<BTreeMap<u32, LeaderInfo>>, String>,
}

/// What a node's shard electors share: its raft member, the way to the raft leader, the
/// coalesced renewals and the leader view.
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
    batch: RenewBatch<(u32, String, i64)>,
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
    async fn call(&self, op: &'static str, req: ShardRequest) -> ElectorResult<ShardAnswer> {
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
    async fn renew_all(&self, leases: Vec<(u32, String, i64)>) -> ElectorResult<Vec<bool>> {
        let n = leases.len();
        match self
            .call("shard-renew", ShardRequest::Renew { leases })
            .await?
        {
            ShardAnswer::Renewed { ok, ttl_ms } if ok.len() == n => {
                self.grant_ttl(ttl_ms);
                Ok(ok)
            }
            other => Err(unavailable(format!(
                "unexpected answer to renew: {other:?}"
            ))),
        }
    }

    /// Who leads each shard: one `leaders` request per retry interval for all of the node's
    /// shards (a failure, too, is reused for that long).
    async fn leaders(&self) -> ElectorResult<Arc<BTreeMap<u32, LeaderInfo>>> {
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
    async fn expire_dead(&self, shard: u32, dead: &str) -> ElectorResult<bool> {
        let req = ShardRequest::ExpireDead {
            shard,
            node: dead.to_owned(),
        };
        match self.call("expire_dead", req).await? {
            ShardAnswer::Released(ended) => Ok(ended),
            other => Err(unavailable(format!(
                "unexpected answer to expire_dead: {other:?}"
            ))),
        }
    }

    async fn release(&self, shard: u32, holder: String, epoch: Option<i64>) -> ElectorResult<()> {
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

/// One shard's elector on a sharded raft node (see the module docs).
pub struct RaftShardElector {
    group: Arc<ShardGroup>,
    shard: u32,
    /// This shard's candidacy: its holder id and, while leading, its epoch.
    held: EpochLease,
    /// Cuts a waiting campaign's poll interval short ([`Elector::wake_campaign`]).
    wake: crate::backends::CampaignWake,
}

/// Starts this node's raft member (serving the shard lease table to its peers) and returns one
/// elector per shard config (`NodeConfig::for_shard`), all sharing it.
pub async fn connect_shards(cfgs: &[NodeConfig]) -> ElectorResult<Vec<RaftShardElector>> {
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
        batch: RenewBatch::new(cfg.renew_interval()),
        view: tokio::sync::Mutex::new(View {
            at: None,
            leaders: Err("not read yet".into()),
        }),
    });
    Ok((0u32..)
        .zip(cfgs)
        .map(|(shard, _)| RaftShardElector {
            group: group.clone(),
            shard,
            held: EpochLease::default(),
            wake: Default::default(),
        })
        .collect())
}

impl RaftShardElector {
    fn jittered_retry(&self) -> Duration {
        let ms = self.group.retry.as_millis().max(2) as u64;
        Duration::from_millis(rand::thread_rng().gen_range(ms / 2..=ms + ms / 2))
    }

    /// The raft group this node's shards share (tests and diagnostics).
    pub fn raft(&self) -> &RaftElector {
        &self.group.raft
    }
}

#[async_trait]
impl Elector for RaftShardElector {
    fn kind(&self) -> BackendKind {
        BackendKind::Raft
    }

    async fn campaign(&self) -> ElectorResult<Win> {
        // A failed or dropped campaign's id is reused: its grant may have landed, and close()
        // must still be able to release it (and a retry re-takes it at once).
        let holder = self
            .held
            .holder_for_campaign(&self.group.node_id)
            .ok_or_else(|| unavailable("campaign while already holding the lease"))?;
        let mut seen_held_at: Option<Instant> = None;
        loop {
            let sent_at = Instant::now();
            let req = ShardRequest::Acquire {
                shard: self.shard,
                holder: Holder {
                    id: holder.clone(),
                    node: self.group.node_id.clone(),
                    info: self.group.info.clone(),
                },
            };
            match self.group.call("shard-acquire", req).await {
                Ok(ShardAnswer::Granted { epoch, ttl_ms }) => {
                    let ttl = self.group.grant_ttl(ttl_ms);
                    if !self.held.won(&holder, epoch) {
                        // close() ran while the request was in flight; it did not see this grant.
                        let _ = self.group.release(self.shard, holder, Some(epoch)).await;
                        return Err(ElectorError::LeaseLost(
                            "candidacy withdrawn during campaign".into(),
                        ));
                    }
                    return Ok(Win {
                        token: FenceToken::checked("shard lease epoch", epoch)?,
                        grant: Grant { sent_at, ttl },
                        vacant_since: Some(seen_held_at.unwrap_or(sent_at)),
                    });
                }
                Ok(_) => seen_held_at = Some(sent_at),
                // No raft leader yet, or it is changing: ask again.
                Err(e) => tracing::debug!(shard = self.shard, error = %e, "shard acquire"),
            }
            self.wake.nap(self.jittered_retry()).await;
        }
    }

    async fn renew(&self) -> ElectorResult<Option<Grant>> {
        let Some((holder, epoch)) = self.held.held() else {
            return Ok(None);
        };
        let lease = (self.shard, holder, epoch);
        match self
            .group
            .batch
            .renew(self.shard, lease, |leases| self.group.renew_all(leases))
            .await?
        {
            Renewed::At(sent_at) => {
                return Ok(Some(Grant {
                    sent_at,
                    ttl: Duration::from_millis(self.group.granted_ms.load(Ordering::Relaxed)),
                }))
            }
            Renewed::Lost => {}
        }
        self.held.lost(epoch);
        Err(ElectorError::LeaseLost(format!(
            "shard {} lease epoch {epoch} expired or taken over",
            self.shard
        )))
    }

    async fn resign(&self, successor: Option<&str>) -> ElectorResult<()> {
        if successor.is_some() {
            return Err(ElectorError::Unsupported {
                backend: BackendKind::Raft,
                what: "naming a successor for one shard (a hand-over is a release)",
            });
        }
        let Some((holder, epoch)) = self.held.take_held() else {
            return Ok(());
        };
        self.group.batch.forget(self.shard).await;
        match holder {
            Some(h) => self.group.release(self.shard, h, Some(epoch)).await,
            None => Ok(()),
        }
    }

    async fn leader(&self) -> ElectorResult<Option<LeaderInfo>> {
        Ok(self.group.leaders().await?.get(&self.shard).cloned())
    }

    /// A ReadIndex round on the raft leader, then a compare on the table: ours while it names
    /// this candidacy at `token`'s epoch and the leader has not judged it expired.
    async fn confirm_leadership(&self, _me: &str, token: FenceToken) -> ElectorResult<bool> {
        let Some(holder) = self.held.holder_at(token.0) else {
            return Ok(false);
        };
        let req = ShardRequest::Confirm {
            shard: self.shard,
            holder,
            epoch: token.0,
        };
        match self.group.call("shard-confirm", req).await? {
            ShardAnswer::Confirmed(b) => Ok(b),
            other => Err(unavailable(format!(
                "unexpected answer to confirm: {other:?}"
            ))),
        }
    }

    /// A `Release` of the table's holder of this shard if it is on node `dead`, at the epoch
    /// the raft leader sees (a log entry, like every release). The campaign polls `acquire`,
    /// so it is woken to see the seat free now.
    async fn expire_dead_holder(&self, dead: &str) -> ElectorResult<DeadHolderExpiry> {
        if dead == self.group.node_id {
            return Ok(DeadHolderExpiry::NotEnded);
        }
        Ok(if self.group.expire_dead(self.shard, dead).await? {
            tracing::info!(
                shard = self.shard,
                dead,
                "ended a dead holder's shard lease"
            );
            DeadHolderExpiry::EndedCampaignPolls
        } else {
            DeadHolderExpiry::NotEnded
        })
    }

    fn wake_campaign(&self) {
        self.wake.wake();
    }

    async fn close(&self) -> ElectorResult<()> {
        let holder = self.held.take_for_close();
        self.group.batch.forget(self.shard).await;
        match holder {
            // Any epoch: a dropped campaign's grant may have landed unseen.
            Some(h) => self.group.release(self.shard, h, None).await,
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_millis(3000);

    fn holder(id: &str) -> Holder {
        Holder {
            id: id.into(),
            node: id.split('-').next().unwrap().into(),
            info: format!("{{\"node_id\":\"{id}\",\"http_addr\":null}}"),
        }
    }

    fn grant(
        l: &mut Leases,
        shard: u32,
        who: &str,
        expect: i64,
        term: u64,
        at: Instant,
    ) -> ShardOutcome {
        let cmd = ShardCmd::Grant {
            shard,
            holder: holder(who),
            expect,
            term,
        };
        l.apply(&cmd, term, at)
    }

    /// The safety rule: after a raft leader change, a held shard is not granted to another
    /// node until a full TTL has passed since the new leader began, however long ago the old
    /// leader last heard the holder, and a renewal keeps it held.
    #[test]
    fn a_held_shard_waits_a_full_ttl_after_a_raft_leader_change() {
        let t0 = Instant::now();
        // Old leader (term 3) granted shard 1 to n1 at t0; n1 renewed through it until t0+2s.
        let mut old = Leases::default();
        assert_eq!(
            grant(&mut old, 1, "n1-a", 0, 3, t0),
            ShardOutcome::Granted { epoch: 3 }
        );
        assert!(old.renew(
            1,
            "n1-a",
            3,
            t0,
            t0 + Duration::from_secs(2),
            TTL,
            t0 + Duration::from_secs(2)
        ));
        // The new leader (term 4) applied the same log long before (a follower then, its own
        // clock): applied_at = t0. It became leader at t0 + 10 s: nothing heard since.
        let mut new = Leases::default();
        grant(&mut new, 1, "n1-a", 0, 3, t0);
        let since = t0 + Duration::from_secs(10);
        for after in [0, 1000, 2999] {
            let now = since + Duration::from_millis(after);
            assert_eq!(
                new.judge(1, "n2-b", since, now, TTL),
                Judged::Held { node: "n1".into() },
                "{after} ms after the leader change"
            );
        }
        // The holder's renewal at the new leader keeps it held past the first TTL.
        let r = since + Duration::from_millis(2500);
        assert!(new.renew(1, "n1-a", 3, since, r, TTL, r));
        assert!(matches!(
            new.judge(1, "n2-b", since, since + Duration::from_millis(4000), TTL),
            Judged::Held { .. }
        ));
        // A TTL after the last renewal, with none since, it is expired: granted, expecting
        // the old epoch, and the old holder's late renewal is refused (never revived).
        let late = r + TTL;
        assert_eq!(
            new.judge(1, "n2-b", since, late, TTL),
            Judged::Grant { expect: 3 }
        );
        assert!(!new.renew(1, "n1-a", 3, since, late, TTL, late));
        assert_eq!(
            grant(&mut new, 1, "n2-b", 3, 4, late),
            ShardOutcome::Granted { epoch: 4 }
        );
        assert!(!new.renew(1, "n1-a", 3, since, late, TTL, late));
        assert!(new.holds(1, "n2-b", 4, since, late, TTL));
    }

    #[test]
    fn a_fresh_grant_is_held_for_a_ttl_from_its_application_even_for_an_old_leader() {
        let since = Instant::now();
        let mut l = Leases::default();
        // The leader has led for a long time; a grant applied just now is not "expired".
        let now = since + Duration::from_secs(60);
        grant(&mut l, 0, "n1-a", 0, 2, now);
        assert!(matches!(
            l.judge(0, "n2-b", since, now, TTL),
            Judged::Held { .. }
        ));
        assert!(matches!(
            l.judge(0, "n2-b", since, now + TTL - Duration::from_millis(1), TTL),
            Judged::Held { .. }
        ));
        assert_eq!(
            l.judge(0, "n2-b", since, now + TTL, TTL),
            Judged::Grant { expect: 2 }
        );
        // Its own candidacy re-takes it at once (a grant whose answer was lost).
        assert_eq!(
            l.judge(0, "n1-a", since, now, TTL),
            Judged::Grant { expect: 2 }
        );
    }

    #[test]
    fn epochs_only_grow_per_shard_and_never_fall_below_the_raft_term() {
        let t = Instant::now();
        let mut l = Leases::default();
        assert_eq!(
            grant(&mut l, 5, "n1-a", 0, 7, t),
            ShardOutcome::Granted { epoch: 7 }
        );
        // Same term, next grant: epoch + 1.
        assert_eq!(
            grant(&mut l, 5, "n2-a", 7, 7, t),
            ShardOutcome::Granted { epoch: 8 }
        );
        // A later term below the epoch: still epoch + 1.
        assert_eq!(
            grant(&mut l, 5, "n3-a", 8, 8, t),
            ShardOutcome::Granted { epoch: 9 }
        );
        // A term above: the term.
        assert_eq!(
            grant(&mut l, 5, "n1-b", 9, 20, t),
            ShardOutcome::Granted { epoch: 20 }
        );
        // A grant judged on an older epoch (a concurrent grant won) is refused.
        assert_eq!(
            grant(&mut l, 5, "n2-b", 9, 20, t),
            ShardOutcome::Refused { epoch: 20 }
        );
        // A grant judged in one term but appended in another is refused.
        let cmd = ShardCmd::Grant {
            shard: 5,
            holder: holder("n2-b"),
            expect: 20,
            term: 20,
        };
        assert_eq!(l.apply(&cmd, 21, t), ShardOutcome::Refused { epoch: 20 });
        // Release keeps the epoch; the next grant is higher.
        let rel = ShardCmd::Release {
            shard: 5,
            holder: "n1-b".into(),
            epoch: Some(20),
        };
        assert_eq!(l.apply(&rel, 21, t), ShardOutcome::Released(true));
        assert_eq!(l.apply(&rel, 21, t), ShardOutcome::Released(false));
        assert_eq!(l.table().slot(5).unwrap().epoch, 20);
        assert_eq!(l.judge(5, "n3-c", t, t, TTL), Judged::Grant { expect: 20 });
        assert_eq!(
            grant(&mut l, 5, "n3-c", 20, 21, t),
            ShardOutcome::Granted { epoch: 21 }
        );
        // Shards are independent.
        assert_eq!(
            grant(&mut l, 6, "n3-c", 0, 21, t),
            ShardOutcome::Granted { epoch: 21 }
        );
    }

    #[test]
    fn a_restored_table_counts_every_held_shard_as_granted_at_restore() {
        let t = Instant::now();
        let mut l = Leases::default();
        grant(&mut l, 0, "n1-a", 0, 1, t);
        grant(&mut l, 1, "n2-a", 0, 1, t);
        l.apply(
            &ShardCmd::Release {
                shard: 1,
                holder: "n2-a".into(),
                epoch: None,
            },
            1,
            t,
        );
        let later = t + Duration::from_secs(100);
        let r = Leases::restored(l.table().clone(), later);
        assert!(matches!(
            r.judge(0, "n3-a", t, later + TTL / 2, TTL),
            Judged::Held { .. }
        ));
        assert_eq!(
            r.judge(1, "n3-a", t, later, TTL),
            Judged::Grant { expect: 1 }
        );
        assert_eq!(r.live_holders(t, later, TTL).len(), 1);
        assert!(r.live_holders(t, later + TTL, TTL).is_empty());
    }
}
