//! The SWIM failure detector (`[detector] kind = "swim"`, cargo feature `swim`).
//!
//! One SWIM member per node ([`foca`]: probes, indirect probes, suspicion, refutation, gossip),
//! over our own transport: a UDP socket on its own port (`[detector] bind` / `peers`), every
//! datagram sealed with the cluster secret ([`wire`]). The actor that owns the member is
//! `actors::detector`. What it decides reaches the electors as
//! [`crate::actors::PeerEvent`]s: a member *confirmed* dead (suspected and not refuted within
//! `suspect_ms`) lets a follower end that member's lease in the backend and campaign at once;
//! this node declared dead makes it demote if it leads. A suspicion alone changes nothing.
//!
//! The detector only ever shortens the wait for a dead leader; it never decides who leads. The
//! backend still elects, and the fence still refuses any token below the highest it has seen:
//! a live leader falsely declared dead loses its lease (and demotes), its late writes are refused.
//!
//! Defaults (the issue left them open): a 150 ms protocol period, 60 ms for a direct probe's ack,
//! 200 ms of suspicion. A dead member is first probed by one of the others within about a period
//! (each member probes the others in turn), suspected when that period ends without an ack,
//! confirmed 200 ms later: 0.45-0.6 s measured on a loaded 2-core machine
//! (`lab/tests/detector.rs`), well inside a 3 s lease. A member that stalls for more than about
//! a period plus the suspicion (~350 ms) is declared dead: for a leader that costs a term
//! (it demotes, the fence refuses its old token), never safety. Slower hosts raise them.

pub mod wire;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex as StdMutex};

use serde::Serialize;

/// A member's identity in the SWIM group: its node id and the boot it belongs to. A node that
/// restarts (or learns it was declared dead) comes back with a later `boot`, which wins over
/// the old identity, so it need not wait for the old one to be forgotten.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct MemberId {
    /// The node id.
    pub id: String,
    /// When this identity was made (µs since the epoch; +1 per renewal).
    pub boot: u64,
}

impl foca::Identity for MemberId {
    /// Members are told apart by node id: two identities of one node are one member.
    type Addr = String;

    fn renew(&self) -> Option<Self> {
        Some(MemberId {
            id: self.id.clone(),
            boot: self.boot.saturating_add(1),
        })
    }

    fn addr(&self) -> String {
        self.id.clone()
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.boot > adversary.boot
    }
}

/// One member as this node sees it (`/status`).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct MemberView {
    /// The node id.
    pub id: String,
    /// `alive`, `suspect` or `down`.
    pub state: &'static str,
    /// Its SWIM incarnation (a member refutes a suspicion by raising it).
    pub incarnation: u16,
}

/// What the detector knows, for `/status`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DetectorView {
    /// Always `swim` (absent from `/status` when the detector is off).
    pub kind: &'static str,
    /// The UDP address this node's detector listens on.
    pub listen: Option<SocketAddr>,
    /// When this node's detector started (µs since the epoch): every datagram it sends carries
    /// it, with a sequence number, for the receivers' replay check (see [`wire`]).
    pub boot: u64,
    /// Whether some other member knows this node (it has joined the group).
    pub active: bool,
    /// Every other member this node has heard of, with its state.
    pub members: Vec<MemberView>,
    /// Members confirmed dead and not seen back since.
    pub confirmed_dead: Vec<String>,
    /// Confirmations of death this node has made, in all.
    pub confirmations: u64,
    /// Times this node was declared dead by the others (and rejoined).
    pub declared_self_dead: u64,
    /// Datagrams dropped unread, by reason (see [`wire::Dropped`]).
    pub dropped: BTreeMap<&'static str, u64>,
}

/// The view shared by the detector (writer) and the HTTP server (reader).
pub type SharedView = Arc<StdMutex<DetectorView>>;

/// Why the detector could not start.
#[derive(Debug, thiserror::Error)]
pub enum DetectorError {
    /// `[detector]` or the cluster secret is unusable.
    #[error("detector configuration: {0}")]
    Config(String),
    /// The UDP socket could not be bound.
    #[error("binding the detector socket {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The actor did not start.
    #[error("starting the detector actor: {0}")]
    Spawn(String),
}
