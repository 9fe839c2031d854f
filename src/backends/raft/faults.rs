//! Fault injection for tests and chaos runs: cut one node's raft *peer* traffic without network
//! namespaces. **A test/chaos hook, not an operational feature.**
//!
//! While the file `<state_dir>/faults/isolate-peers` exists:
//!
//! * every outgoing peer RPC (append/heartbeat, vote, pre-vote, snapshot, transfer) is *dropped*:
//!   it is never sent, and the caller sees it time out after the RPC's own deadline, as it would
//!   behind a partition;
//! * every incoming authenticated `POST /peer/*` is refused (`503`), so the other members see this node as
//!   unreachable.
//!
//! Clients (`/status`, `/next`, `/stepdown`, `/metrics`) and the node's PostgreSQL connection are
//! untouched: this is "partition the leader from its election backend while it keeps serving
//! clients and reaching the resource" for the embedded backend, the scenario the self-fence exists
//! for. Remove the file to heal. The check is a `stat` at most every [`CHECK_EVERY`], cached in
//! between, so a file change takes effect within ~50 ms and costs nothing on the hot path.
//!
//! ```text
//! touch  <fleet dir>/nodes/n1/faults/isolate-peers   # isolate n1 from its peers
//! rm     <fleet dir>/nodes/n1/faults/isolate-peers   # heal
//! ```
//!
//! (Network namespaces + iptables give the general partition later; this hook needs no root.)

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The directory, under a node's state dir, that holds fault files.
pub const FAULTS_DIR: &str = "faults";
/// While this file exists in [`FAULTS_DIR`], the node's raft peer traffic is cut (both ways).
pub const ISOLATE_PEERS: &str = "isolate-peers";
/// How long a file check is cached.
pub const CHECK_EVERY: Duration = Duration::from_millis(50);

/// `<state_dir>/faults/isolate-peers`.
pub fn isolate_peers_path(state_dir: &Path) -> PathBuf {
    state_dir.join(FAULTS_DIR).join(ISOLATE_PEERS)
}

/// The cached view of one node's fault files.
pub struct PeerFaults {
    node_id: String,
    path: PathBuf,
    epoch: Instant,
    /// Milliseconds since `epoch` of the last check, plus one (0 = never checked).
    checked_ms: AtomicU64,
    isolated: AtomicBool,
}

impl PeerFaults {
    /// The fault files of `node_id`, under `state_dir`.
    pub fn new(node_id: &str, state_dir: &Path) -> PeerFaults {
        PeerFaults {
            node_id: node_id.to_owned(),
            path: isolate_peers_path(state_dir),
            epoch: Instant::now(),
            checked_ms: AtomicU64::new(0),
            isolated: AtomicBool::new(false),
        }
    }

    /// Whether peer traffic is cut right now (re-reads the file at most every [`CHECK_EVERY`]).
    pub fn isolated(&self) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        let last = self.checked_ms.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= CHECK_EVERY.as_millis() as u64;
        if due
            && self
                .checked_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let now_isolated = self.path.exists();
            let was = self.isolated.swap(now_isolated, Ordering::Relaxed);
            if was != now_isolated {
                if now_isolated {
                    tracing::warn!(node = %self.node_id, file = %self.path.display(),
                        "fault injection: raft peer traffic CUT (outgoing dropped, incoming refused)");
                } else {
                    tracing::warn!(node = %self.node_id, "fault injection: raft peer traffic restored");
                }
            }
        }
        self.isolated.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_toggles_isolation_within_the_check_interval() {
        let dir = tempfile::tempdir().unwrap();
        let f = PeerFaults::new("n1", dir.path());
        assert!(!f.isolated());
        let p = isolate_peers_path(dir.path());
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"").unwrap();
        std::thread::sleep(CHECK_EVERY + Duration::from_millis(10));
        assert!(f.isolated());
        std::fs::remove_file(&p).unwrap();
        std::thread::sleep(CHECK_EVERY + Duration::from_millis(10));
        assert!(!f.isolated());
    }
}
