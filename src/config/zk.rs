//! `[zk]`: the ZooKeeper backend's ensemble and election node.

use serde::{Deserialize, Serialize};

use super::Section;

/// `[zk]`: the ZooKeeper backend's ensemble and election node.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ZkConfig {
    /// `host:port,host:port,...`
    pub connect: String,
    /// The parent znode of the election's sequential candidates.
    pub election_path: String,
    /// Bound on each request (and 3× on establishing a session).
    pub request_timeout_ms: u64,
}

impl Default for ZkConfig {
    fn default() -> Self {
        ZkConfig {
            connect: "127.0.0.1:2181".into(),
            election_path: "/baton/election".into(),
            request_timeout_ms: 1000,
        }
    }
}

impl Section for ZkConfig {
    fn name(&self) -> &'static str {
        "zk"
    }

    fn redacted_keys(&self) -> &'static [&'static str] {
        &["connect"]
    }
}
