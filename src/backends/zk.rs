//! ZooKeeper: the recipe from ZooKeeper's own documentation ("Leader Election"), with
//! zookeeper-client.
//!
//! * **candidacy** — an `EPHEMERAL_SEQUENTIAL` znode `<election_path>/c_<session>_<seq>` holding
//!   this node's [`LeaderInfo`] JSON, created in the candidacy session (parents created on first
//!   use). The `<session>` part names our own nodes, so a create whose answer was lost (a timeout,
//!   a dropped campaign) is found and adopted instead of queueing a second candidacy.
//! * **leader** — the child with the lowest sequence number. A waiter watches **only its
//!   predecessor** (`exists` watch on the next-lower child), so a release wakes exactly one
//!   waiter: no herd. When the predecessor goes, the waiter re-lists: it leads if it is now the
//!   lowest, else it watches its new predecessor (a waiter in the middle of the queue may go).
//! * **token** — our znode's `czxid`, the zxid of its creation. zxids only grow, the leader is
//!   always the oldest live candidacy, so each holder's czxid is above every earlier holder's.
//! * **resign** — delete our znode (the successor's watch fires at once). **close** — delete it
//!   and close the session.
//!
//! **Liveness is what `renew()` renews.** ZooKeeper's client pings keep a session alive on their
//! own, so a node whose elector stopped renewing (wedged) would keep its candidacy forever. To give
//! the seam's contract, each session has a local watchdog: when no renewal succeeded within the
//! last grant, the session is closed (its znode goes with it) and the next `renew()` reports
//! `LeaseLost`. The same covers a connection that is SUSPENDED (disconnected) for longer than
//! the safe bound: no renewal succeeds while disconnected, so the last grant runs out, the node's
//! watchdog demotes, and the session is dropped even if the server would still keep it.
//!
//! **The grant.** `renew()` is `sync` + `exists(our znode)`, pipelined: `sync` is answered only
//! after a round trip to the ensemble's leader, so a partitioned follower cannot keep answering.
//! The grant is **2/3 of the negotiated session timeout** from the send time, not the whole
//! timeout: a follower relays its clients' session touches to the ZooKeeper leader only on its
//! next learner ping (every tickTime / 2), and the client pings only every 3/20 of the timeout, so
//! the leader's idea of our last touch can lag our send by up to about `tick/2 + 0.15 × timeout`
//! (0.2 × timeout with the fleet's `tickTime = TTL / 10`). A node killed with `kill -9` is expired
//! by the servers after the full session timeout (rounded up to whole ticks), which is what
//! failover takes.
//!
//! Reads for [`Elector::leader`] and the observe watch use a second, read-only session, so the
//! candidacy session's end never blinds the node to who leads.
//!
//! **Shards share both sessions.** A node's shard electors ([`ZkElector::connect_shards`]) hold
//! one candidacy session and one read-only session between them; each shard's znode lives in its
//! own election path inside the shared candidacy session. One renewal (the node's
//! `RenewBatch`) is a `sync` pipelined with one multi-read of every held znode, so the node sends
//! two requests per renew interval whatever K is, and the local watchdog judges the session by
//! the newest renewal of any shard. A shard whose znode is gone loses its term alone; a session
//! that ends (expired, or the watchdog gave it up) ends every shard's candidacy in it, and each
//! shard is told at its next renewal. The last shard to close closes the session. At K = 1 the
//! lone shard sends exactly what it sent before sharing.
//!
//! **Observing the leader.** Each shard's observe loop keeps a watch on its election's lowest
//! znode (or on the children while there is no candidate), so a leader change is seen at the
//! watch's event, as with one shard. When a watch has been quiet for a while the loop re-checks
//! that the lowest znode is still the one it watches (a backstop: nothing else would notice a
//! watch that never fires). Those quiet re-checks are shared per node (`SharedLeaderRead`, as
//! etcd, pg-lease and redis share their leader polls): one multi-read of every election's
//! children answers the re-checks of all the node's shards, and only a shard whose election
//! changed re-lists and re-watches on its own. The watches are kept across re-checks that find
//! nothing new, so a quiet node sends about one read per `RECHECK_REUSE_INTERVALS` retry
//! intervals whatever K.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use zookeeper_client as zkc;
use zookeeper_client::{Acls, CreateMode, SessionState};

use super::renew_batch::{RenewBatch, Renewed, SharedLeaderRead};
use super::{
    count_request, BackendKind, DeadHolderExpiry, Elector, ElectorError, ElectorResult, FenceToken,
    Grant, LeaderInfo, Win,
};
use crate::config::{BackendCommon, ShardNames, ZkConfig};
use crate::shard::ShardId;

/// Our candidacy znodes are `c_<session id, 16 hex digits>_<10-digit sequence>`.
const PREFIX: &str = "c_";

/// The fraction of the negotiated session timeout a renewal grants (see the module doc).
const GRANT_NUM: u32 = 2;
const GRANT_DEN: u32 = 3;

/// An observe loop whose watch has been quiet this many retry intervals re-checks its election's
/// lowest znode (a backstop for a watch that never fires; a change itself is seen by the watch).
const QUIET_RECHECK_INTERVALS: u32 = 20;

/// A quiet re-check takes another shard's shared read when it is younger than this many retry
/// intervals. With [`QUIET_RECHECK_INTERVALS`] a change a watch missed is still seen within 30
/// retry intervals at worst, as when every shard re-listed its election alone after 30; the node
/// reads about once per this many intervals, whatever K.
const RECHECK_REUSE_INTERVALS: u32 = 10;

