//! One shard's candidacy: its sequential znode in the node's candidacy session, created once
//! (a create whose answer was lost is found by the session's prefix and adopted), and forgotten
//! when it goes.

use std::sync::MutexGuard;

use zookeeper_client as zkc;
use zookeeper_client::{Acls, CreateMode};

use super::request::{count, queue, ZkFailure};
use super::ZkElector;
use crate::backends::{ElectorError, ElectorResult};

/// Our candidacy znodes are `c_<session id, 16 hex digits>_<10-digit sequence>`.
const PREFIX: &str = "c_";

#[derive(Clone, Debug)]
pub(super) struct Node {
    pub(super) name: String,
    pub(super) path: String,
    pub(super) czxid: i64,
}

/// One shard's candidacy, tied to the session generation it was made in.
pub(super) struct Candidacy {
    pub(super) gen: u64,
    pub(super) node: Option<Node>,
    /// A create was sent whose answer we may not have seen: look for our node before creating.
    pub(super) create_unconfirmed: bool,
    pub(super) leading: bool,
}

pub(super) fn own_prefix(id: i64) -> String {
    format!("{PREFIX}{:016x}_", id as u64)
}

impl ZkElector {
    pub(super) fn mine(&self) -> MutexGuard<'_, Option<Candidacy>> {
        self.mine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This shard's candidacy in session `gen`, begun if it has none there yet.
    pub(super) fn join(&self, gen: u64) -> ElectorResult<()> {
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
    pub(super) async fn ensure_node(
        &self,
        client: &zkc::Client,
        gen: u64,
        id: i64,
    ) -> ElectorResult<Node> {
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
    pub(super) async fn adopt(
        &self,
        client: &zkc::Client,
        prefix: &str,
    ) -> Result<Option<Node>, ZkFailure> {
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

    /// Forgets this shard's candidacy znode (its session lives on for the other shards).
    pub(super) fn drop_node(&self, gen: u64) {
        if let Some(c) = self.mine().as_mut().filter(|c| c.gen == gen) {
            c.node = None;
            c.leading = false;
        }
    }
}
