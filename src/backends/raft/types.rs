//! The openraft type configuration and the mapping between baton node ids ("n1") and raft ids.

use std::collections::BTreeMap;

use openraft::BasicNode;

pub use super::lease_table::{ShardCmd, ShardOutcome};
use crate::config::PeerSpec;

openraft::declare_raft_types!(
    /// baton's raft: at K = 1 no application data of its own (leadership is the product); at
    /// K > 1 the log also carries the shard lease table's grants and releases
    /// ([`ShardCmd`], see [`super::lease_table`]). `u64` node ids, the peer address in [`BasicNode`],
    /// and the *standard* leader id — at most one leader per term — so that the term alone is a
    /// fencing token (the default "advanced" leader id allows two leaders in one term, ordered by
    /// node id, which would make term tokens collide).
    pub TypeConfig:
        D = ShardCmd,
        R = ShardOutcome,
        NodeId = u64,
        Node = BasicNode,
        LeaderId = openraft::impls::leader_id_std::LeaderId<u64, u64>,
);

/// A log position (term, node, index) under baton's type config.
pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
/// A log entry (blanks, membership, and at K > 1 the shard lease table's commands).
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
/// A vote: the term and whom this node voted for; the term is the fencing token.
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
/// Membership as stored with the log id that set it.
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
/// A snapshot's metadata: last applied log id and membership.
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
/// Snapshot payload: the shard lease table as JSON (empty at K = 1, whose state machine is
/// wholly the snapshot *meta*: last applied log id and membership, which travels next to it).
pub type SnapshotData = Vec<u8>;
/// A snapshot: its meta and the payload.
pub type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, SnapshotData>;

/// The fleet's members with their raft ids. Ids come from the trailing digits of the node ids
/// ("n1" → 1, "node-12" → 12) when every member has distinct ones; otherwise from the 1-based
/// position in the peer list sorted by node id. Every node derives the same map from the same
/// peer list, whatever order it was written in.
#[derive(Clone, Debug)]
pub struct PeerMap {
    by_raft: BTreeMap<u64, PeerSpec>,
}

impl PeerMap {
    /// Numbers the members (raft ids) from the configured peers; an error for an empty or
    /// ambiguous list.
    pub fn new(peers: &[PeerSpec]) -> Result<PeerMap, String> {
        if peers.is_empty() {
            return Err("raft.peers is empty: list every member, this node included".into());
        }
        let mut sorted: Vec<PeerSpec> = peers.to_vec();
        sorted.sort_by(|a, b| a.id.cmp(&b.id));
        for w in sorted.windows(2) {
            if w[0].id == w[1].id {
                return Err(format!("raft.peers lists {} twice", w[0].id));
            }
        }
        let digits: Vec<Option<u64>> = sorted.iter().map(|p| trailing_number(&p.id)).collect();
        let mut by_raft = BTreeMap::new();
        let distinct = {
            let mut seen: Vec<u64> = digits.iter().flatten().copied().collect();
            seen.sort_unstable();
            seen.dedup();
            seen.len() == sorted.len() && !seen.contains(&0)
        };
        for (i, p) in sorted.into_iter().enumerate() {
            let id = if distinct {
                digits[i].expect("checked")
            } else {
                i as u64 + 1
            };
            by_raft.insert(id, p);
        }
        Ok(PeerMap { by_raft })
    }

    /// The raft id of member `node_id`.
    pub fn raft_id(&self, node_id: &str) -> Option<u64> {
        self.by_raft
            .iter()
            .find(|(_, p)| p.id == node_id)
            .map(|(id, _)| *id)
    }

    /// The member with raft id `raft_id`.
    pub fn peer(&self, raft_id: u64) -> Option<&PeerSpec> {
        self.by_raft.get(&raft_id)
    }

    /// The initial membership: every member as a voter, at its peer address.
    pub fn members(&self) -> BTreeMap<u64, BasicNode> {
        self.by_raft
            .iter()
            .map(|(id, p)| (*id, BasicNode::new(&p.peer_addr)))
            .collect()
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.by_raft.len()
    }

    /// Whether there are no members.
    pub fn is_empty(&self) -> bool {
        self.by_raft.is_empty()
    }

    /// Every member's raft id, ascending.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_raft.keys().copied()
    }
}

fn trailing_number(id: &str) -> Option<u64> {
    let start = id
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_ascii_digit())
        .last()
        .map(|(i, _)| i)?;
    id[start..].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(id: &str) -> PeerSpec {
        PeerSpec {
            id: id.into(),
            addr: format!("{id}:1"),
            peer_addr: format!("{id}:2"),
        }
    }

    #[test]
    fn ids_from_digits_or_positions() {
        let m = PeerMap::new(&[peer("n3"), peer("n1"), peer("n12")]).unwrap();
        assert_eq!(m.raft_id("n1"), Some(1));
        assert_eq!(m.raft_id("n12"), Some(12));
        assert_eq!(m.peer(3).unwrap().id, "n3");
        let m = PeerMap::new(&[peer("b"), peer("a1"), peer("c1")]).unwrap();
        assert_eq!(m.raft_id("a1"), Some(1));
        assert_eq!(m.raft_id("b"), Some(2));
        assert_eq!(m.raft_id("c1"), Some(3));
        assert!(PeerMap::new(&[peer("a"), peer("a")]).is_err());
        assert!(PeerMap::new(&[]).is_err());
    }
}
