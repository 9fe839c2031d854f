//! etcd: the election API (campaign / resign / leader / observe) over a lease kept alive by our
//! renew loop. Token = the leader key's create revision, which etcd makes strictly increasing:
//! the leader is always the lowest live key under the election name, so any key older than the
//! current leader's is already gone.
//!
//! Interoperates with `etcdctl elect NAME` on the same name: its candidacy queues with ours.
//!
//! **One lease per node, whatever the number of shards.** The electors of a sharded node (one per
//! shard, each with its own election name) share one session: one etcd client, one
//! lease, one keepalive stream. A shard's `renew` that finds a grant another shard's keepalive got
//! less than half a renew interval ago takes that grant instead of sending a keepalive of its own, so a node sends about
//! two keepalives per renew interval for all its shards, not one per shard. The grant keeps its
//! own send time, so every shard's deadline is still counted from a request that really renewed
//! the lease its key rides on. Losing that lease ends every shard's candidacy and term at once:
//! each shard's next `renew` answers `LeaseLost`. With one shard this is exactly the unshared
//! session (one elector, one lease, revoked on close).
//!
//! **The election runs on the client, over plain KV requests** (as etcd's own Go `concurrency`
//! package does), not through the server's `v3election` service: a candidacy is the key
//! `NAME/<lease in hex>` put if absent on the node's lease, and it wins once no key under `NAME/`
//! is older. With 64 shards on 9 nodes (hundreds of candidacies and observers) etcd 3.4's
//! `Campaign` and `Observe` calls were seen to hang: a candidacy whose key was already the oldest
//! stayed unanswered for minutes while its node kept the lease alive, so no other node could win
//! that shard either, and observers opened before a shard had a leader never heard of it
//! (`experiments/FINDINGS.md`). Here every wait is our own watch *and* a periodic re-read, so a missed event
//! costs at most one re-read interval. The keys are the ones `etcdctl elect NAME` makes, so it
//! still queues with us.
//!
//! While a campaign waits, two helpers run beside it: `etcd_vacancy` notes when the seat fell
//! free (for the election-latency figure), and `etcd_expiry` revokes the leader's lease once it
//! has provably expired, so a dead leader is not waited on for etcd 3.4's 500 ms lease sweep.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, LeaderKey,
    LeaseKeepAliveStream, LeaseKeeper, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};
use tokio::sync::Mutex;

use super::etcd_expiry::{ExpiryReaper, LeaseTtlReader};
use super::etcd_rpc::{bounded, revoke_lease, unavailable};
use super::etcd_vacancy::VacancyWatch;
use super::renew_batch::SharedLeaderRead;
use super::{
    count_request, BackendKind, DeadHolderExpiry, Elector, ElectorError, ElectorResult, FenceToken,
    Grant, LeaderInfo, Win,
};
use crate::config::{BackendCommon, EtcdConfig, ShardNames};
use crate::shard::ShardId;
use crate::tasks::AbortOnDrop;

struct Session {
    lease_id: i64,
    /// `None` after a failed or timed-out keepalive: the stream may still deliver the answer to an
    /// *earlier* request, which would be credited to a later send time. Reopen instead.
    keepalive: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    last_grant: Grant,
    /// The shard whose renewal sent `last_grant`'s keepalive (`None`: the grant itself). A shard
    /// never takes its own last grant as a renewal: a lone shard renews as an unshared session.
    last_sent_by: Option<u32>,
    /// How many of the sharing electors have a candidacy or a term on this lease; the last one
    /// to close revokes it.
    riders: usize,
}

/// The liveness session every shard elector of one node shares (see the module docs): at most
/// one lease at a time.
struct SharedSession {
    /// A grant sent less than this long ago answers a shard's renewal without a round trip.
    reuse_grant_for: Duration,
    state: Mutex<Option<Session>>,
}

