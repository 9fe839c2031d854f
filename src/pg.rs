//! PostgreSQL connections, shared by every part of a node that talks to PostgreSQL (the fence in
//! `work`, the `pg-lease` backend): one place that builds a pool (TLS or plain) and one that
//! renders a driver error with its causes. It sits below both, so neither imports the other.

use deadpool_postgres::{Config as PoolConfig, Pool, Runtime};
use tokio_postgres::NoTls;

/// An error with its sources: tokio-postgres says only "db error" or "error performing TLS
/// handshake" at the top, the reason (e.g. an unknown issuer) is below.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Builds the pool for `pc`: over TLS verified against `tls_ca_file` when it is set, with
/// `sslmode=require` (never a silent fallback to plain text, whatever the URL says); plain
/// otherwise. Every PostgreSQL pool of a node (the fence's, pg-lease's) is made here.
pub(crate) fn create_pool(
    pc: PoolConfig,
    tls_ca_file: Option<&std::path::Path>,
) -> Result<Pool, String> {
    let Some(ca) = tls_ca_file else {
        return pc
            .create_pool(Some(Runtime::Tokio1), NoTls)
            .map_err(|e| e.to_string());
    };
    #[cfg(feature = "tls")]
    {
        let mut pc = pc;
        let tls = crate::tls::postgres_connector(ca).map_err(|e| e.to_string())?;
        pc.ssl_mode = Some(deadpool_postgres::SslMode::Require);
        pc.create_pool(Some(Runtime::Tokio1), tls)
            .map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "tls"))]
    Err(format!(
        "tls_ca_file {} is set, but this build of baton has no TLS (cargo feature `tls`)",
        ca.display()
    ))
}
