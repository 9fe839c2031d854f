//! The raft leader's side of the shard lease table: it answers `ShardRequest`s after a
//! ReadIndex round, proposes grants and releases through the log, and keeps the renewals
//! (`lease_table::Leases`) on its own monotonic clock. Every node has one; only the raft
//! leader's answers anything but `NotLeader`.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, LinearizableReadError, RaftError};
use openraft::{ReadPolicy, ServerState};

use super::lease_table::*;
use super::network::{PeerRpcError, RaftHandleSource, ShardRpc};
use super::shard_wire::*;
use super::storage::StateMachine;
use super::RaftHandle;

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
            ShardRequest::Acquire { shard, holder } => self.acquire(&raft, shard, holder).await,
            ShardRequest::Renew { leases } => self.renew(&raft, leases, received).await,
            ShardRequest::Confirm {
                shard,
                holder,
                epoch,
            } => self.confirm(&raft, shard, holder, epoch).await,
            ShardRequest::Release {
                shard,
                holder,
                epoch,
            } => self.release(&raft, shard, holder, epoch).await,
            ShardRequest::ExpireDead { shard, node } => self.expire_dead(&raft, shard, node).await,
        }
    }

    /// `Acquire`: granted through the log if the table, read after a ReadIndex round, lets
    /// `holder` take `shard`; else who holds it.
    async fn acquire(
        &self,
        raft: &RaftHandle,
        shard: u32,
        holder: Holder,
    ) -> Result<ShardAnswer, ShardAnswer> {
        let term = self.read_index(raft).await?;
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
        match self.write(raft, cmd).await? {
            ShardOutcome::Granted { epoch } => Ok(ShardAnswer::Granted {
                epoch,
                ttl_ms: self.ttl_ms(),
            }),
            _ => Ok(ShardAnswer::Held { node: None }),
        }
    }

    /// `Renew`: one verdict per lease of the batch, judged on this leader's clock from the
    /// request's arrival (`received`), with no log entry.
    async fn renew(
        &self,
        raft: &RaftHandle,
        leases: Vec<(u32, String, i64)>,
        received: Instant,
    ) -> Result<ShardAnswer, ShardAnswer> {
        let term = self.read_index(raft).await?;
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

    /// `Confirm`: whether `holder` still holds `shard` at `epoch`, after a ReadIndex round.
    async fn confirm(
        &self,
        raft: &RaftHandle,
        shard: u32,
        holder: String,
        epoch: i64,
    ) -> Result<ShardAnswer, ShardAnswer> {
        let term = self.read_index(raft).await?;
        let now = Instant::now();
        let since = self.since(term, now)?;
        let holds = self
            .sm
            .with_leases(|l| l.holds(shard, &holder, epoch, since, now, self.ttl));
        Ok(ShardAnswer::Confirmed(holds))
    }

    /// `Release`: ends `holder`'s lease of `shard` (at `epoch`, if given) through the log, if
    /// the table names it.
    async fn release(
        &self,
        raft: &RaftHandle,
        shard: u32,
        holder: String,
        epoch: Option<i64>,
    ) -> Result<ShardAnswer, ShardAnswer> {
        // Most releases are withdrawn candidacies that were never granted (placement
        // moved on while they waited): answered from the table, with no log entry. A
        // grant still in flight that lands after this look is a lease nobody renews:
        // it runs out (a shard dark for a lease, never two holders).
        self.read_index(raft).await?;
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
        self.release_entry(raft, cmd).await
    }

    /// `ExpireDead`: ends `shard`'s lease if its holder is on the dead `node`.
    async fn expire_dead(
        &self,
        raft: &RaftHandle,
        shard: u32,
        node: String,
    ) -> Result<ShardAnswer, ShardAnswer> {
        self.read_index(raft).await?;
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
        self.release_entry(raft, cmd).await
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

#[async_trait::async_trait]
impl ShardRpc for LeaseServer {
    /// Decodes, serves and encodes one authenticated `POST /peer/shard`.
    async fn handle_rpc(&self, body: &Bytes) -> Result<Bytes, PeerRpcError> {
        let received = Instant::now();
        let req: ShardRequest =
            serde_json::from_slice(body).map_err(|e| PeerRpcError::BadRequest(e.to_string()))?;
        let answer = self.handle(req, received).await;
        serde_json::to_vec(&answer)
            .map(Bytes::from)
            .map_err(|e| PeerRpcError::Failed(e.to_string()))
    }
}