/// The `etcd` backend (see the module docs). Holds at most one candidacy at a time, on its node's
/// shared lease.
pub struct EtcdElector {
    shared: Arc<SharedSession>,
    /// This elector's shard (which of the node's electors sent a keepalive).
    shard: u32,
    /// The node's coalesced leader reads, shared by its shards.
    leaders: Arc<SharedLeaderRead>,
    /// The node's readings of the leases its candidacies queue behind, shared by its shards.
    ttl_reads: Arc<LeaseTtlReader>,
    client: Client,
    name: String,
    value: Vec<u8>,
    ttl_secs: i64,
    timeout: Duration,
    clock_rate_error: f64,
    /// The lease this elector's candidacy or term rides on, while it has one.
    riding: Mutex<Option<i64>>,
    leader_key: Mutex<Option<LeaderKey>>,
    /// Held while a candidacy's put is in flight (the put runs in a task of its own, so an
    /// aborted campaign cannot leave it half done): `close` takes it first, so the withdrawal's
    /// delete never overtakes the put it withdraws.
    putting: Arc<Mutex<()>>,
    /// A waiting campaign or a quiet observer re-reads the election this often, whatever its
    /// watch says: a watch event that never comes costs at most this long.
    recheck: Duration,
}

/// A prefix read of an election's oldest key (its leader): etcd's election `Leader`, client-side.
fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// How often the client pings an idle connection: above etcd's default
/// `--grpc-keepalive-min-time` (5 s), with room for timer slack.
const KEEPALIVE_PING_INTERVAL: Duration = Duration::from_secs(6);

/// The most gets one leader-read transaction carries (etcd refuses more than `--max-txn-ops`,
/// 128 by default).
const TXN_OPS: usize = 128;

/// `opts` over TLS, the servers verified against exactly the CAs in `ca_file` (the endpoints are
/// `https://`, checked by the config).
#[cfg(feature = "tls")]
fn with_tls(opts: ConnectOptions, ca_file: &std::path::Path) -> ElectorResult<ConnectOptions> {
    let ca = crate::tls::CaBundle::read(ca_file)
        .map_err(|e| ElectorError::Config(format!("etcd: {e}")))?;
    let tls =
        etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(ca.pem()));
    Ok(opts.with_tls(tls))
}

#[cfg(not(feature = "tls"))]
fn with_tls(_: ConnectOptions, ca_file: &std::path::Path) -> ElectorResult<ConnectOptions> {
    Err(ElectorError::Config(format!(
        "etcd: tls_ca_file {} is set, but this build of baton has no TLS (cargo feature `tls`)",
        ca_file.display()
    )))
}

impl EtcdElector {
    /// Connects to `etcd.endpoints`; no lease is granted until the first campaign.
    /// `ElectorError::Config` if `lease_ttl_ms` is not a whole number of seconds (etcd leases
    /// are), `ElectorError::Unavailable` if the client cannot be set up within the request
    /// timeout.
    pub async fn connect(common: &BackendCommon, etcd: &EtcdConfig) -> ElectorResult<EtcdElector> {
        let shard = ShardNames::of(ShardId::ZERO);
        let mut one = EtcdElector::connect_shards(common, etcd, &[shard]).await?;
        Ok(one.remove(0))
    }