/// Elections per multi-read of the quiet re-checks: one request up to K = 1024. Both the request
/// (a path each) and its answer (about 30 bytes per candidate znode name: some 300 KiB at 9
/// candidates per election) stay well inside ZooKeeper's default 1 MiB packet limit
/// (`jute.maxbuffer`).
const RECHECK_READ_OPS: usize = 1024;

#[derive(Clone, Debug)]
struct Node {
    name: String,
    path: String,
    czxid: i64,
}

/// The node's candidacy session: one ZooKeeper session that every shard's candidacy znode is
/// created in (their elections differ only in the path).
struct Session {
    gen: u64,
    client: zkc::Client,
    id: i64,
    timeout: Duration,
    grant_ttl: Duration,
    /// The newest renewal that succeeded, by any shard: the session's own liveness.
    last_grant: Grant,
}

#[derive(Default)]
struct HubState {
    session: Option<Session>,
    /// Why candidacy session `.0` ended (told to each shard that had a candidacy in it).
    lost: Option<(u64, String)>,
    next_gen: u64,
    /// The shards with a candidacy in the current session; the last to close closes it.
    riders: BTreeSet<u32>,
}

/// What one node's shards share (see the module docs): the candidacy session with its local
/// watchdog, the read-only session, and the coalesced renewals.
struct Hub {
    connect: String,
    requested_timeout: Duration,
    timeout: Duration,
    connect_timeout: Duration,
    state: StdMutex<HubState>,
    reader: tokio::sync::Mutex<Option<zkc::Client>>,
    /// One `sync` plus one `exists` per held znode renews every shard of the node. A lease is a
    /// session generation and the shard's znode in it (`None`: a candidacy without a znode yet,
    /// which needs only the session kept alive).
    batch: RenewBatch<(u64, Option<String>)>,
    /// The observe loops' quiet re-checks, shared: the name of each election's lowest znode, by
    /// election path (every shard's path, in shard order, is its `names`).
    quiet_rechecks: SharedLeaderRead<String>,
}

/// One shard's candidacy, tied to the session generation it was made in.
struct Candidacy {
    gen: u64,
    node: Option<Node>,
    /// A create was sent whose answer we may not have seen: look for our node before creating.
    create_unconfirmed: bool,
    leading: bool,
}

/// The `zk` backend (see the module docs): one shard's election, on its node's shared sessions.
pub struct ZkElector {
    hub: Arc<Hub>,
    shard: u32,
    path: String,
    value: Vec<u8>,
    mine: StdMutex<Option<Candidacy>>,
}

fn count(op: &'static str) {
    count_request(BackendKind::Zk, op);
}

fn session_over(e: &zkc::Error) -> bool {
    matches!(
        e,
        zkc::Error::SessionExpired
            | zkc::Error::ClientClosed
            | zkc::Error::SessionMoved
            | zkc::Error::AuthFailed
    )
}

/// The sequence number at the end of a child's name (any recipe's: `..._0000000012`).
fn sequence_of(name: &str) -> Option<i64> {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return None;
    }
    name[name.len() - digits..].parse().ok()
}

/// Children ordered by sequence: the queue, leader first.
fn queue(children: Vec<String>) -> Vec<(i64, String)> {
    let mut q: Vec<(i64, String)> = children
        .into_iter()
        .filter_map(|c| sequence_of(&c).map(|s| (s, c)))
        .collect();
    q.sort();
    q
}

fn own_prefix(id: i64) -> String {
    format!("{PREFIX}{:016x}_", id as u64)
}

fn session_ended() -> ElectorError {
    ElectorError::LeaseLost("zookeeper session ended while campaigning".into())
}

