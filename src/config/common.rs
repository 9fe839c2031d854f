//! What every election backend is given beside its own section.

use std::time::Duration;

use super::NodeConfig;

/// This node's identity and lease timing, as an election backend needs them beside its own
/// section (`[etcd]`, `[zk]`, ...): a backend is built from the two, not from the whole
/// [`NodeConfig`]. TLS is each section's own (its CA bundle, its URL scheme).
#[derive(Clone, Debug)]
pub struct BackendCommon {
    /// [`NodeConfig::node_id`]: the candidate's id.
    pub node_id: String,
    /// [`NodeConfig::advertise_addr`]: published with the candidacy, so that followers can
    /// redirect clients to the leader.
    pub advertise_addr: Option<String>,
    /// [`NodeConfig::lease_ttl_ms`].
    pub lease_ttl: Duration,
    /// [`NodeConfig::renew_interval_ms`].
    pub renew_interval: Duration,
    /// [`NodeConfig::retry_interval_ms`].
    pub retry_interval: Duration,
    /// [`NodeConfig::clock_rate_error`].
    pub clock_rate_error: f64,
}

impl NodeConfig {
    /// What this config gives every election backend beside the backend's own section.
    pub fn backend_common(&self) -> BackendCommon {
        BackendCommon {
            node_id: self.node_id.clone(),
            advertise_addr: self.advertise_addr.clone(),
            lease_ttl: self.lease_ttl(),
            renew_interval: self.renew_interval(),
            retry_interval: self.retry_interval(),
            clock_rate_error: self.clock_rate_error,
        }
    }
}