    /// One elector per shard (`shards`, see `NodeConfig::shard_names`), all on one client and
    /// one shared lease session (`etcd`'s endpoints and TLS, `common`'s timing); each shard's
    /// election is `election_name` with the shard's suffix.
    pub async fn connect_shards(
        common: &BackendCommon,
        etcd: &EtcdConfig,
        shards: &[ShardNames],
    ) -> ElectorResult<Vec<EtcdElector>> {
        if shards.is_empty() {
            return Err(ElectorError::Config("no shard to elect for".into()));
        }
        let lease_ttl_ms = common.lease_ttl.as_millis() as u64;
        if lease_ttl_ms % 1000 != 0 {
            return Err(ElectorError::Config(format!(
                "etcd leases are whole seconds; lease_ttl_ms {lease_ttl_ms} is not"
            )));
        }
        let timeout = Duration::from_millis(etcd.request_timeout_ms);
        // HTTP/2 pings no more often than etcd allows (`--grpc-keepalive-min-time`, 5 s by
        // default): a client that pings faster is sent GOAWAY ("too many pings"), which broke
        // every campaign and watch of the connection at once every few seconds on a quiet
        // connection.
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_keep_alive(KEEPALIVE_PING_INTERVAL, timeout);
        if let Some(ca) = &etcd.tls_ca_file {
            opts = with_tls(opts, ca)?;
        }
        let client = Client::connect(&etcd.endpoints, Some(opts))
            .await
            .map_err(unavailable)?;
        let ttl_secs = (lease_ttl_ms / 1000) as i64;
        let shared = Arc::new(SharedSession {
            reuse_grant_for: common.renew_interval / 2,
            state: Mutex::new(None),
        });
        let me = LeaderInfo {
            node_id: common.node_id.clone(),
            http_addr: common.advertise_addr.clone(),
        };
        let names: Vec<String> = shards
            .iter()
            .map(|s| s.election(&etcd.election_name))
            .collect();
        // etcd's observe streams push every change; a shard re-reads only when its stream has
        // been quiet for 8 retry intervals (see `observe`), so a read half that old is fresh
        // enough, and the node's quiet shards share about one read per second between them.
        let leaders = Arc::new(SharedLeaderRead::new(
            common.retry_interval * 4,
            names.clone(),
        ));
        let ttl_reads = Arc::new(LeaseTtlReader::new(client.clone(), timeout));
        Ok((0u32..)
            .zip(names)
            .map(|(shard, name)| EtcdElector {
                shared: shared.clone(),
                shard,
                leaders: leaders.clone(),
                ttl_reads: ttl_reads.clone(),
                client: client.clone(),
                name,
                value: me.encode(),
                ttl_secs,
                timeout,
                clock_rate_error: common.clock_rate_error,
                riding: Mutex::new(None),
                leader_key: Mutex::new(None),
                putting: Arc::new(Mutex::new(())),
                recheck: common.retry_interval * 8,
            })
            .collect())
    }

    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> ElectorResult<T> {
        bounded(self.timeout, f).await
    }

    /// Boards the node's lease, granting one if there is none (or if the one there has lapsed:
    /// nobody renewed it, e.g. every shard was withdrawn for longer than the TTL). Returns the
    /// lease id; this elector rides on it until `close` or a lost lease.
    async fn board_session(&self) -> ElectorResult<i64> {
        let mut guard = self.shared.state.lock().await;
        let mut riding = self.riding.lock().await;
        if let Some(s) = guard.as_mut() {
            let lapsed = s.last_grant.sent_at.elapsed() >= s.last_grant.ttl;
            if !lapsed || s.riders > 0 {
                if *riding != Some(s.lease_id) {
                    s.riders += 1;
                    *riding = Some(s.lease_id);
                }
                return Ok(s.lease_id);
            }
            *guard = None;
        }
        let sent_at = Instant::now();
        let mut c = self.client.clone();
        count_request(BackendKind::Etcd, "lease-grant");
        let resp = self.bounded(c.lease_grant(self.ttl_secs, None)).await?;
        let grant = Grant {
            sent_at,
            ttl: Duration::from_secs(resp.ttl().max(0) as u64),
        };
        *guard = Some(Session {
            lease_id: resp.id(),
            keepalive: None,
            last_grant: grant,
            last_sent_by: None,
            riders: 1,
        });
        *riding = Some(resp.id());
        Ok(resp.id())
    }

    /// Who leads each of the node's shards' elections: per election, the key under `NAME/` with
    /// the lowest create revision (what etcd's election `Leader` call answers), all read in
    /// transactions of at most [`TXN_OPS`] gets (etcd's default `--max-txn-ops` is 128).
    async fn read_leaders(&self) -> ElectorResult<BTreeMap<String, LeaderInfo>> {
        let mut out = BTreeMap::new();
        for names in self.leaders.names.chunks(TXN_OPS) {
            let gets: Vec<TxnOp> = names
                .iter()
                .map(|n| TxnOp::get(format!("{n}/"), Some(first_created())))
                .collect();
            let mut c = self.client.clone();
            count_request(BackendKind::Etcd, "leader");
            let resp = self.bounded(c.txn(Txn::new().and_then(gets))).await?;
            for (name, answer) in names.iter().zip(resp.op_responses()) {
                if let TxnOpResponse::Get(got) = answer {
                    if let Some(kv) = got.kvs().first() {
                        out.insert(name.clone(), LeaderInfo::decode(kv.value()));
                    }
                }
            }
        }
        Ok(out)
    }