impl Hub {
    fn state(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, zkc::Error>>,
    ) -> Result<T, ZkFailure> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if session_over(&e) => Err(ZkFailure::SessionOver(e.to_string())),
            Ok(Err(e)) => Err(ZkFailure::Other(e)),
            Err(_) => Err(ZkFailure::Timeout(self.timeout)),
        }
    }

    async fn new_client(&self) -> ElectorResult<zkc::Client> {
        count("connect");
        let connecting = zkc::Client::connector()
            .with_session_timeout(self.requested_timeout)
            .with_fail_eagerly()
            .connect(&self.connect);
        // It retries a closed port forever without a bound of our own.
        match tokio::time::timeout(self.connect_timeout, connecting).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(ElectorError::Unavailable(format!(
                "zookeeper {}: {e}",
                self.connect
            ))),
            Err(_) => Err(ElectorError::Unavailable(format!(
                "zookeeper {}: no session within {:?}",
                self.connect, self.connect_timeout
            ))),
        }
    }

    /// The candidacy session: the live one, or a new one (with its local watchdog).
    async fn candidacy_session(self: &Arc<Self>) -> ElectorResult<(zkc::Client, u64)> {
        {
            let mut st = self.state();
            if let Some(s) = &st.session {
                if !s.client.state().is_terminated() {
                    return Ok((s.client.clone(), s.gen));
                }
                st.session = None;
            }
        }
        let sent_at = Instant::now();
        let client = self.new_client().await?;
        let timeout = client.session_timeout();
        let grant_ttl = timeout * GRANT_NUM / GRANT_DEN;
        let mut st = self.state();
        if let Some(s) = &st.session {
            // A concurrent call made one first: use it, drop ours (closes it).
            return Ok((s.client.clone(), s.gen));
        }
        st.next_gen += 1;
        let gen = st.next_gen;
        st.riders.clear();
        st.session = Some(Session {
            gen,
            id: client.session_id().0,
            client: client.clone(),
            timeout,
            grant_ttl,
            last_grant: Grant {
                sent_at,
                ttl: grant_ttl,
            },
        });
        drop(st);
        tracing::debug!(session = %client.session_id(), ?timeout, "zookeeper candidacy session");
        spawn_watchdog(Arc::downgrade(self), gen);
        Ok((client, gen))
    }

    /// The live candidacy session `gen`'s client and id, if it is still the current one.
    fn session_of(&self, gen: u64) -> Option<(zkc::Client, i64)> {
        let st = self.state();
        st.session
            .as_ref()
            .filter(|s| s.gen == gen && !s.client.state().is_terminated())
            .map(|s| (s.client.clone(), s.id))
    }

    /// Ends the candidacy session `gen` (if still current); `lost` is kept for its shards.
    fn end_session(&self, gen: u64, lost: Option<String>) -> Option<zkc::Client> {
        let mut st = self.state();
        if st.session.as_ref().is_some_and(|s| s.gen == gen) {
            let s = st.session.take().expect("checked");
            st.lost = lost.map(|why| (gen, why));
            Some(s.client)
        } else {
            None
        }
    }

    /// Why session `gen` is over, for a shard that had a candidacy in it; `None` while it lives.
    fn why_over(&self, gen: u64) -> Option<String> {
        let mut st = self.state();
        if let Some(s) = st.session.as_ref().filter(|s| s.gen == gen) {
            if !s.client.state().is_terminated() {
                return None;
            }
            let why = format!(
                "zookeeper session {:#x} is {}",
                s.id,
                match s.client.state() {
                    SessionState::Expired => "expired",
                    SessionState::AuthFailed => "refused (auth failed)",
                    _ => "closed",
                }
            );
            st.session = None;
            st.lost = Some((gen, why.clone()));
            return Some(why);
        }
        Some(match &st.lost {
            Some((g, why)) if *g == gen => why.clone(),
            _ => format!("zookeeper candidacy session (generation {gen}) ended"),
        })
    }

    /// Records `g` as session `gen`'s newest renewal; the session's newest grant after it.
    fn note_grant(&self, gen: u64, g: Grant) -> Option<Grant> {
        let mut st = self.state();
        let s = st.session.as_mut().filter(|s| s.gen == gen)?;
        if g.sent_at > s.last_grant.sent_at {
            s.last_grant = g;
        }
        Some(s.last_grant)
    }

    /// One renewal for every lease in `leases`: `sync` (answered only after a round trip to the
    /// ensemble's leader) pipelined with one multi-read of every znode. Whether each lease still
    /// holds: its session is the current one, alive, and its znode (if any) still there.
    async fn renew_all(&self, leases: Vec<(u64, Option<String>)>) -> ElectorResult<Vec<bool>> {
        let (client, gen, grant_ttl) = {
            let st = self.state();
            match st.session.as_ref() {
                Some(s) if !s.client.state().is_terminated() => {
                    (s.client.clone(), s.gen, s.grant_ttl)
                }
                _ => return Ok(vec![false; leases.len()]),
            }
        };
        let sent_at = Instant::now();
        count("renew-sync");
        // Any path will do: `sync` is a round trip to the ensemble's leader whatever it names.
        let sync = client.sync("/");
        // Every held znode in one multi-read request (ZooKeeper 3.6+), pipelined behind the
        // `sync`: the node's renewal is two requests whatever the number of its shards.
        let held: Vec<&String> = leases
            .iter()
            .filter_map(|(g, p)| p.as_ref().filter(|_| *g == gen))
            .collect();
        let mut reader = client.new_multi_reader();
        for p in &held {
            if let Err(e) = reader.add_get_data(p) {
                return Err(ElectorError::Unavailable(format!("zookeeper: {e}")));
            }
        }
        if !held.is_empty() {
            count("renew-check");
        }
        let checked = reader.commit();
        let answer =
            tokio::time::timeout(self.timeout, async { (sync.await, checked.await) }).await;
        let (synced, checked) = match answer {
            Ok(r) => r,
            Err(_) => return Err(ZkFailure::Timeout(self.timeout).into_err()),
        };
        let mut failure = synced.err();
        let mut there = Vec::with_capacity(held.len());
        match checked {
            Ok(results) => {
                for r in results {
                    there.push(match r {
                        zkc::MultiReadResult::Data { .. } => true,
                        zkc::MultiReadResult::Error {
                            err: zkc::Error::NoNode,
                        } => false,
                        zkc::MultiReadResult::Error { err } => {
                            failure.get_or_insert(err);
                            false
                        }
                        _ => false,
                    });
                }
            }
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
        let mut there = there.into_iter();
        let found: Vec<bool> = leases
            .iter()
            .map(|(g, p)| match p.as_ref().filter(|_| *g == gen) {
                Some(_) => there.next().unwrap_or(false),
                None => true,
            })
            .collect();
        if let Some(e) = failure {
            if session_over(&e) {
                drop(client);
                drop(self.end_session(gen, None));
                return Err(ElectorError::LeaseLost(format!(
                    "zookeeper session ended: {e}"
                )));
            }
            return Err(ElectorError::Unavailable(format!("zookeeper: {e}")));
        }
        // A grant that arrives after the local watchdog gave the session up revives nothing.
        if self
            .note_grant(
                gen,
                Grant {
                    sent_at,
                    ttl: grant_ttl,
                },
            )
            .is_none()
        {
            return Err(ElectorError::LeaseLost(
                "zookeeper session closed: no renewal within the grant".into(),
            ));
        }
        Ok(leases
            .iter()
            .zip(found)
            .map(|((g, _), found)| *g == gen && found)
            .collect())
    }

    /// The read-only session, (re)connected when needed.
    async fn reader(&self) -> ElectorResult<zkc::Client> {
        let mut guard = self.reader.lock().await;
        if let Some(c) = guard.as_ref() {
            if !c.state().is_terminated() {
                return Ok(c.clone());
            }
        }
        let c = self.new_client().await?;
        *guard = Some(c.clone());
        Ok(c)
    }

    async fn reset_reader(&self) {
        *self.reader.lock().await = None;
    }

    /// The lowest znode of every election of the node's shards (an election with no candidate,
    /// or no path yet, is left out): one multi-read of their children on the read-only session
    /// per [`RECHECK_READ_OPS`] elections.
    async fn read_lowest_children(&self) -> ElectorResult<BTreeMap<String, String>> {
        let client = self.reader().await?;
        let mut lowest = BTreeMap::new();
        for paths in self.quiet_rechecks.names.chunks(RECHECK_READ_OPS) {
            let mut reader = client.new_multi_reader();
            for p in paths {
                if let Err(e) = reader.add_get_children(p) {
                    return Err(ElectorError::Unavailable(format!("zookeeper: {e}")));
                }
            }
            count("read-recheck");
            let answers = match self.bounded(reader.commit()).await {
                Ok(a) => a,
                Err(e) => {
                    if matches!(e, ZkFailure::SessionOver(_)) {
                        self.reset_reader().await;
                    }
                    return Err(e.into_err());
                }
            };
            for (path, answer) in paths.iter().zip(answers) {
                match answer {
                    zkc::MultiReadResult::Children { children } => {
                        if let Some((_, first)) = queue(children).into_iter().next() {
                            lowest.insert(path.clone(), first);
                        }
                    }
                    zkc::MultiReadResult::Error {
                        err: zkc::Error::NoNode,
                    } => {}
                    zkc::MultiReadResult::Error { err } => {
                        return Err(ElectorError::Unavailable(format!("zookeeper: {err}")))
                    }
                    other => {
                        return Err(ElectorError::Unavailable(format!(
                            "zookeeper: a children read answered {other:?}"
                        )))
                    }
                }
            }
        }
        Ok(lowest)
    }
}

