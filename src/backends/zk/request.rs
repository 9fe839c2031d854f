//! What every ZooKeeper request of the backend shares: its count, how its failure is classed
//! (the session is over, another error, no answer in time), and an election's children read as
//! a queue.

use std::time::Duration;

use zookeeper_client as zkc;

use super::super::{count_request, BackendKind, ElectorError};

pub(super) fn count(op: &'static str) {
    count_request(BackendKind::Zk, op);
}

pub(super) fn session_over(e: &zkc::Error) -> bool {
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
pub(super) fn queue(children: Vec<String>) -> Vec<(i64, String)> {
    let mut q: Vec<(i64, String)> = children
        .into_iter()
        .filter_map(|c| sequence_of(&c).map(|s| (s, c)))
        .collect();
    q.sort();
    q
}

/// A failed request, before it becomes an [`ElectorError`].
pub(super) enum ZkFailure {
    SessionOver(String),
    Other(zkc::Error),
    Timeout(Duration),
}

impl ZkFailure {
    pub(super) fn into_err(self) -> ElectorError {
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