    /// This elector's candidacy on lease `lease`: the key etcd's election API (and `etcdctl
    /// elect`) makes, `NAME/<lease in hex>`.
    fn candidacy_key(&self, lease: i64) -> String {
        format!("{}/{lease:x}", self.name)
    }

    /// Who leads this elector's election: the key under `NAME/` with the lowest create revision
    /// (what etcd's election `Leader` call answers), read afresh for this election alone.
    async fn head(&self) -> ElectorResult<Option<etcd_client::KeyValue>> {
        let mut c = self.client.clone();
        count_request(BackendKind::Etcd, "head");
        let resp = self
            .bounded(c.get(format!("{}/", self.name), Some(first_created())))
            .await?;
        Ok(resp.kvs().first().cloned())
    }

    /// Puts our candidacy `key` on `lease_id` unless it exists, and answers its create revision
    /// (an existing one is ours already: same key, same lease, so it keeps its place). The put
    /// runs in a task of its own holding `putting`, so a campaign aborted meanwhile cannot strand
    /// it: `close` waits for it before deleting the key.
    async fn put_candidacy(&self, key: &str, lease_id: i64) -> ElectorResult<i64> {
        let held = self.putting.clone().lock_owned().await;
        let (mut c, timeout) = (self.client.clone(), self.timeout);
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                self.value.clone(),
                Some(PutOptions::new().with_lease(lease_id)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let put = tokio::spawn(async move {
            let _held = held;
            count_request(BackendKind::Etcd, "campaign");
            bounded(timeout, c.txn(txn)).await
        });
        let resp = put.await.map_err(unavailable)??;
        if resp.succeeded() {
            // The put's revision is the key's create revision.
            return resp
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| unavailable("the candidacy put answered without a header"));
        }
        match resp.op_responses().first() {
            Some(TxnOpResponse::Get(got)) => got
                .kvs()
                .first()
                .map(|kv| kv.create_revision())
                // Gone between the compare and the get: our lease lapsed under it.
                .ok_or_else(|| ElectorError::LeaseLost(format!("candidacy {key} vanished"))),
            _ => Err(unavailable("the candidacy put answered without its key")),
        }
    }