/// A failed request, before it becomes an [`ElectorError`].
enum ZkFailure {
    SessionOver(String),
    Other(zkc::Error),
    Timeout(Duration),
}

impl ZkFailure {
    fn into_err(self) -> ElectorError {
        match self {
            ZkFailure::SessionOver(e) => {
                ElectorError::LeaseLost(format!("zookeeper session ended: {e}"))
            }
            ZkFailure::Other(e) => ElectorError::Unavailable(format!("zookeeper: {e}")),
            ZkFailure::Timeout(t) => {
                ElectorError::Unavailable(format!("zookeeper did not answer within {t:?}"))
            }
        }
    }
}

/// Closes candidacy session `gen` when no renewal (by any of the node's shards) succeeded within
/// its last grant.
fn spawn_watchdog(hub: Weak<Hub>, gen: u64) {
    tokio::spawn(async move {
        loop {
            let deadline = {
                let Some(hub) = hub.upgrade() else { return };
                let st = hub.state();
                match st.session.as_ref().filter(|s| s.gen == gen) {
                    Some(s) => s.last_grant.sent_at + s.last_grant.ttl,
                    None => return,
                }
            };
            tokio::time::sleep_until(deadline.into()).await;
            let Some(hub) = hub.upgrade() else { return };
            let expired = {
                let st = hub.state();
                match st.session.as_ref().filter(|s| s.gen == gen) {
                    Some(s) => {
                        let end = s.last_grant.sent_at + s.last_grant.ttl;
                        (Instant::now() >= end).then_some((s.id, s.timeout, st.riders.len()))
                    }
                    None => return,
                }
            };
            if let Some((id, timeout, shards)) = expired {
                let why = format!(
                    "no renewal of zookeeper session {id:#x} succeeded within its grant \
                     (2/3 of the {timeout:?} session timeout): session closed"
                );
                tracing::warn!(shards, "{why}");
                // Dropping the last client handle closes the session; its znodes go with it.
                drop(hub.end_session(gen, Some(why)));
                return;
            }
        }
    });
}

impl ZkElector {
    /// Checks the configuration; no session is opened until first use, so an ensemble that is
    /// down at start shows up as failed, retried campaigns. `ElectorError::Config` if
    /// `zk.election_path` is not an absolute path below `/` or `zk.connect` is empty.
    pub async fn connect(common: &BackendCommon, zk: &ZkConfig) -> ElectorResult<ZkElector> {
        let shard = ShardNames::of(ShardId::ZERO);
        let mut one = ZkElector::connect_shards(common, zk, &[shard]).await?;
        Ok(one.remove(0))
    }

    /// One elector per shard (`shards`, see `NodeConfig::shard_names`), all on one candidacy
    /// session and one read-only session (`zk`'s ensemble, `common`'s timing); each shard's
    /// election is `election_path` with the shard's suffix.
    pub async fn connect_shards(
        common: &BackendCommon,
        zk: &ZkConfig,
        shards: &[ShardNames],
    ) -> ElectorResult<Vec<ZkElector>> {
        if shards.is_empty() {
            return Err(ElectorError::Config("no shard to elect for".into()));
        }
        if zk.connect.trim().is_empty() {
            return Err(ElectorError::Config("zk.connect is empty".into()));
        }
        let timeout = Duration::from_millis(zk.request_timeout_ms.max(1));
        let me = LeaderInfo {
            node_id: common.node_id.clone(),
            http_addr: common.advertise_addr.clone(),
        };
        let paths: Vec<String> = shards
            .iter()
            .map(|shard| {
                let election_path = shard.election(&zk.election_path);
                let path = election_path.trim_end_matches('/').to_owned();
                if !path.starts_with('/') || path.len() < 2 {
                    return Err(ElectorError::Config(format!(
                        "zk.election_path {election_path:?} must be an absolute znode path below /"
                    )));
                }
                Ok(path)
            })
            .collect::<ElectorResult<_>>()?;
        let hub = Arc::new(Hub {
            connect: zk.connect.clone(),
            requested_timeout: common.lease_ttl,
            timeout,
            connect_timeout: (timeout * 3).max(Duration::from_secs(2)),
            state: StdMutex::new(HubState::default()),
            reader: tokio::sync::Mutex::new(None),
            batch: RenewBatch::new(common.renew_interval),
            quiet_rechecks: SharedLeaderRead::new(
                common.retry_interval * RECHECK_REUSE_INTERVALS,
                paths.clone(),
            ),
        });
        Ok((0u32..)
            .zip(paths)
            .map(|(shard, path)| ZkElector {
                hub: hub.clone(),
                shard,
                path,
                value: me.encode(),
                mine: StdMutex::new(None),
            })
            .collect())
    }

