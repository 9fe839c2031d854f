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
//! Reads for [`Elector::leader`](super::Elector::leader) and the observe watch use a second, read-only session, so the
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

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use super::{ElectorError, ElectorResult, LeaderInfo};
use crate::config::{BackendCommon, ShardNames, ZkConfig};
use crate::shard::ShardId;

mod candidacy;
mod elector;
mod hub;
mod leader;
mod request;

use candidacy::Candidacy;
use hub::Hub;

/// The `zk` backend (see the module docs): one shard's election, on its node's shared sessions.
pub struct ZkElector {
    hub: Arc<Hub>,
    shard: u32,
    path: String,
    value: Vec<u8>,
    mine: StdMutex<Option<Candidacy>>,
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
        let hub = Arc::new(Hub::new(common, zk, timeout, paths.clone()));
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

    /// The path of child `name` of this shard's election.
    fn child(&self, name: &str) -> String {
        format!("{}/{}", self.path, name)
    }
}