    /// Waits until no candidacy under `prefix` is older than ours (`my_rev`): then we lead.
    /// Woken by `deletions` (the vacancy watch), and re-reads every `recheck` whatever it says.
    /// `LeaseLost` if our own key is gone (its lease lapsed, or the failure detector ended it).
    async fn wait_until_oldest(
        &self,
        prefix: &str,
        key: &str,
        my_rev: i64,
        deletions: Option<Arc<tokio::sync::Notify>>,
    ) -> ElectorResult<()> {
        loop {
            // Registered before the read, so a deletion in between wakes the wait below.
            let notified = deletions.as_deref().map(tokio::sync::Notify::notified);
            let mut notified = std::pin::pin!(notified);
            if let Some(n) = notified.as_mut().as_pin_mut() {
                n.enable();
            }
            let older = GetOptions::new()
                .with_prefix()
                .with_keys_only()
                .with_max_create_revision(my_rev - 1)
                .with_limit(1);
            let read = Txn::new().and_then([
                TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
                TxnOp::get(prefix, Some(older)),
            ]);
            let mut c = self.client.clone();
            count_request(BackendKind::Etcd, "campaign-check");
            let resp = self.bounded(c.txn(read)).await?;
            let count = |i: usize| match resp.op_responses().get(i) {
                Some(TxnOpResponse::Get(got)) => got.kvs().len(),
                _ => 0,
            };
            if count(0) == 0 {
                return Err(ElectorError::LeaseLost(format!(
                    "candidacy {key} is gone (its lease ended)"
                )));
            }
            if count(1) == 0 {
                return Ok(());
            }
            let woken = async {
                match notified.as_mut().as_pin_mut() {
                    Some(n) => n.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep(self.recheck) => {}
            }
        }
    }

    /// Deletes our term's key if it is still the one we won with (compared by create revision,
    /// so a later candidacy under the same lease is never touched).
    async fn delete_term_key(&self, key: &LeaderKey) -> ElectorResult<()> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.key(),
                CompareOp::Equal,
                key.rev(),
            )])
            .and_then([TxnOp::delete(key.key(), None)]);
        self.delete_retried(txn, "resign").await
    }

    /// Sends a deleting `txn` (counted as `op`), retried: a key left behind rides on a lease the
    /// node's other shards keep alive, and would hold its election's seat until the node stops.
    async fn delete_retried(&self, txn: Txn, op: &'static str) -> ElectorResult<()> {
        let mut last = Ok(());
        for attempt in 0..3u32 {
            if attempt > 0 {
                tokio::time::sleep(self.timeout / 2).await;
            }
            let mut c = self.client.clone();
            count_request(BackendKind::Etcd, op);
            last = self.bounded(c.txn(txn.clone())).await.map(drop);
            if last.is_ok() {
                break;
            }
        }
        last
    }

    /// The session's lease is gone (expired, or another shard found it so): every rider's
    /// candidacy and term ended with it.
    async fn lease_lost(&self, guard: &mut Option<Session>, id: i64) -> ElectorError {
        if guard.as_ref().is_some_and(|s| s.lease_id == id) {
            *guard = None;
        }
        *self.riding.lock().await = None;
        *self.leader_key.lock().await = None;
        ElectorError::LeaseLost(format!("etcd lease {id:x} expired"))
    }
}

#[async_trait]
impl Elector for EtcdElector {
    fn kind(&self) -> BackendKind {
        BackendKind::Etcd
    }

    async fn campaign(&self) -> ElectorResult<Win> {
        let lease_id = self.board_session().await?;
        let started = Instant::now();
        let prefix = format!("{}/", self.name);
        let vacancy = VacancyWatch::open(&self.client, &prefix, self.timeout).await;
        let reaper = AbortOnDrop(tokio::spawn(
            ExpiryReaper {
                client: self.client.clone(),
                ttl_reads: self.ttl_reads.clone(),
                prefix: prefix.clone(),
                our_lease: lease_id,
                clock_rate_error: self.clock_rate_error,
                timeout: self.timeout,
                deletions: vacancy.as_ref().map(|v| v.deletions()),
                lease_ttl: Duration::from_secs(self.ttl_secs as u64),
            }
            .run(),
        ));
        let key = self.candidacy_key(lease_id);
        let waited = async {
            let my_rev = self.put_candidacy(&key, lease_id).await?;
            let deletions = vacancy.as_ref().map(|v| v.deletions());
            self.wait_until_oldest(&prefix, &key, my_rev, deletions)
                .await
                .map(|()| my_rev)
        };
        // Unbounded by design: a campaign returns when every older candidacy is gone.
        let my_rev = waited.await?;
        drop(reaper);
        let key = LeaderKey::new()
            .with_name(self.name.clone())
            .with_key(key)
            .with_rev(my_rev)
            .with_lease(lease_id);
        let token = FenceToken::checked("etcd revision", key.rev())?;
        let vacant_since = match vacancy {
            Some(v) => v.vacant_since(key.rev(), started).await,
            None => None,
        };
        *self.leader_key.lock().await = Some(key);
        let grant = self
            .shared
            .state
            .lock()
            .await
            .as_ref()
            .filter(|s| s.lease_id == lease_id)
            .map(|s| s.last_grant)
            .ok_or_else(|| ElectorError::LeaseLost("session closed during campaign".into()))?;
        Ok(Win {
            token,
            grant,
            vacant_since,
        })
    }