    fn mine(&self) -> MutexGuard<'_, Option<Candidacy>> {
        self.mine.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn child(&self, name: &str) -> String {
        format!("{}/{}", self.path, name)
    }

    /// This shard's candidacy in session `gen`, begun if it has none there yet.
    fn join(&self, gen: u64) -> ElectorResult<()> {
        let mut mine = self.mine();
        match mine.as_ref() {
            Some(c) if c.gen == gen && c.leading => {
                return Err(ElectorError::Unavailable(
                    "campaign while already leading".into(),
                ))
            }
            Some(c) if c.gen == gen => {}
            _ => {
                *mine = Some(Candidacy {
                    gen,
                    node: None,
                    create_unconfirmed: false,
                    leading: false,
                })
            }
        }
        drop(mine);
        self.hub.state().riders.insert(self.shard);
        Ok(())
    }

    /// Ensures the election path exists (`mkdir -p`).
    async fn ensure_path(&self, client: &zkc::Client) -> Result<(), ZkFailure> {
        count("create");
        let opts = CreateMode::Persistent.with_acls(Acls::anyone_all());
        self.hub.bounded(client.mkdir(&self.path, &opts)).await
    }

    /// Our candidacy znode in session `gen`: the recorded one, an adopted one whose create answer
    /// was lost, or a new one.
    async fn ensure_node(&self, client: &zkc::Client, gen: u64, id: i64) -> ElectorResult<Node> {
        let (existing, unconfirmed) = {
            let mine = self.mine();
            match mine.as_ref().filter(|c| c.gen == gen) {
                Some(c) => (c.node.clone(), c.create_unconfirmed),
                None => return Err(ElectorError::LeaseLost("session ended".into())),
            }
        };
        if let Some(n) = existing {
            return Ok(n);
        }
        let prefix = own_prefix(id);
        if unconfirmed {
            if let Some(n) = self
                .adopt(client, &prefix)
                .await
                .map_err(|e| e.into_err())?
            {
                return self.record_node(gen, n);
            }
        }
        {
            let mut mine = self.mine();
            match mine.as_mut().filter(|c| c.gen == gen) {
                Some(c) => c.create_unconfirmed = true,
                None => return Err(ElectorError::LeaseLost("session ended".into())),
            }
        }
        let opts = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let base = self.child(&prefix);
        for attempt in 0..2 {
            count("create");
            match self
                .hub
                .bounded(client.create(&base, &self.value, &opts))
                .await
            {
                Ok((stat, seq)) => {
                    let name = format!("{prefix}{seq}");
                    let node = Node {
                        path: self.child(&name),
                        name,
                        czxid: stat.czxid,
                    };
                    return self.record_node(gen, node);
                }
                Err(ZkFailure::Other(zkc::Error::NoNode)) if attempt == 0 => {
                    self.ensure_path(client).await.map_err(|e| e.into_err())?;
                }
                Err(e) => return Err(e.into_err()),
            }
        }
        Err(ElectorError::Unavailable(format!(
            "zookeeper: cannot create candidacy under {}",
            self.path
        )))
    }

