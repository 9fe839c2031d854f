//! The [`Elector`] seam for ZooKeeper: campaign (queue, watch the predecessor, lead when
//! lowest), renew through the node's shared renewal, resign, read and observe the leader,
//! expire a dead holder, confirm, close.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use zookeeper_client as zkc;

use super::candidacy::own_prefix;
use super::request::{count, queue, session_over, ZkFailure};
use super::ZkElector;
use crate::backends::renew_batch::Renewed;
use crate::backends::{
    BackendKind, DeadHolderExpiry, Elector, ElectorError, ElectorResult, FenceToken, Grant,
    LeaderInfo, Win,
};

fn session_ended() -> ElectorError {
    ElectorError::LeaseLost("zookeeper session ended while campaigning".into())
}

impl ZkElector {
    /// A campaign's look at the queue: `sync` first, so the listing (and the grant) reflect the
    /// ensemble's leader, pipelined with the list of the election's children.
    async fn sync_and_list(&self, client: &zkc::Client) -> ElectorResult<Vec<String>> {
        let hub = &self.hub;
        count("campaign-sync");
        count("campaign-list");
        let sync = client.sync(&self.path);
        let list = client.list_children(&self.path);
        let (synced, listed) =
            match tokio::time::timeout(hub.timeout, async { (sync.await, list.await) }).await {
                Ok(r) => r,
                Err(_) => return Err(ZkFailure::Timeout(hub.timeout).into_err()),
            };
        match synced.and(listed) {
            Ok(c) => Ok(c),
            Err(e) if session_over(&e) => Err(ZkFailure::SessionOver(e.to_string()).into_err()),
            Err(e) => Err(ZkFailure::Other(e).into_err()),
        }
    }

    /// Our znode (created at zxid `czxid`) is the lowest in session `gen`'s listing sent at
    /// `sent_at`: the term, granted from that send, unless the session ended meanwhile.
    fn won(
        &self,
        gen: u64,
        sent_at: Instant,
        czxid: i64,
        vacant_since: Instant,
    ) -> ElectorResult<Win> {
        let hub = &self.hub;
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
        Ok(Win {
            token: FenceToken::checked("zookeeper czxid", czxid)?,
            grant,
            vacant_since: Some(vacant_since),
        })
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
            let q = queue(self.sync_and_list(&client).await?);
            match q.iter().position(|(_, n)| *n == node.name) {
                None => {
                    // Our znode is gone while the session lives (deleted by someone else):
                    // queue again with a new one.
                    self.drop_node(gen);
                    continue;
                }
                Some(0) => {
                    let vacant_since = woke_at.unwrap_or(started);
                    return self.won(gen, sent_at, node.czxid, vacant_since);
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
