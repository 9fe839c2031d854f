//! `[detector]`: how a dead leader is noticed (its lease running out, or a SWIM member).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Section};

/// Which failure detector a node runs (`[detector] kind`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DetectorKind {
    /// No detector: a dead leader is replaced when its lease runs out (the behaviour before
    /// the detector existed).
    #[default]
    Lease,
    /// A SWIM member per node (UDP, every datagram MACed with the cluster secret): when it
    /// confirms the leader dead, the others end its lease in the backend and campaign at once.
    Swim,
}

/// One member of the detector's gossip group: its node id and UDP `ip:port`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DetectorPeer {
    /// The member's node id.
    pub id: String,
    /// `ip:port` of the member's detector socket (UDP).
    pub addr: String,
}

/// `[detector]`: the failure detector. With `swim` the datagrams are authenticated with the
/// cluster secret (`[raft] cluster_secret` or `cluster_secret_file`, whatever the backend).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DetectorConfig {
    /// `lease` (default) or `swim`.
    pub kind: DetectorKind,
    /// Where this node's detector socket binds (UDP); defaults to this node's `addr` in `peers`.
    pub bind: Option<SocketAddr>,
    /// Every member of the gossip group, this node included. Datagrams from anyone else are
    /// dropped (and counted), and this node sends to nobody else.
    pub peers: Vec<DetectorPeer>,
    /// How often each member probes one other member (SWIM's protocol period). Lower finds a
    /// dead leader sooner and sends more datagrams (about 2 per member per period).
    pub probe_period_ms: u64,
    /// How long a direct probe waits for its ack before asking others to probe indirectly.
    pub probe_rtt_ms: u64,
    /// How long a member stays suspected (refutable by the member itself) before it is
    /// confirmed down. Too low, and a member that stalls this long is declared dead.
    pub suspect_ms: u64,
    /// How far a datagram's timestamp may be from this node's clock, either way; older or
    /// newer ones are dropped as stale (replays inside it are caught by sequence numbers).
    pub window_ms: u64,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig {
            kind: DetectorKind::Lease,
            bind: None,
            peers: Vec::new(),
            probe_period_ms: 150,
            probe_rtt_ms: 60,
            suspect_ms: 200,
            window_ms: 10_000,
        }
    }
}

impl Section for DetectorConfig {
    fn name(&self) -> &'static str {
        "detector"
    }

    /// Everything but whether this node is a member ([`DetectorConfig::check_member`]).
    fn validate(&self) -> Result<(), ConfigError> {
        if self.kind == DetectorKind::Lease {
            return Ok(());
        }
        if !cfg!(feature = "swim") {
            return Err(ConfigError::Invalid(
                "[detector] kind = \"swim\" needs baton built with `--features swim`".into(),
            ));
        }
        for p in &self.peers {
            if p.addr.parse::<SocketAddr>().is_err() {
                return Err(ConfigError::Invalid(format!(
                    "[detector] peer {:?}: addr {:?} is not an ip:port",
                    p.id, p.addr
                )));
            }
        }
        if self.peers.len() > 256 {
            return Err(ConfigError::Invalid("[detector] at most 256 peers".into()));
        }
        if !(10..=10_000).contains(&self.probe_period_ms)
            || self.probe_rtt_ms == 0
            || self.probe_rtt_ms >= self.probe_period_ms
        {
            return Err(ConfigError::Invalid(format!(
                "[detector] need 10 <= probe_period_ms <= 10000 and 0 < probe_rtt_ms < probe_period_ms, got {} and {}",
                self.probe_period_ms, self.probe_rtt_ms
            )));
        }
        if self.suspect_ms == 0 || !(1000..=300_000).contains(&self.window_ms) {
            return Err(ConfigError::Invalid(format!(
                "[detector] need suspect_ms > 0 and 1000 <= window_ms <= 300000, got {} and {}",
                self.suspect_ms, self.window_ms
            )));
        }
        Ok(())
    }
}

impl DetectorConfig {
    /// With `swim`, this node must be in the gossip group: listed in `peers`, or given a `bind`.
    pub fn check_member(&self, node_id: &str) -> Result<(), ConfigError> {
        if self.kind == DetectorKind::Swim
            && !self.peers.iter().any(|p| p.id == node_id)
            && self.bind.is_none()
        {
            return Err(ConfigError::Invalid(format!(
                "[detector] peers does not list this node ({node_id:?}) and bind is not set"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::*;

    #[test]
    fn the_detector_is_off_by_default_and_swim_is_checked() {
        let base = NodeConfig::default();
        assert_eq!(base.detector.kind, DetectorKind::Lease);
        base.validate().unwrap();
        let mut cfg = base.clone();
        cfg.detector.kind = DetectorKind::Swim;
        // No peers and no bind: refused (with or without the feature, for its own reason).
        assert!(cfg.validate().is_err());
        cfg.detector.peers = vec![DetectorPeer {
            id: "n1".into(),
            addr: "127.0.0.1:7946".into(),
        }];
        assert_eq!(cfg.validate().is_ok(), cfg!(feature = "swim"));
        if cfg!(feature = "swim") {
            let mut bad = cfg.clone();
            bad.detector.peers[0].addr = "somewhere".into();
            assert!(bad.validate().is_err());
            let mut bad = cfg.clone();
            bad.detector.probe_rtt_ms = bad.detector.probe_period_ms;
            assert!(bad.validate().is_err());
            let mut bad = cfg.clone();
            bad.detector.window_ms = 10;
            assert!(bad.validate().is_err());
        }
        let text = "[detector]\nkind = \"swim\"\nbind = \"127.0.0.1:0\"\n";
        let parsed: NodeConfig = toml::from_str(text).unwrap();
        assert_eq!(parsed.detector.kind, DetectorKind::Swim);
        assert!(toml::from_str::<NodeConfig>("[detector]\nkind = \"gossip\"\n").is_err());
    }
}
