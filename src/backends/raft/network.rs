//! Raft transport over each node's own *peer listener* ([`super::server`], never the client
//! port): `POST http://<peer_addr>/peer/<method>` with a serde_json body, signed with the cluster
//! secret ([`super::auth`]), answered by `RaftPeerRpc` once the server has authenticated it.
//!
//! | method            | request                          | answer                      |
//! | ----------------- | -------------------------------- | --------------------------- |
//! | `append`          | `AppendEntriesRequest`           | `AppendEntriesResponse`     |
//! | `vote`            | `VoteRequest`                    | `VoteResponse`              |
//! | `pre_vote`        | `VoteRequest`                    | `VoteResponse`              |
//! | `snapshot`        | `{vote, meta}` (the data is empty) | `SnapshotResponse`        |
//! | `transfer_leader` | `TransferLeaderRequest`          | `TransferLeaderResponse`    |
//!
//! Every request carries [`FROM_HEADER`] (the sender's node id), a timestamp and an HMAC over
//! method, path, sender, timestamp and body (see [`super::auth`]). Any transport failure or
//! non-200 answer is reported to openraft as `Unreachable` (it backs off and retries).
//!
//! The receiving half also refuses any vote (or append, snapshot, transfer) whose term is above
//! [`MAX_TERM`]: such a term could never become a fencing token (an `i64`), and a node that
//! adopted it would be stuck. Authentication is the real defence; this bound is belt and braces.
//!
//! Both halves honour the `isolate-peers` fault file (see [`super::faults`]): while it exists,
//! outgoing RPCs are dropped (they time out after their deadline) and incoming ones are refused.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::StatusCode;
use openraft::errors::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, OptionalSend, RaftNetworkV2};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::auth::{now_unix_ms, PeerAuth, MAC_HEADER, TS_HEADER};
use super::client::PeerClient;
use super::faults::PeerFaults;
use super::types::{PeerMap, Snapshot, SnapshotData, SnapshotMeta, TypeConfig, Vote};
use crate::backends::{count_request, BackendKind};

pub use super::auth::FROM_HEADER;

/// The peer methods a listener serves.
pub const PEER_METHODS: [&str; 6] = [
    "append",
    "vote",
    "pre_vote",
    "snapshot",
    "transfer_leader",
    "shard",
];

/// The highest term a peer message may carry: one more election must still fit an `i64` token.
pub const MAX_TERM: u64 = (i64::MAX - 1) as u64;

/// Why a peer request was not answered; the peer listener maps each to an HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum PeerRpcError {
    /// No such method (404); carries the method name.
    #[error("unknown peer method {0}")]
    UnknownMethod(String),
    /// The body could not be decoded, or its term cannot be a token (400).
    #[error("bad peer request: {0}")]
    BadRequest(String),
    /// Valid, but openraft failed to handle it (503).
    #[error("peer request failed: {0}")]
    Failed(String),
}

#[derive(Serialize, Deserialize)]
pub(crate) struct SnapshotMsg {
    pub vote: Vote,
    pub meta: SnapshotMeta,
    /// The state machine's payload: the shard lease table as JSON text (K > 1; empty at
    /// K = 1, and absent from a sender that predates shards).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub data: String,
}

/// openraft's network factory: one signed, fault-aware [`PeerConn`] per target member.
#[derive(Clone)]
pub struct NetworkFactory {
    client: PeerClient,
    from: String,
    /// This node's configured peers: their addresses win over the ones stored in the membership
    /// (a fleet re-created in the same directory keeps its raft state but gets new ports).
    peers: PeerMap,
    faults: Arc<PeerFaults>,
    auth: PeerAuth,
}

