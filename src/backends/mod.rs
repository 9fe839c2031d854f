//! The election backends, one module per backend behind its own cargo feature, each implementing
//! the [`Elector`] seam (defined in [`crate::elector`], re-exported here). [`build`] picks the
//! configured one; a user's own `Elector` is given to the node builder directly.
#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(all(
    feature = "conformance",
    any(feature = "pg-lease", feature = "redis", feature = "raft")
))]
pub mod conformance_polling;
#[cfg(any(feature = "pg-lease", feature = "redis", feature = "raft"))]
mod epoch_lease;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "etcd")]
pub mod etcd_expiry;
#[cfg(feature = "etcd")]
mod etcd_rpc;
#[cfg(feature = "etcd")]
mod etcd_vacancy;
#[cfg(feature = "pg-lease")]
pub mod pg_lease;
#[cfg(any(feature = "pg-lease", feature = "redis", feature = "raft"))]
pub mod polling;
#[cfg(feature = "raft")]
pub mod raft;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(
    feature = "etcd",
    feature = "pg-lease",
    feature = "redis",
    feature = "raft",
    feature = "zk"
))]
mod renew_batch;
#[cfg(feature = "zk")]
pub mod zk;

use std::sync::Arc;

use crate::config::{NodeConfig, ShardNames};
pub use crate::elector::*;

/// One elector per shard of a node, from the node's one config and each shard's names (`shards[s]`
/// for shard s, [`NodeConfig::shard_names`]). Where the backend
/// lets the shards share the node's liveness session, they do, so renewals do not grow with the
/// number of shards: etcd (one lease and one keepalive stream per node), pg-lease (one `UPDATE`
/// renews every row the node holds), redis (one script call renews every key it holds), raft at
/// K > 1 (one raft group per fleet whose state machine holds every shard's lease: one request
/// to the raft leader renews all of a node's shards, `raft::shards`), zk (one candidacy session
/// and one read-only session per node; one `sync` with one multi-read of every held znode
/// renews them all). At K = 1 every backend builds exactly what [`build`] builds (raft: its
/// leader is the one leader, as before shards).
pub async fn build_shards(
    cfg: &NodeConfig,
    shards: &[ShardNames],
) -> ElectorResult<Vec<Arc<dyn Elector>>> {
    if shards.is_empty() {
        return Ok(Vec::new());
    }
    match cfg.backend {
        #[cfg(feature = "etcd")]
        BackendKind::Etcd => Ok(shared(
            etcd::EtcdElector::connect_shards(&cfg.backend_common(), &cfg.etcd, shards).await?,
        )),
        #[cfg(feature = "pg-lease")]
        BackendKind::PgLease => Ok(shared(
            pg_lease::PgLeaseElector::connect_shards(&shard_configs(cfg, shards)).await?,
        )),
        #[cfg(feature = "redis")]
        kind @ (BackendKind::Redis | BackendKind::RedisNaive) => Ok(shared(
            redis::RedisElector::connect_shards(
                &shard_configs(cfg, shards),
                kind == BackendKind::Redis,
            )
            .await?,
        )),
        #[cfg(feature = "zk")]
        BackendKind::Zk => Ok(shared(
            zk::ZkElector::connect_shards(&cfg.backend_common(), &cfg.zk, shards).await?,
        )),
        #[cfg(feature = "raft")]
        BackendKind::Raft if shards.len() > 1 => Ok(shared(
            raft::shards::connect_shards(&shard_configs(cfg, shards)).await?,
        )),
        // Raft with one shard (its election has no name), or a backend that is not compiled in
        // (`build` names its feature).
        _ => {
            let mut electors = Vec::with_capacity(shards.len());
            for _ in shards {
                electors.push(build(cfg).await?);
            }
            Ok(electors)
        }
    }
}

/// One whole config per shard, its election's name carrying the shard's suffix: what pg-lease,
/// redis and sharded raft still take (etcd and zk take their section, [`BackendCommon`](crate::config::BackendCommon)
/// and the shards' names instead).
#[cfg(any(feature = "pg-lease", feature = "redis", feature = "raft"))]
fn shard_configs(cfg: &NodeConfig, shards: &[ShardNames]) -> Vec<NodeConfig> {
    shards
        .iter()
        .map(|names| {
            let mut c = cfg.clone();
            c.redis.key = names.election(&cfg.redis.key);
            c.pg_lease.lease_name = names.election(&cfg.pg_lease.lease_name);
            c
        })
        .collect()
}

/// A node's shard electors, as the node holds them.
#[cfg(any(
    feature = "etcd",
    feature = "pg-lease",
    feature = "redis",
    feature = "raft",
    feature = "zk"
))]
fn shared<E: Elector>(electors: Vec<E>) -> Vec<Arc<dyn Elector>> {
    electors
        .into_iter()
        .map(|e| Arc::new(e) as Arc<dyn Elector>)
        .collect()
}

/// The config the shards of one node share their session by (the first shard's: every shard
/// config differs only in its election's name).
#[cfg(any(feature = "pg-lease", feature = "redis"))]
fn session_config(cfgs: &[NodeConfig]) -> ElectorResult<&NodeConfig> {
    cfgs.first()
        .ok_or_else(|| ElectorError::Config("no shard to elect for".into()))
}

/// Builds the configured backend. A backend whose cargo feature is off is a configuration error
/// that names the feature.
pub async fn build(cfg: &NodeConfig) -> ElectorResult<Arc<dyn Elector>> {
    match cfg.backend {
        #[cfg(feature = "etcd")]
        BackendKind::Etcd => Ok(Arc::new(
            etcd::EtcdElector::connect(&cfg.backend_common(), &cfg.etcd).await?,
        )),
        #[cfg(feature = "raft")]
        BackendKind::Raft => Ok(Arc::new(raft::RaftElector::start(cfg).await?)),
        #[cfg(feature = "redis")]
        BackendKind::RedisNaive => Ok(Arc::new(redis::RedisElector::connect(cfg, false).await?)),
        #[cfg(feature = "redis")]
        BackendKind::Redis => Ok(Arc::new(redis::RedisElector::connect(cfg, true).await?)),
        #[cfg(feature = "pg-lease")]
        BackendKind::PgLease => Ok(Arc::new(pg_lease::PgLeaseElector::connect(cfg).await?)),
        #[cfg(feature = "zk")]
        BackendKind::Zk => Ok(Arc::new(
            zk::ZkElector::connect(&cfg.backend_common(), &cfg.zk).await?,
        )),
        #[allow(unreachable_patterns)]
        other => Err(ElectorError::Config(format!(
            "the {other} backend is not compiled in: build baton with `--features {}`",
            other.feature()
        ))),
    }
}

impl BackendKind {
    /// The cargo feature that compiles this backend in.
    pub fn feature(self) -> &'static str {
        match self {
            BackendKind::Etcd => "etcd",
            BackendKind::Raft => "raft",
            BackendKind::RedisNaive | BackendKind::Redis => "redis",
            BackendKind::Zk => "zk",
            BackendKind::PgLease => "pg-lease",
            BackendKind::Custom => "(none: give it to NodeBuilder::with_elector)",
        }
    }
}
