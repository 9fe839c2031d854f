//! One etcd request, bounded in time, with etcd's failures mapped onto the elector's errors:
//! the ground floor of the etcd backend, shared by its elector (etcd.rs) and its expiry reaper
//! (etcd_expiry.rs), so neither imports the other.

use std::time::Duration;

use etcd_client::Client;

use super::{count_request, BackendKind, ElectorError, ElectorResult};

/// An etcd failure, as the elector reports it.
pub(super) fn unavailable(e: impl std::fmt::Display) -> ElectorError {
    ElectorError::Unavailable(e.to_string())
}

/// One etcd request, bounded by `timeout`; both failures are `Unavailable`.
pub(super) async fn bounded<T>(
    timeout: Duration,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> ElectorResult<T> {
    match tokio::time::timeout(timeout, f).await {
        Ok(r) => r.map_err(unavailable),
        Err(_) => Err(ElectorError::Unavailable(format!(
            "etcd did not answer within {timeout:?}"
        ))),
    }
}

/// Revokes `lease` (counted as `op`): `true` if this revoked it, `false` if it was already gone.
pub(super) async fn revoke_lease(
    client: &Client,
    lease: i64,
    timeout: Duration,
    op: &'static str,
) -> ElectorResult<bool> {
    let mut c = client.clone();
    count_request(BackendKind::Etcd, op);
    match bounded(timeout, c.lease_revoke(lease)).await {
        Ok(_) => Ok(true),
        Err(ElectorError::Unavailable(msg)) if msg.contains("lease not found") => Ok(false),
        Err(e) => Err(e),
    }
}