impl NetworkFactory {
    /// Connections from member `from` to its configured peers, signed with `auth`.
    pub fn new(
        from: &str,
        peers: PeerMap,
        faults: Arc<PeerFaults>,
        auth: PeerAuth,
    ) -> NetworkFactory {
        NetworkFactory {
            // Each call is bounded by openraft's own per-RPC ttl below; this is only a backstop.
            client: PeerClient::new(),
            from: from.to_owned(),
            peers,
            faults,
            auth,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerConn;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerConn {
        let addr = match self.peers.peer(target) {
            Some(p) => p.peer_addr.clone(),
            None => node.addr.clone(),
        };
        PeerConn {
            client: self.client.clone(),
            addr,
            from: self.from.clone(),
            faults: self.faults.clone(),
            auth: self.auth.clone(),
        }
    }
}

/// One connection (logically; the hyper pool shares sockets) to one peer.
pub struct PeerConn {
    client: PeerClient,
    addr: String,
    from: String,
    faults: Arc<PeerFaults>,
    auth: PeerAuth,
}

impl PeerConn {
    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: &'static str,
        req: &Req,
        ttl: Duration,
    ) -> Result<Resp, String> {
        // Raft's "backend requests" are its peer RPCs: votes per election (no herd: one
        // candidate asks N - 1 peers), appends as its lease upkeep.
        count_request(BackendKind::Raft, method);
        let body = serde_json::to_vec(req).map_err(|e| format!("encode {method}: {e}"))?;
        let reply = signed_post(
            &self.client,
            &self.auth,
            &self.faults,
            &self.from,
            &self.addr,
            method,
            body,
            ttl,
        )
        .await?;
        serde_json::from_slice(&reply).map_err(|e| format!("decode {method} answer: {e}"))
    }
}

/// One signed `POST /peer/<method>` from member `from` to the peer listener at `addr`, bounded
/// by `ttl`: the answer's body when it is `200`, else why not. Honours the `isolate-peers`
/// fault (the request is dropped: the caller learns nothing until `ttl` has passed). Raft's own
/// RPCs and the shard lease table's requests ([`super::shards`]) both go through here, so
/// every peer request is authenticated the same way.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn signed_post(
    client: &PeerClient,
    auth: &PeerAuth,
    faults: &PeerFaults,
    from: &str,
    addr: &str,
    method: &str,
    body: Vec<u8>,
    ttl: Duration,
) -> Result<Bytes, String> {
    if faults.isolated() {
        // Dropped on the floor: the caller learns nothing until its deadline passes.
        tokio::time::sleep(ttl).await;
        return Err(format!("{method} to {addr} dropped (isolate-peers fault)"));
    }
    let path = format!("/peer/{method}");
    let ts_ms = now_unix_ms();
    let mac = auth.sign("POST", &path, from, ts_ms, &body);
    let ts_text = ts_ms.to_string();
    let headers = [
        (FROM_HEADER, from),
        (TS_HEADER, ts_text.as_str()),
        (MAC_HEADER, mac.as_str()),
        ("content-type", "application/json"),
    ];
    let send = client.post(addr, &path, &headers, Bytes::from(body));
    let reply = match tokio::time::timeout(ttl, send).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(format!("{method} to {addr} timed out after {ttl:?}")),
    };
    if reply.status != StatusCode::OK {
        return Err(format!(
            "{method} to {addr}: {} {}",
            reply.status,
            String::from_utf8_lossy(&reply.body)
        ));
    }
    Ok(reply.body)
}

fn unreachable(e: String) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::from_string(e))
}

impl RaftNetworkV2<TypeConfig> for PeerConn {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("append", &rpc, option.soft_ttl())
            .await
            .map_err(unreachable)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("vote", &rpc, option.soft_ttl())
            .await
            .map_err(unreachable)
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("pre_vote", &rpc, option.soft_ttl())
            .await
            .map_err(unreachable)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let msg = SnapshotMsg {
            vote,
            meta: snapshot.meta,
            data: String::from_utf8(snapshot.snapshot).unwrap_or_default(),
        };
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            r = self.call("snapshot", &msg, option.soft_ttl()) => {
                r.map_err(|e| StreamingError::Unreachable(Unreachable::from_string(e)))
            }
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call("transfer_leader", &req, option.soft_ttl())
            .await
            .map_err(unreachable)
    }
}

/// Where the peer RPC server finds the node's current raft (none while it is shut down).
pub(crate) trait RaftHandleSource: Send + Sync + 'static {
    fn current(&self) -> Option<super::RaftHandle>;
}

/// The server half: decodes authenticated `/peer/<method>` bodies and hands them to the local
/// raft. Only [`super::server`] calls it, after the MAC verified.
pub(crate) struct RaftPeerRpc {
    pub(crate) source: Arc<dyn RaftHandleSource>,
    pub(crate) faults: Arc<PeerFaults>,
    /// Noted on every append this node accepted from a leader (see [`super::prompt`]).
    pub(crate) contact: Arc<super::prompt::LeaderContact>,
    /// The shard lease table's leader side (K > 1); `None` refuses `shard` requests.
    pub(crate) shards: Option<Arc<dyn ShardRpc>>,
}