    async fn renew(&self) -> ElectorResult<Option<Grant>> {
        let mut guard = self.shared.state.lock().await;
        let riding = *self.riding.lock().await;
        let session = match (guard.as_mut(), riding) {
            (_, None) => return Ok(None),
            (Some(s), Some(id)) if s.lease_id == id => s,
            // Another shard found our lease gone (and may have boarded a new one since).
            (_, Some(id)) => return Err(self.lease_lost(&mut guard, id).await),
        };
        let lease_id = session.lease_id;
        if session.keepalive.is_some()
            && session.last_sent_by.is_some_and(|s| s != self.shard)
            && session.last_grant.sent_at.elapsed() < self.shared.reuse_grant_for
        {
            return Ok(Some(session.last_grant));
        }
        if session.keepalive.is_none() {
            let mut c = self.client.clone();
            count_request(BackendKind::Etcd, "keepalive-open");
            match tokio::time::timeout(self.timeout, c.lease_keep_alive(lease_id)).await {
                Ok(Ok(pair)) => session.keepalive = Some(pair),
                // Opening the stream answers TTL 0 for a lease that is gone: that is a loss,
                // not an outage (else a lapsed session is retried as "unavailable" forever).
                Ok(Err(etcd_client::Error::LeaseKeepAliveError(msg)))
                    if msg.contains("lease not found") =>
                {
                    return Err(self.lease_lost(&mut guard, lease_id).await);
                }
                Ok(Err(e)) => return Err(unavailable(e)),
                Err(_) => {
                    return Err(ElectorError::Unavailable(format!(
                        "keepalive not opened within {:?}",
                        self.timeout
                    )))
                }
            }
        }
        let (keeper, stream) = session.keepalive.as_mut().expect("opened above");
        let sent_at = Instant::now();
        count_request(BackendKind::Etcd, "keepalive");
        let answer = tokio::time::timeout(self.timeout, async {
            keeper.keep_alive().await?;
            stream.message().await
        })
        .await;
        match answer {
            Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                let grant = Grant {
                    sent_at,
                    ttl: Duration::from_secs(resp.ttl() as u64),
                };
                session.last_grant = grant;
                session.last_sent_by = Some(self.shard);
                Ok(Some(grant))
            }
            Ok(Ok(Some(_))) => Err(self.lease_lost(&mut guard, lease_id).await),
            Ok(Ok(None)) => {
                session.keepalive = None;
                Err(unavailable("keepalive stream closed"))
            }
            Ok(Err(e)) => {
                session.keepalive = None;
                Err(unavailable(e))
            }
            Err(_) => {
                session.keepalive = None;
                Err(ElectorError::Unavailable(format!(
                    "keepalive not answered within {:?}",
                    self.timeout
                )))
            }
        }
    }

    async fn resign(&self, successor: Option<&str>) -> ElectorResult<()> {
        if successor.is_some() {
            return Err(ElectorError::Unsupported {
                backend: BackendKind::Etcd,
                what: "naming a successor",
            });
        }
        let Some(key) = self.leader_key.lock().await.take() else {
            return Ok(());
        };
        self.delete_term_key(&key).await
    }

    async fn leader(&self) -> ElectorResult<Option<LeaderInfo>> {
        self.leaders
            .leader(self.shard, &self.name, || self.read_leaders())
            .await
    }

    /// A linearizable (quorum) read of the election's leader key, checked against ours: the
    /// oldest key under the election prefix must be the one we created, at `token`'s revision.
    async fn confirm_leadership(&self, _me: &str, token: FenceToken) -> ElectorResult<bool> {
        let Some(ours) = self.leader_key.lock().await.clone() else {
            return Ok(false);
        };
        count_request(BackendKind::Etcd, "confirm");
        Ok(self.head().await?.is_some_and(|kv| {
            kv.key() == ours.key() && kv.create_revision() == token.0 && ours.rev() == token.0
        }))
    }

    /// Revokes the lease of the election's leader key if that key names `dead`: the key (and
    /// every other key of the dead node's session) goes with it, and the next candidacy in line,
    /// watching that key, wins at once. The lease id is the dead session's own: a restarted node
    /// has a new one, so this never ends a live session of the same node. A waiting campaign
    /// watches the key ahead of it and is woken by the deletion.
    async fn expire_dead_holder(&self, dead: &str) -> ElectorResult<DeadHolderExpiry> {
        if LeaderInfo::decode(&self.value).node_id == dead {
            return Ok(DeadHolderExpiry::NotEnded);
        }
        let Some(kv) = self.head().await? else {
            return Ok(DeadHolderExpiry::NotEnded);
        };
        if kv.lease() == 0 || LeaderInfo::decode(kv.value()).node_id != dead {
            return Ok(DeadHolderExpiry::NotEnded);
        }
        let revoked = revoke_lease(&self.client, kv.lease(), self.timeout, "expire_dead").await?;
        if revoked {
            tracing::info!(election = %self.name, dead, lease = kv.lease(), "revoked a dead holder's lease");
            return Ok(DeadHolderExpiry::EndedCampaignWakes);
        }
        Ok(DeadHolderExpiry::NotEnded)
    }

    /// A watch on the election's keys: a deletion (or the first candidacy) re-reads the head at
    /// once; a quiet watch is re-checked every `recheck` through the node's shared leader read,
    /// so a leader that vanished without an event, or a watch that stopped delivering, is
    /// noticed within that.
    async fn observe(&self, tx: tokio::sync::watch::Sender<Option<LeaderInfo>>, every: Duration) {
        let publish = |info: Option<LeaderInfo>| {
            tx.send_if_modified(|cur| {
                let changed = *cur != info;
                *cur = info;
                changed
            });
        };
        let prefix = format!("{}/", self.name);
        while !tx.is_closed() {
            // Watched before the first read, so a change in between is not missed.
            let mut c = self.client.clone();
            count_request(BackendKind::Etcd, "observe");
            let watch = self
                .bounded(c.watch(prefix.as_str(), Some(WatchOptions::new().with_prefix())))
                .await;
            if let Ok(head) = self.head().await {
                publish(head.map(|kv| LeaderInfo::decode(kv.value())));
            }
            if let Ok(mut stream) = watch {
                loop {
                    let fresh = match tokio::time::timeout(self.recheck, stream.message()).await {
                        Ok(Ok(Some(resp))) if resp.canceled() => break,
                        Ok(Ok(Some(resp))) => {
                            let unknown = tx.borrow().is_none();
                            let moved = resp
                                .events()
                                .iter()
                                .any(|e| e.event_type() == EventType::Delete || unknown);
                            if !moved {
                                continue;
                            }
                            self.head()
                                .await
                                .map(|h| h.map(|kv| LeaderInfo::decode(kv.value())))
                        }
                        Ok(_) => break,
                        // Quiet: re-check (the leader may have gone with no event seen).
                        Err(_) => self.leader().await,
                    };
                    match fresh {
                        Ok(info) => publish(info),
                        Err(_) => break,
                    }
                    if tx.is_closed() {
                        return;
                    }
                }
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Withdraws this elector's candidacy or term. The last rider of the node's lease revokes it
    /// (with one shard: always, as an unshared session would); otherwise only this shard's key is
    /// deleted (`NAME/<lease in hex>`, the key etcd's election API made for the candidacy), so the
    /// other shards keep theirs.
    async fn close(&self) -> ElectorResult<()> {
        // A put still in flight (an aborted campaign's) lands first, then is withdrawn below.
        let _put_done = self.putting.lock().await;
        *self.leader_key.lock().await = None;
        let mut guard = self.shared.state.lock().await;
        let Some(id) = self.riding.lock().await.take() else {
            return Ok(());
        };
        let Some(session) = guard.as_mut().filter(|s| s.lease_id == id) else {
            return Ok(()); // that lease is already gone, and its keys with it
        };
        session.riders = session.riders.saturating_sub(1);
        if session.riders == 0 {
            *guard = None;
            drop(guard);
            // Already expired (`false`): nothing left to withdraw.
            return revoke_lease(&self.client, id, self.timeout, "lease-revoke")
                .await
                .map(drop);
        }
        drop(guard);
        let candidacy = self.candidacy_key(id);
        self.delete_retried(
            Txn::new().and_then([TxnOp::delete(candidacy, None)]),
            "withdraw",
        )
        .await
    }
}
