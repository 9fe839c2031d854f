//! The session hub: what one node's shards share, the candidacy session with its local
//! watchdog, the read-only session, the coalesced renewals and the shared quiet re-checks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use zookeeper_client as zkc;
use zookeeper_client::SessionState;

use super::request::{count, queue, session_over, ZkFailure};
use crate::backends::renew_batch::{RenewBatch, SharedLeaderRead};
use crate::backends::{ElectorError, ElectorResult, Grant};
use crate::config::{BackendCommon, ZkConfig};

/// The fraction of the negotiated session timeout a renewal grants (see the module doc).
const GRANT_NUM: u32 = 2;
const GRANT_DEN: u32 = 3;

/// A quiet re-check takes another shard's shared read when it is younger than this many retry
/// intervals. With [`QUIET_RECHECK_INTERVALS`](super::leader::QUIET_RECHECK_INTERVALS) a change a watch missed is still seen within 30
/// retry intervals at worst, as when every shard re-listed its election alone after 30; the node
/// reads about once per this many intervals, whatever K.
const RECHECK_REUSE_INTERVALS: u32 = 10;

/// Elections per multi-read of the quiet re-checks: one request up to K = 1024. Both the request
/// (a path each) and its answer (about 30 bytes per candidate znode name: some 300 KiB at 9
/// candidates per election) stay well inside ZooKeeper's default 1 MiB packet limit
/// (`jute.maxbuffer`).
const RECHECK_READ_OPS: usize = 1024;

/// The node's candidacy session: one ZooKeeper session that every shard's candidacy znode is
/// created in (their elections differ only in the path).
pub(super) struct Session {
    pub(super) gen: u64,
    pub(super) client: zkc::Client,
    id: i64,
    timeout: Duration,
    pub(super) grant_ttl: Duration,
    /// The newest renewal that succeeded, by any shard: the session's own liveness.
    last_grant: Grant,
}

#[derive(Default)]
pub(super) struct HubState {
    pub(super) session: Option<Session>,
    /// Why candidacy session `.0` ended (told to each shard that had a candidacy in it).
    pub(super) lost: Option<(u64, String)>,
    next_gen: u64,
    /// The shards with a candidacy in the current session; the last to close closes it.
    pub(super) riders: BTreeSet<u32>,
}

/// What one node's shards share (see the module docs): the candidacy session with its local
/// watchdog, the read-only session, and the coalesced renewals.
pub(super) struct Hub {
    connect: String,
    requested_timeout: Duration,
    pub(super) timeout: Duration,
    connect_timeout: Duration,
    state: StdMutex<HubState>,
    reader: tokio::sync::Mutex<Option<zkc::Client>>,
    /// One `sync` plus one `exists` per held znode renews every shard of the node. A lease is a
    /// session generation and the shard's znode in it (`None`: a candidacy without a znode yet,
    /// which needs only the session kept alive).
    pub(super) batch: RenewBatch<(u64, Option<String>)>,
    /// The observe loops' quiet re-checks, shared: the name of each election's lowest znode, by
    /// election path (every shard's path, in shard order, is its `names`).
    pub(super) quiet_rechecks: SharedLeaderRead<String>,
}

impl Hub {
    /// The hub of a node's elections at `paths` (`zk`'s ensemble, `common`'s timing, requests
    /// bounded by `timeout`). No session is opened until first use.
    pub(super) fn new(
        common: &BackendCommon,
        zk: &ZkConfig,
        timeout: Duration,
        paths: Vec<String>,
    ) -> Hub {
        Hub {
            connect: zk.connect.clone(),
            requested_timeout: common.lease_ttl,
            timeout,
            connect_timeout: (timeout * 3).max(Duration::from_secs(2)),
            state: StdMutex::new(HubState::default()),
            reader: tokio::sync::Mutex::new(None),
            batch: RenewBatch::new(common.renew_interval),
            quiet_rechecks: SharedLeaderRead::new(
                common.retry_interval * RECHECK_REUSE_INTERVALS,
                paths,
            ),
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) async fn bounded<T>(
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
    pub(super) async fn candidacy_session(self: &Arc<Self>) -> ElectorResult<(zkc::Client, u64)> {
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
    pub(super) fn session_of(&self, gen: u64) -> Option<(zkc::Client, i64)> {
        let st = self.state();
        st.session
            .as_ref()
            .filter(|s| s.gen == gen && !s.client.state().is_terminated())
            .map(|s| (s.client.clone(), s.id))
    }

    /// Ends the candidacy session `gen` (if still current); `lost` is kept for its shards.
    pub(super) fn end_session(&self, gen: u64, lost: Option<String>) -> Option<zkc::Client> {
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
    pub(super) fn why_over(&self, gen: u64) -> Option<String> {
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
    pub(super) fn note_grant(&self, gen: u64, g: Grant) -> Option<Grant> {
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
    pub(super) async fn renew_all(
        &self,
        leases: Vec<(u64, Option<String>)>,
    ) -> ElectorResult<Vec<bool>> {
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
        let held: Vec<&String> = leases
            .iter()
            .filter_map(|(g, p)| p.as_ref().filter(|_| *g == gen))
            .collect();
        let (failure, there) = self.sync_and_check(&client, &held).await?;
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

    /// The requests of one renewal: `sync`, and pipelined behind it one multi-read of every
    /// `held` znode. The first failure either met (`None`: both answered), and whether each
    /// held znode is there, in order.
    async fn sync_and_check(
        &self,
        client: &zkc::Client,
        held: &[&String],
    ) -> ElectorResult<(Option<zkc::Error>, Vec<bool>)> {
        count("renew-sync");
        // Any path will do: `sync` is a round trip to the ensemble's leader whatever it names.
        let sync = client.sync("/");
        // Every held znode in one multi-read request (ZooKeeper 3.6+), pipelined behind the
        // `sync`: the node's renewal is two requests whatever the number of its shards.
        let mut reader = client.new_multi_reader();
        for p in held {
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
        Ok((failure, there))
    }

    /// The read-only session, (re)connected when needed.
    pub(super) async fn reader(&self) -> ElectorResult<zkc::Client> {
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

    pub(super) async fn reset_reader(&self) {
        *self.reader.lock().await = None;
    }

    /// The lowest znode of every election of the node's shards (an election with no candidate,
    /// or no path yet, is left out): one multi-read of their children on the read-only session
    /// per [`RECHECK_READ_OPS`] elections.
    pub(super) async fn read_lowest_children(&self) -> ElectorResult<BTreeMap<String, String>> {
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