/// What serves an authenticated `POST /peer/shard`: the shard lease table's server
/// (`lease_server.rs`). A trait here, so the transport does not import the table it carries
/// requests for (the table's server uses this module's errors and raft handle).
#[async_trait::async_trait]
pub(crate) trait ShardRpc: Send + Sync + 'static {
    /// Decodes, serves and encodes one request.
    async fn handle_rpc(&self, body: &Bytes) -> Result<Bytes, PeerRpcError>;
}

fn decode<T: DeserializeOwned>(body: &Bytes) -> Result<T, PeerRpcError> {
    serde_json::from_slice(body).map_err(|e| PeerRpcError::BadRequest(e.to_string()))
}

fn encode<T: Serialize>(v: &T) -> Result<Bytes, PeerRpcError> {
    serde_json::to_vec(v)
        .map(Bytes::from)
        .map_err(|e| PeerRpcError::Failed(e.to_string()))
}

fn failed(e: impl std::fmt::Display) -> PeerRpcError {
    PeerRpcError::Failed(e.to_string())
}

/// Refuses a message whose term could never be a fencing token (see [`MAX_TERM`]).
fn check_term(vote: &Vote) -> Result<(), PeerRpcError> {
    let term = vote.leader_id.term;
    if term > MAX_TERM {
        return Err(PeerRpcError::BadRequest(format!(
            "term {term} is above the largest usable term {MAX_TERM}"
        )));
    }
    Ok(())
}

impl RaftPeerRpc {
    pub(crate) async fn handle(&self, method: &str, body: Bytes) -> Result<Bytes, PeerRpcError> {
        if !PEER_METHODS.contains(&method) {
            return Err(PeerRpcError::UnknownMethod(method.to_owned()));
        }
        if self.faults.isolated() {
            return Err(PeerRpcError::Failed(
                "peer traffic refused (isolate-peers fault)".into(),
            ));
        }
        if method == "shard" {
            return match &self.shards {
                Some(server) => server.handle_rpc(&body).await,
                None => Err(PeerRpcError::Failed(
                    "this node runs one shard ([shards] count = 1): no shard lease table".into(),
                )),
            };
        }
        let raft = self
            .source
            .current()
            .ok_or_else(|| PeerRpcError::Failed("raft is not running on this node".into()))?;
        match method {
            "append" => {
                let req: AppendEntriesRequest<TypeConfig> = decode(&body)?;
                check_term(&req.vote)?;
                let resp = raft.append_entries(req).await.map_err(failed)?;
                // Any answer but "higher vote" means openraft took the sender as its leader
                // (and renewed its leader lease).
                if !matches!(resp, AppendEntriesResponse::HigherVote(_)) {
                    self.contact.heard_now();
                }
                encode(&resp)
            }
            "vote" => {
                let req: VoteRequest<TypeConfig> = decode(&body)?;
                check_term(&req.vote)?;
                let resp = raft.vote(req).await.map_err(failed)?;
                // A vote just granted is a leader about to start: like openraft's own timer,
                // do not stand against it for another lease (see [`super::prompt`]).
                if resp.vote_granted {
                    self.contact.heard_now();
                }
                encode(&resp)
            }
            "pre_vote" => {
                let req: VoteRequest<TypeConfig> = decode(&body)?;
                check_term(&req.vote)?;
                encode(&raft.pre_vote(req).await.map_err(failed)?)
            }
            "snapshot" => {
                let msg: SnapshotMsg = decode(&body)?;
                check_term(&msg.vote)?;
                let snap = Snapshot {
                    meta: msg.meta,
                    snapshot: msg.data.into_bytes(),
                };
                encode(
                    &raft
                        .install_full_snapshot(msg.vote, snap)
                        .await
                        .map_err(failed)?,
                )
            }
            _ => {
                let req: TransferLeaderRequest<TypeConfig> = decode(&body)?;
                check_term(req.from_leader())?;
                encode(&raft.handle_transfer_leader(req).await.map_err(failed)?)
            }
        }
    }
}