    /// Finds our own znode(s) by the session prefix; keeps the lowest, deletes any others.
    async fn adopt(&self, client: &zkc::Client, prefix: &str) -> Result<Option<Node>, ZkFailure> {
        count("campaign-list");
        let children = match self.hub.bounded(client.list_children(&self.path)).await {
            Ok(c) => c,
            Err(ZkFailure::Other(zkc::Error::NoNode)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let ours: Vec<(i64, String)> = queue(children)
            .into_iter()
            .filter(|(_, n)| n.starts_with(prefix))
            .collect();
        let Some((_, first)) = ours.first().cloned() else {
            return Ok(None);
        };
        for (_, extra) in &ours[1..] {
            count("delete");
            let _ = self
                .hub
                .bounded(client.delete(&self.child(extra), None))
                .await;
        }
        count("campaign-exists");
        match self
            .hub
            .bounded(client.check_stat(&self.child(&first)))
            .await?
        {
            Some(stat) => Ok(Some(Node {
                path: self.child(&first),
                name: first,
                czxid: stat.czxid,
            })),
            None => Ok(None),
        }
    }

    fn record_node(&self, gen: u64, node: Node) -> ElectorResult<Node> {
        let mut mine = self.mine();
        match mine.as_mut().filter(|c| c.gen == gen) {
            Some(c) => {
                c.node = Some(node.clone());
                c.create_unconfirmed = false;
                Ok(node)
            }
            None => Err(ElectorError::LeaseLost(
                "session ended while creating the candidacy".into(),
            )),
        }
    }

    /// The lowest child's name and data (with a watch on it when `watch`). `None`: no candidate.
    async fn lowest(
        &self,
        client: &zkc::Client,
        watch: bool,
    ) -> Result<Option<(String, LeaderInfo, Option<zkc::OneshotWatcher>)>, ZkFailure> {
        let hub = &self.hub;
        for _ in 0..5 {
            count("read-list");
            let children = match hub.bounded(client.list_children(&self.path)).await {
                Ok(c) => c,
                Err(ZkFailure::Other(zkc::Error::NoNode)) => return Ok(None),
                Err(e) => return Err(e),
            };
            let Some((_, first)) = queue(children).into_iter().next() else {
                return Ok(None);
            };
            count("read-get");
            let path = self.child(&first);
            let got = if watch {
                hub.bounded(client.get_and_watch_data(&path))
                    .await
                    .map(|(d, _, w)| (d, Some(w)))
            } else {
                hub.bounded(client.get_data(&path))
                    .await
                    .map(|(d, _)| (d, None))
            };
            match got {
                Ok((data, w)) => return Ok(Some((first, LeaderInfo::decode(&data), w))),
                // Gone between the list and the read: look again.
                Err(ZkFailure::Other(zkc::Error::NoNode)) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(ZkFailure::Other(zkc::Error::UnexpectedError(
            "the election's lowest child keeps vanishing".into(),
        )))
    }

    /// Forgets this shard's candidacy znode (its session lives on for the other shards).
    fn drop_node(&self, gen: u64) {
        if let Some(c) = self.mine().as_mut().filter(|c| c.gen == gen) {
            c.node = None;
            c.leading = false;
        }
    }

    /// Waits for `watch` (set while `lowest` was the election's lowest child, `None`: no
    /// candidate) to fire. Each time it has been quiet for `QUIET_RECHECK_INTERVALS × every`,
    /// the node's shared re-check (one read for all its shards, [`Hub::read_lowest_children`])
    /// says whether the lowest child is still `lowest`: if so the same watch is kept and waited
    /// on again, so a quiet shard sends nothing of its own. Returns when the watch fired, the
    /// re-check saw another lowest child or failed (the caller re-lists and re-watches), or
    /// nobody observes any more.
    async fn wait_while_quiet(
        &self,
        lowest: Option<String>,
        watch: zkc::OneshotWatcher,
        every: Duration,
        tx: &tokio::sync::watch::Sender<Option<LeaderInfo>>,
    ) {
        let hub = &self.hub;
        let mut fired = std::pin::pin!(watch.changed());
        loop {
            if tokio::time::timeout(every * QUIET_RECHECK_INTERVALS, &mut fired)
                .await
                .is_ok()
                || tx.is_closed()
            {
                return;
            }
            let now = hub
                .quiet_rechecks
                .leader(self.shard, &self.path, || hub.read_lowest_children())
                .await;
            match now {
                Ok(now) if now == lowest => continue,
                _ => return,
            }
        }
    }
}

#[async_trait]
impl Elector for ZkElector {
    fn kind(&self) -> BackendKind {
        BackendKind::Zk
    }

    async fn campaign(&self) -> ElectorResult<Win> {
        let hub = &self.hub;
        let (client, gen) = hub.candidacy_session().await?;
        drop(client);
        self.join(gen)?;
        let started = Instant::now();
        let mut woke_at: Option<Instant> = None;
        loop {
            // Never hold a client handle while waiting: dropping the session must close it.
            let Some((client, id)) = hub.session_of(gen) else {
                return Err(session_ended());
            };
            let node = self.ensure_node(&client, gen, id).await?;
            // `sync` first: the listing (and the grant) then reflect the ensemble's leader.
            let sent_at = Instant::now();
            count("campaign-sync");
            count("campaign-list");
            let sync = client.sync(&self.path);
            let list = client.list_children(&self.path);
            let (synced, listed) =
                match tokio::time::timeout(hub.timeout, async { (sync.await, list.await) }).await {
                    Ok(r) => r,
                    Err(_) => return Err(ZkFailure::Timeout(hub.timeout).into_err()),
                };
            let children = match synced.and(listed) {
                Ok(c) => c,
                Err(e) if session_over(&e) => {
                    return Err(ZkFailure::SessionOver(e.to_string()).into_err())
                }
                Err(e) => return Err(ZkFailure::Other(e).into_err()),
            };
            let q = queue(children);
            match q.iter().position(|(_, n)| *n == node.name) {
                None => {
                    // Our znode is gone while the session lives (deleted by someone else):
                    // queue again with a new one.
                    self.drop_node(gen);
                    continue;
                }
                Some(0) => {
                    let grant_ttl = {
                        let st = hub.state();
                        match st.session.as_ref().filter(|s| s.gen == gen) {
                            Some(s) => s.grant_ttl,
                            None => return Err(session_ended()),
                        }
                    };
                    let grant = hub
                        .note_grant(
                            gen,
                            Grant {
                                sent_at,
                                ttl: grant_ttl,
                            },
                        )
                        .ok_or_else(session_ended)?;
                    match self.mine().as_mut().filter(|c| c.gen == gen) {
                        Some(c) => c.leading = true,
                        None => return Err(session_ended()),
                    }
                    return Ok(Win {
                        token: FenceToken::checked("zookeeper czxid", node.czxid)?,
                        grant,
                        vacant_since: Some(woke_at.unwrap_or(started)),
                    });
                }
                Some(i) => {
                    let pred = self.child(&q[i - 1].1);
                    count("watch-predecessor");
                    let watched = hub.bounded(client.check_and_watch_stat(&pred)).await;
                    drop(client);
                    match watched {
                        Ok((None, _)) => continue, // already gone: look again
                        Ok((Some(_), watcher)) => {
                            // Fires on the predecessor's deletion, or when our session ends.
                            let _ = watcher.changed().await;
                            woke_at = Some(Instant::now());
                        }
                        Err(e) => return Err(e.into_err()),
                    }
                }
            }
        }
    }

    /// One `sync` + multi-read (our znode among the node's others) round trip, shared: it renews the session for every
    /// shard and checks each held znode (see `Hub::renew_all`). Nothing to renew without a
    /// candidacy.
    async fn renew(&self) -> ElectorResult<Option<Grant>> {
        let hub = &self.hub;
        let Some((gen, node)) = self
            .mine()
            .as_ref()
            .map(|c| (c.gen, c.node.as_ref().map(|n| n.path.clone())))
        else {
            return Ok(None);
        };
        if let Some(why) = hub.why_over(gen) {
            *self.mine() = None;
            hub.batch.forget(self.shard).await;
            return Err(ElectorError::LeaseLost(why));
        }
        let lease = (gen, node.clone());
        let renewed = hub
            .batch
            .renew(self.shard, lease, |leases| hub.renew_all(leases))
            .await;
        match renewed {
            Ok(Renewed::At(sent_at)) => {
                let st = hub.state();
                // A batch reused after the session ended (the watchdog) renews nothing.
                match st.session.as_ref().filter(|s| s.gen == gen) {
                    Some(s) => Ok(Some(Grant {
                        sent_at,
                        ttl: s.grant_ttl,
                    })),
                    None => Err(ElectorError::LeaseLost(
                        "zookeeper session closed: no renewal within the grant".into(),
                    )),
                }
            }
            Ok(Renewed::Lost) => match hub.why_over(gen) {
                Some(why) => {
                    *self.mine() = None;
                    Err(ElectorError::LeaseLost(why))
                }
                None => {
                    self.drop_node(gen);
                    Err(ElectorError::LeaseLost(format!(
                        "our candidacy znode {} is gone while the session lives",
                        node.unwrap_or_default()
                    )))
                }
            },
            Err(e) => Err(e),
        }
    }

    async fn resign(&self, successor: Option<&str>) -> ElectorResult<()> {
        if successor.is_some() {
            return Err(ElectorError::Unsupported {
                backend: BackendKind::Zk,
                what: "naming a successor",
            });
        }
        let hub = &self.hub;
        let (gen, node) = {
            let mut mine = self.mine();
            match mine.as_mut() {
                Some(c) if c.leading => {
                    c.leading = false;
                    (c.gen, c.node.take())
                }
                _ => return Ok(()),
            }
        };
        hub.batch.forget(self.shard).await;
        let Some(node) = node else { return Ok(()) };
        let Some((client, _)) = hub.session_of(gen) else {
            return Ok(()); // the session is over: its ephemeral znode with it
        };
        count("delete");
        match hub.bounded(client.delete(&node.path, None)).await {
            Ok(()) | Err(ZkFailure::Other(zkc::Error::NoNode)) => Ok(()),
            Err(e) => {
                // The znode may still lead the queue: give the whole session up instead (its
                // ephemeral znodes go with it, so the node's other shards lose their terms
                // too), or everyone would wait behind it.
                drop(client);
                drop(hub.end_session(gen, None));
                Err(e.into_err())
            }
        }
    }

    async fn leader(&self) -> ElectorResult<Option<LeaderInfo>> {
        let hub = &self.hub;
        let client = hub.reader().await?;
        match self.lowest(&client, false).await {
            Ok(found) => Ok(found.map(|(_, info, _)| info)),
            Err(e) => {
                if matches!(e, ZkFailure::SessionOver(_)) {
                    hub.reset_reader().await;
                }
                Err(e.into_err())
            }
        }
    }

    /// Deletes the election's lowest znode (the leader's candidacy) if its data names `dead`:
    /// a version-checked delete of that one sequential node, so a candidacy created since (a new
    /// name) is never touched. The next candidate, watching it, wins at once. The dead session
    /// itself is left to expire; its ephemeral node no longer holds the seat. A waiting campaign
    /// watches the znode ahead of it and is woken by the deletion.
    async fn expire_dead_holder(&self, dead: &str) -> ElectorResult<DeadHolderExpiry> {
        if LeaderInfo::decode(&self.value).node_id == dead {
            return Ok(DeadHolderExpiry::NotEnded);
        }
        let hub = &self.hub;
        let client = hub.reader().await?;
        count("expire-list");
        let children = match hub.bounded(client.list_children(&self.path)).await {
            Ok(c) => c,
            Err(ZkFailure::Other(zkc::Error::NoNode)) => return Ok(DeadHolderExpiry::NotEnded),
            Err(e) => return Err(e.into_err()),
        };
        let Some((_, first)) = queue(children).into_iter().next() else {
            return Ok(DeadHolderExpiry::NotEnded);
        };
        let path = self.child(&first);
        count("expire-get");
        let (data, stat) = match hub.bounded(client.get_data(&path)).await {
            Ok(got) => got,
            Err(ZkFailure::Other(zkc::Error::NoNode)) => return Ok(DeadHolderExpiry::NotEnded),
            Err(e) => return Err(e.into_err()),
        };
        if LeaderInfo::decode(&data).node_id != dead {
            return Ok(DeadHolderExpiry::NotEnded);
        }
        count("expire-delete");
        match hub.bounded(client.delete(&path, Some(stat.version))).await {
            Ok(()) => {
                tracing::info!(znode = %path, dead, "deleted a dead holder's candidacy");
                Ok(DeadHolderExpiry::EndedCampaignWakes)
            }
            Err(ZkFailure::Other(zkc::Error::NoNode | zkc::Error::BadVersion)) => {
                Ok(DeadHolderExpiry::NotEnded)
            }
            Err(e) => Err(e.into_err()),
        }
    }

    /// `sync` (the session's server catches up with the leader's commits), then a read of the
    /// election's children on the candidacy session: ours while our znode, created at `token`'s
    /// zxid, is still the lowest. A lost session is `Ok(false)` (its ephemeral node is gone).
    async fn confirm_leadership(&self, _me: &str, token: FenceToken) -> ElectorResult<bool> {
        let hub = &self.hub;
        let (gen, node) = {
            let mine = self.mine();
            match mine.as_ref() {
                Some(c) if c.leading => match &c.node {
                    Some(n) if n.czxid == token.0 => (c.gen, n.clone()),
                    _ => return Ok(false),
                },
                _ => return Ok(false),
            }
        };
        let Some((client, _)) = hub.session_of(gen) else {
            return Ok(false);
        };
        count("sync");
        match hub.bounded(client.sync(&self.path)).await {
            Ok(()) => {}
            Err(ZkFailure::SessionOver(_)) => return Ok(false),
            Err(e) => return Err(e.into_err()),
        }
        count("confirm-list");
        let children = match hub.bounded(client.list_children(&self.path)).await {
            Ok(c) => c,
            Err(ZkFailure::SessionOver(_)) | Err(ZkFailure::Other(zkc::Error::NoNode)) => {
                return Ok(false)
            }
            Err(e) => return Err(e.into_err()),
        };
        Ok(queue(children)
            .into_iter()
            .next()
            .is_some_and(|(_, first)| first == node.name))
    }

    /// A native watch: the lowest child's data with a watch on it (fires when it goes), or the
    /// children with a watch when nobody is a candidate. While the watch is quiet, the node's
    /// shared re-check confirms every `QUIET_RECHECK_INTERVALS × every` that the lowest child
    /// is still the one watched (see `ZkElector::wait_while_quiet`).
    async fn observe(&self, tx: tokio::sync::watch::Sender<Option<LeaderInfo>>, every: Duration) {
        let hub = &self.hub;
        while !tx.is_closed() {
            let client = match hub.reader().await {
                Ok(c) => c,
                Err(_) => {
                    tokio::time::sleep(every).await;
                    continue;
                }
            };
            let watched = match self.lowest(&client, true).await {
                Ok(Some((name, info, w))) => {
                    tx.send_if_modified(|cur| {
                        let changed = cur.as_ref() != Some(&info);
                        *cur = Some(info.clone());
                        changed
                    });
                    w.map(|w| (Some(name), w))
                }
                Ok(None) => {
                    tx.send_if_modified(|cur| cur.take().is_some());
                    count("read-watch-children");
                    match hub
                        .bounded(client.list_and_watch_children(&self.path))
                        .await
                    {
                        Ok((_, w)) => Some((None, w)),
                        Err(_) => None, // no election path yet: poll
                    }
                }
                Err(e) => {
                    if matches!(e, ZkFailure::SessionOver(_)) {
                        hub.reset_reader().await;
                    }
                    None
                }
            };
            drop(client);
            match watched {
                Some((lowest, w)) => self.wait_while_quiet(lowest, w, every, &tx).await,
                None => tokio::time::sleep(every).await,
            }
        }
    }
    /// Withdraws this shard's candidacy (its znode deleted); the last shard of the node to
    /// close closes the shared session.
    async fn close(&self) -> ElectorResult<()> {
        let hub = &self.hub;
        let mine = self.mine().take();
        hub.batch.forget(self.shard).await;
        let Some(c) = mine else { return Ok(()) };
        let client = hub.session_of(c.gen).map(|(client, _)| client);
        if let (Some(node), Some(client)) = (&c.node, &client) {
            count("delete");
            let _ = hub.bounded(client.delete(&node.path, None)).await;
        } else if let (None, Some(client), true) = (&c.node, &client, c.create_unconfirmed) {
            // A create whose answer we never saw may have landed: find it by our prefix.
            if let Some((_, id)) = hub.session_of(c.gen) {
                if let Ok(Some(n)) = self.adopt(client, &own_prefix(id)).await {
                    count("delete");
                    let _ = hub.bounded(client.delete(&n.path, None)).await;
                }
            }
        }
        drop(client);
        let last = {
            let mut st = hub.state();
            st.riders.remove(&self.shard);
            st.riders.is_empty() && st.session.as_ref().is_some_and(|s| s.gen == c.gen)
        };
        if !last {
            return Ok(());
        }
        let session = {
            let mut st = hub.state();
            st.lost = None;
            st.session.take()
        };
        let Some(s) = session else { return Ok(()) };
        // Dropping the last handle sends closeSession; wait (bounded) until it is done, so no
        // candidacy of ours outlives close().
        let mut watcher = s.client.state_watcher();
        drop(s);
        let _ = tokio::time::timeout(hub.timeout, async {
            let mut state = watcher.state();
            while !state.is_terminated() {
                state = watcher.changed().await;
            }
        })
        .await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_orders_by_trailing_sequence_of_any_recipe() {
        let q = queue(vec![
            "c_00000000000000ab_0000000012".into(),
            "_c_2f1e-latch-0000000003".into(),
            "c_00000000000000aa_0000000007".into(),
            "not-a-candidate".into(),
        ]);
        let names: Vec<&str> = q.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "_c_2f1e-latch-0000000003",
                "c_00000000000000aa_0000000007",
                "c_00000000000000ab_0000000012"
            ]
        );
        assert_eq!(sequence_of("c_00000000000000ab_0000000012"), Some(12));
        assert_eq!(sequence_of("x"), None);
    }
}
