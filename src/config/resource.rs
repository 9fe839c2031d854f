//! `[resource]`: the fenced resource (PostgreSQL), and whether it checks tokens (`fencing`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{tls, Section};

/// Whether the fenced resource checks tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fencing {
    /// The resource refuses a write with a stale token (the only setting for production).
    On,
    /// Exists only to prove fencing is load-bearing: the resource accepts any token.
    Off,
}

impl std::str::FromStr for Fencing {
    type Err = String;
    fn from_str(s: &str) -> Result<Fencing, String> {
        match s {
            "on" => Ok(Fencing::On),
            "off" => Ok(Fencing::Off),
            _ => Err(format!("fencing must be on or off, not {s:?}")),
        }
    }
}

/// `[resource]`: the fenced resource (PostgreSQL).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourceConfig {
    /// The fenced resource, connected to as this node's own role (`baton_node_<id>` from `baton
    /// db init --nodes`: it calls the fence's functions, writes only as this node, and writes the
    /// tables granted with `baton db grant`).
    pub database_url: String,
    /// Connections kept to it for claims, ticks and reads; a node that has run the sequencer
    /// keeps one more, its own (see `Fence::seq_pipe`).
    pub pool_size: usize,
    /// Server-side bound on each statement, and on waiting for or making a connection.
    pub statement_timeout_ms: u64,
    /// PEM CA bundle that the server's certificate must chain to (feature `tls`); when set, the
    /// connection must be TLS (`sslmode=require`) and the server is verified.
    pub tls_ca_file: Option<PathBuf>,
}

impl Default for ResourceConfig {
    fn default() -> Self {
        ResourceConfig {
            database_url: "postgres://baton_app@127.0.0.1:5432/baton".into(),
            pool_size: 4,
            statement_timeout_ms: 2000,
            tls_ca_file: None,
        }
    }
}

impl Section for ResourceConfig {
    fn name(&self) -> &'static str {
        "resource"
    }

    fn redacted_keys(&self) -> &'static [&'static str] {
        &["database_url", "tls_ca_file"]
    }

    fn tls_files(&self) -> Vec<(&'static str, &PathBuf)> {
        tls::named([("[resource] tls_ca_file", &self.tls_ca_file)])
    }
}
