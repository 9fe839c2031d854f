//! `[etcd]`: the etcd backend's cluster and election.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{tls, ConfigError, Section};

/// `[etcd]`: the etcd backend's cluster and election.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdConfig {
    /// Client URLs of the cluster's members (`https://` with `tls_ca_file`).
    pub endpoints: Vec<String>,
    /// The election name; `etcdctl elect NAME` on the same name interoperates.
    pub election_name: String,
    /// Bound on each request (and on connecting).
    pub request_timeout_ms: u64,
    /// PEM CA bundle that etcd's server certificates must chain to (feature `tls`); the
    /// endpoints must then be `https://`.
    pub tls_ca_file: Option<PathBuf>,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            election_name: "baton".into(),
            request_timeout_ms: 1000,
            tls_ca_file: None,
        }
    }
}

impl Section for EtcdConfig {
    fn name(&self) -> &'static str {
        "etcd"
    }

    /// A CA needs `https://` endpoints.
    fn validate(&self) -> Result<(), ConfigError> {
        if self.tls_ca_file.is_some() && !self.endpoints.iter().all(|e| e.starts_with("https://")) {
            return Err(ConfigError::Invalid(
                "[etcd] tls_ca_file needs https:// endpoints".into(),
            ));
        }
        Ok(())
    }

    fn redacted_keys(&self) -> &'static [&'static str] {
        &["endpoints", "tls_ca_file"]
    }

    fn tls_files(&self) -> Vec<(&'static str, &PathBuf)> {
        tls::named([("[etcd] tls_ca_file", &self.tls_ca_file)])
    }
}
