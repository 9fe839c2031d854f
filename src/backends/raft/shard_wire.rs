//! The wire between a node's shard electors and the raft leader's lease table: one request
//! enum, one answer enum, carried as a signed `POST /peer/shard` (or in process on the leader).

use serde::{Deserialize, Serialize};

use super::lease_table::*;

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
