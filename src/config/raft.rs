//! `[raft]`: the embedded raft group, and the raft side of the lease timing (the election
//! timeout, which caps the lease a single raft group grants).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, NodeConfig, Secret, Section};
use crate::elector::BackendKind;

/// One member of a raft fleet.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PeerSpec {
    /// The member's node id.
    pub id: String,
    /// `host:port` of the member's client HTTP server (where followers redirect clients).
    pub addr: String,
    /// `host:port` of the member's raft peer listener (`POST /peer/...`, authenticated).
    pub peer_addr: String,
}

/// `[raft]`: the embedded raft group.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftConfig {
    /// Every member, this node included.
    pub peers: Vec<PeerSpec>,
    /// How often the raft leader sends heartbeats (0: the default, 50 ms); at most half the
    /// minimum election timeout.
    pub heartbeat_interval_ms: u64,
    /// Where this node's raft peer listener binds; defaults to this node's `peer_addr` in
    /// `peers`. Never the client port: peer RPC has its own listener.
    pub peer_listen: Option<SocketAddr>,
    /// The shared cluster secret keying every peer request's HMAC. Required whenever the group
    /// has more than one member or the peer listener is not on loopback.
    pub cluster_secret: Option<Secret>,
    /// The cluster secret read from this file instead (surrounding whitespace trimmed; keep it
    /// 0600, the same on every member). Set this or `cluster_secret`, not both.
    pub cluster_secret_file: Option<PathBuf>,
}

impl RaftConfig {
    /// The configured cluster secret, read from the file if that is how it was given.
    pub fn secret(&self) -> Result<Option<Secret>, ConfigError> {
        match (&self.cluster_secret, &self.cluster_secret_file) {
            (Some(_), Some(_)) => Err(ConfigError::Invalid(
                "raft: set cluster_secret or cluster_secret_file, not both".into(),
            )),
            (Some(s), None) => Ok(Some(s.clone())),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                Ok(Some(Secret::new(text.trim())))
            }
            (None, None) => Ok(None),
        }
    }
}

impl Section for RaftConfig {
    fn name(&self) -> &'static str {
        "raft"
    }

    fn redacted_keys(&self) -> &'static [&'static str] {
        &[
            "peers",
            "peer_listen",
            "cluster_secret",
            "cluster_secret_file",
        ]
    }
}

impl NodeConfig {
    /// `(min, max)` of the Raft election timeout.
    pub fn election_timeout_range_ms(&self) -> Result<(u64, u64), ConfigError> {
        let bad = || {
            ConfigError::Invalid(format!(
                "election_timeout_ms {:?}: use MIN-MAX in ms",
                self.election_timeout_ms
            ))
        };
        let (lo, hi) = match self.election_timeout_ms.split_once('-') {
            Some((lo, hi)) => (
                lo.trim().parse().map_err(|_| bad())?,
                hi.trim().parse().map_err(|_| bad())?,
            ),
            None => {
                let v: u64 = self.election_timeout_ms.trim().parse().map_err(|_| bad())?;
                (v, v * 2)
            }
        };
        if lo == 0 || lo > hi {
            return Err(bad());
        }
        Ok((lo, hi))
    }

    /// The lease raft grants: `lease_ttl_ms`, capped by the minimum election timeout (see
    /// `backends::raft`: no rival can win sooner, so no longer lease is safe).
    pub fn raft_lease_ttl_ms(&self) -> Result<u64, ConfigError> {
        let (emin, _) = self.election_timeout_range_ms()?;
        Ok(self.lease_ttl_ms.min(emin))
    }

    /// Whether the lease granted is raft's own, capped by the minimum election timeout: raft
    /// with one shard. Sharded raft's shard leases are judged by the raft leader's clock and
    /// need no election bound (`backends::raft::shards`).
    pub(super) fn lease_capped_by_election(&self) -> bool {
        self.backend == BackendKind::Raft && self.shard_count() == 1
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::config::*;

    #[test]
    fn election_timeout_range_parses() {
        let c = NodeConfig {
            election_timeout_ms: "150-300".into(),
            ..NodeConfig::default()
        };
        assert_eq!(c.election_timeout_range_ms().unwrap(), (150, 300));
        let c = NodeConfig {
            election_timeout_ms: "300-150".into(),
            ..NodeConfig::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn the_cluster_secret_never_shows_in_debug_or_redacted_json() {
        let mut c = NodeConfig::default();
        c.raft.cluster_secret = Some(Secret::new("hunter2-hunter2-hunter2"));
        c.raft.cluster_secret_file = Some(PathBuf::from("/etc/baton/secret"));
        assert!(!format!("{c:?}").contains("hunter2"));
        let redacted = c.redacted_json().to_string();
        assert!(!redacted.contains("hunter2"), "{redacted}");
        assert!(!redacted.contains("/etc/baton/secret"), "{redacted}");
        // The generated TOML does carry it: that is how every node of a fleet gets it.
        assert!(toml::to_string(&c).unwrap().contains("hunter2"));
    }

    #[test]
    fn secret_inline_or_from_a_file_not_both() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "  from-the-file-0123456789\n").unwrap();
        let mut r = RaftConfig {
            cluster_secret_file: Some(path),
            ..RaftConfig::default()
        };
        assert_eq!(
            r.secret().unwrap().unwrap().expose(),
            "from-the-file-0123456789"
        );
        r.cluster_secret = Some(Secret::new("inline"));
        assert!(r.secret().is_err());
        r.cluster_secret_file = None;
        assert_eq!(r.secret().unwrap().unwrap().expose(), "inline");
    }
}
