//! `[pg_lease]`: the pg-lease backend's database and lease row.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{tls, Section};

/// `[pg_lease]`: the pg-lease backend's database and lease row.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PgLeaseConfig {
    /// The lease store's URL, as the `baton_lease` role (`baton db init --backend pg-lease`
    /// writes it). No default: the pg-lease backend refuses to start without it. May be the
    /// fenced resource's server, but the lease lives in its own table.
    pub database_url: String,
    /// The lease row's name: nodes electing together share it.
    pub lease_name: String,
    /// PEM CA bundle that the server's certificate must chain to (feature `tls`); when set, the
    /// connection must be TLS (`sslmode=require`) and the server is verified.
    pub tls_ca_file: Option<PathBuf>,
}

impl Default for PgLeaseConfig {
    fn default() -> Self {
        PgLeaseConfig {
            database_url: String::new(),
            lease_name: "baton".into(),
            tls_ca_file: None,
        }
    }
}

impl Section for PgLeaseConfig {
    fn name(&self) -> &'static str {
        "pg_lease"
    }

    fn redacted_keys(&self) -> &'static [&'static str] {
        &["database_url", "tls_ca_file"]
    }

    fn tls_files(&self) -> Vec<(&'static str, &PathBuf)> {
        tls::named([("[pg_lease] tls_ca_file", &self.tls_ca_file)])
    }
}

#[cfg(test)]
mod tests {
    use crate::config::*;
    use crate::elector::BackendKind;

    /// `[pg_lease] database_url` has no default (it was a `postgres` superuser URL): nothing in
    /// the defaults points at a superuser.
    #[test]
    fn no_default_url_names_a_superuser() {
        let c = NodeConfig::for_backend(BackendKind::PgLease);
        assert_eq!(c.pg_lease.database_url, "");
        let text = toml::to_string(&NodeConfig::default()).unwrap();
        assert!(!text.contains("postgres://postgres"), "{text}");
    }
}
