//! Node configuration: a TOML file (`config/*.toml`) overlaid by command-line flags.
//!
//! Timing is validated when the config is built, in the spirit of client-go's leaderelection:
//! `lease_ttl > renew_interval > retry_interval`, and the lease, less the watchdog's safety
//! margin, must hold three renewal intervals plus 5 ms, so that after each renewal two more may
//! fail or come late before the watchdog demotes the leader. A config that fails this never
//! starts a node. The timing defaults are the backend's ([`NodeConfig::for_backend`]), also for
//! a config file that names a backend and leaves its timing out.
//!
//! One file per section: each `[section]`'s struct is in a file of its own and implements
//! [`Section`] (the checks it makes on its own, the keys it keeps out of reports, the TLS files
//! it names). This file holds [`NodeConfig`] itself, its loading and the checks that span
//! sections; the lease timing (top-level keys) is `timing.rs`'s, raft's election timeout
//! `raft.rs`'s. Every type is re-exported here: `baton::config::X` names each of them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::elector::BackendKind;

mod budget;
mod common;
mod detector;
mod etcd;
mod http;
mod pg_lease;
mod raft;
mod read;
mod redis;
mod resource;
mod scheduler;
mod secret;
mod sequencer;
mod shards;
mod timing;
mod tls;
mod zk;

pub use budget::{
    FailureBudgetConfig, TermBackoffConfig, MAX_FAILURE_BUDGET_TERMS, MAX_FAILURE_BUDGET_WINDOW_MS,
};
pub use common::BackendCommon;
pub use detector::{DetectorConfig, DetectorKind, DetectorPeer};
pub use etcd::EtcdConfig;
pub use http::HttpConfig;
pub use pg_lease::PgLeaseConfig;
pub use raft::{PeerSpec, RaftConfig};
pub use read::{lease_read_until, ReadMode};
pub use redis::RedisConfig;
pub use resource::{Fencing, ResourceConfig};
pub use scheduler::SchedulerConfig;
pub use secret::{Secret, MIN_ADMIN_TOKEN_BYTES};
pub use sequencer::{SequencerConfig, SequencerMode, MAX_WINDOW_IDS};
pub use shards::{MemberSpec, ShardNames, ShardsConfig, MAX_SHARDS};
pub use timing::{
    parse_duration_ms, BACKEND_TIMING_KEYS, RENEWALS_PER_USABLE_LEASE, RENEWAL_SLACK_MS,
    STOP_MARGIN_ELECTION_SPREAD_MS,
};
pub use zk::ZkConfig;

/// Why a config was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file (or a secret file it names) could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A file the config names (a TLS certificate, key or CA) could not be read.
    #[error("cannot read {option} {path}: {source}")]
    File {
        /// The option that names it, e.g. `[http] tls_key_file`.
        option: &'static str,
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The config file is not valid TOML for a [`NodeConfig`].
    #[error("cannot parse config {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        source: toml::de::Error,
    },
    /// A duration flag that [`parse_duration_ms`] cannot read.
    #[error("invalid duration {0:?}: use e.g. 3s, 250ms or a plain number of milliseconds")]
    Duration(String),
    /// Lease timing that cannot be safe (see the module docs).
    #[error("invalid timing: {0}")]
    Timing(String),
    /// Any other refused setting.
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// A `[section]` of the node config, as the config as a whole sees it: the checks it makes on
/// its own, what of it stays out of reports, and the TLS files it names. The checks that need
/// more than one section (this node among the members, the step-down bound) are
/// [`NodeConfig::validate`]'s.
pub trait Section {
    /// The section's table (`redis` for `[redis]`).
    fn name(&self) -> &'static str;

    /// The checks that need nothing outside the section; none by default.
    fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }

    /// The keys [`NodeConfig::redacted_json`] leaves out of the section: what differs per node or
    /// per run (addresses, paths, URLs) and secrets; none by default.
    fn redacted_keys(&self) -> &'static [&'static str] {
        &[]
    }

    /// The TLS files the section names (certificates, keys, CA bundles), each with the option
    /// that names it: [`NodeConfig::validate`] refuses one it cannot read, and any in a build
    /// without TLS. None by default.
    fn tls_files(&self) -> Vec<(&'static str, &PathBuf)> {
        Vec::new()
    }
}

/// One node's whole configuration (`config/*.toml`, overlaid by flags). Every field has a
/// default; [`NodeConfig::validate`] refuses combinations that cannot be safe.
///
/// The timing keys' defaults ([`BACKEND_TIMING_KEYS`]) are the named backend's: TOML (or any
/// self-describing format) that says `backend = "pg-lease"` and sets no timing reads as
/// [`NodeConfig::for_backend`]`(PgLease)`'s 3 s lease, not raft's 150 ms one; keys it sets keep
/// their values. Without a `backend` key the backend is raft, with [`NodeConfig::default`]'s
/// timing.
#[derive(Clone, Debug, Serialize, Deserialize)]
// `remote = "Self"`: the derives become the inherent `NodeConfig::deserialize` / `serialize`
// (the field-by-field work), and the trait impls below wrap them to apply the backend's timing.
#[serde(default, deny_unknown_fields, remote = "Self")]
pub struct NodeConfig {
    /// This node's id: 1-64 of `[A-Za-z0-9_-]`, unique in the fleet; the fence's holder.
    pub node_id: String,
    /// The election backend (default `raft`: see [`NodeConfig::for_backend`] for the others).
    pub backend: BackendKind,
    /// Where this node's HTTP server listens.
    pub http_listen: SocketAddr,
    /// The address other nodes and clients should use (defaults to the bound address).
    pub advertise_addr: Option<String>,
    /// How long a granted lease lasts. On raft with one shard the raft leader's lease, capped at
    /// the minimum election timeout; on sharded raft (`[shards] count` > 1) each shard's lease
    /// in the raft group's lease table, not capped (`config/raft-shards.toml`: 3000). Its
    /// default is the backend's: 150 on raft, 3000 on the others.
    pub lease_ttl_ms: u64,
    /// How often the leader renews its lease: the usable lease (the lease less the safety
    /// margin) must hold 3 of these + 5 ms (see [`NodeConfig::validate`]). Its default is the
    /// backend's: 40 on raft, 600 on zk, 800 on the others.
    pub renew_interval_ms: u64,
    /// How often a follower retries a campaign, and a failed renewal is retried. Its default is
    /// the backend's: 20 on raft, 250 on the others.
    pub retry_interval_ms: u64,
    /// The largest clock-rate error the lease arithmetic tolerates (0.01 = 1%).
    pub clock_rate_error: f64,
    /// A fixed margin subtracted from every lease deadline on top of the rate error. Its
    /// default is the backend's: 20 on raft, 100 on the others.
    pub deadline_margin_ms: u64,
    /// How `GET /read` is answered when the request names no `?mode=`.
    pub read_mode_default: ReadMode,
    /// A `lease` read is answered from memory only while
    /// `now < lease_deadline - (clock_rate_error x elapsed_since_renew_send + read_lease_margin_ms)`
    /// (see [`lease_read_until`]); outside it the read falls back to `quorum`.
    pub read_lease_margin_ms: u64,
    /// Offset of this node's wall clock (experiments only; wall time never decides a lease).
    pub clock_skew_ms: i64,
    /// Injected rate error of this node's clock (experiments only).
    pub clock_drift: f64,
    /// Raft election timeout range in ms, "min-max".
    pub election_timeout_ms: String,
    /// Whether the fenced resource checks tokens (`off` only to show what fencing prevents).
    pub fencing: Fencing,
    /// How long demotion waits for each leader-work actor to stop before killing it.
    pub work_stop_timeout_ms: u64,
    /// Extra time taken off every lease deadline so that leader work which needs time to stop
    /// (an external program: `baton run --child-stop-margin`) has stopped before the lease could
    /// expire: the watchdog demotes this much earlier. 0 by default.
    pub work_stop_margin_ms: u64,
    /// Bearer token required by `POST /stepdown` when set; required when `http_listen` is not
    /// loopback. Never printed (`Debug` redacts it) and never in [`NodeConfig::redacted_json`].
    pub admin_token: Option<Secret>,
    /// Where this node keeps its state (raft log, actor trace).
    pub state_dir: PathBuf,
    /// `[etcd]`: the etcd backend.
    pub etcd: EtcdConfig,
    /// `[raft]`: the embedded raft backend.
    pub raft: RaftConfig,
    /// `[redis]`: the redis and redis-naive backends.
    pub redis: RedisConfig,
    /// `[zk]`: the ZooKeeper backend.
    pub zk: ZkConfig,
    /// `[pg_lease]`: the pg-lease backend.
    pub pg_lease: PgLeaseConfig,
    /// `[resource]`: the fenced resource (PostgreSQL).
    pub resource: ResourceConfig,
    /// `[scheduler]`: the built-in scheduler job.
    pub scheduler: SchedulerConfig,
    /// `[sequencer]`: the built-in ID sequencer behind `POST /next`.
    pub sequencer: SequencerConfig,
    /// `[http]`: the client HTTP server's limits and TLS.
    pub http: HttpConfig,
    /// `[shards]`: how many independent terms of leadership the fleet runs, and placement.
    pub shards: ShardsConfig,
    /// `[term_backoff]`: how long this node waits before campaigning again after terms whose
    /// leader work failed.
    pub term_backoff: TermBackoffConfig,
    /// `[failure_budget]`: how many failed terms a shard may spend, fleet-wide, within a window
    /// before every node stops campaigning for it until the window passes or `baton budget
    /// reset` (counted in the fenced resource; a node that cannot read it backs off locally only).
    pub failure_budget: FailureBudgetConfig,
    /// `[detector]`: how a dead leader is noticed: by its lease running out (`lease`, the
    /// default) or, sooner, by a SWIM gossip failure detector (`swim`, cargo feature `swim`).
    pub detector: DetectorConfig,
}

/// The default config is the default backend's: raft, with the timing raft accepts. A raft
/// leader may act on a lease no longer than the minimum election timeout (150 ms with the default
/// `150-250`, see `backends::raft`), so it renews every 40 ms (one heartbeat round each) with a
/// 20 ms margin; a 3-node group on loopback needs only `node_id`, `state_dir` (one per node),
/// `raft.peers` and `raft.cluster_secret` on top of it. For another backend start from
/// [`NodeConfig::for_backend`]: a 150 ms lease renewed every 40 ms would make a lease backend's
/// store take a write every 40 ms from the leader and every 20 ms from each follower.
impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            node_id: "n1".into(),
            backend: BackendKind::Raft,
            http_listen: "127.0.0.1:0".parse().unwrap(),
            advertise_addr: None,
            lease_ttl_ms: 150,
            renew_interval_ms: 40,
            retry_interval_ms: 20,
            clock_rate_error: 0.01,
            deadline_margin_ms: 20,
            read_mode_default: ReadMode::Lease,
            read_lease_margin_ms: 50,
            clock_skew_ms: 0,
            clock_drift: 0.0,
            election_timeout_ms: "150-250".into(),
            fencing: Fencing::On,
            work_stop_timeout_ms: 2000,
            work_stop_margin_ms: 0,
            admin_token: None,
            state_dir: PathBuf::from("state/n1"),
            etcd: EtcdConfig::default(),
            raft: RaftConfig::default(),
            redis: RedisConfig::default(),
            zk: ZkConfig::default(),
            pg_lease: PgLeaseConfig::default(),
            resource: ResourceConfig::default(),
            scheduler: SchedulerConfig::default(),
            sequencer: SequencerConfig::default(),
            http: HttpConfig::default(),
            shards: ShardsConfig::default(),
            term_backoff: TermBackoffConfig::default(),
            failure_budget: FailureBudgetConfig::default(),
            detector: DetectorConfig::default(),
        }
    }
}

impl Serialize for NodeConfig {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        NodeConfig::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for NodeConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<NodeConfig, D::Error> {
        use serde::de::Error;
        let table = toml::Table::deserialize(deserializer)?;
        let set: Vec<String> = table.keys().cloned().collect();
        let raw = NodeConfig::deserialize(toml::Value::Table(table)).map_err(D::Error::custom)?;
        Ok(raw.with_backend_timing(|key| set.iter().any(|k| k == key)))
    }
}

impl NodeConfig {
    /// Every section, in the order [`NodeConfig::validate`] checks them.
    fn sections(&self) -> [&dyn Section; 13] {
        [
            &self.sequencer,
            &self.http,
            &self.term_backoff,
            &self.failure_budget,
            &self.detector,
            &self.resource,
            &self.pg_lease,
            &self.redis,
            &self.etcd,
            &self.zk,
            &self.raft,
            &self.scheduler,
            &self.shards,
        ]
    }

    /// This config minus what differs per node or per run (ids, addresses, paths, URLs,
    /// secrets): what a benchmark or experiment report records as "the config". Each section
    /// says what of it goes ([`Section::redacted_keys`]).
    pub fn redacted_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            for k in [
                "node_id",
                "http_listen",
                "advertise_addr",
                "state_dir",
                "admin_token",
            ] {
                o.remove(k);
            }
            for section in self.sections() {
                if let Some(s) = o.get_mut(section.name()).and_then(|s| s.as_object_mut()) {
                    for key in section.redacted_keys() {
                        s.remove(*key);
                    }
                }
            }
        }
        v
    }

    /// Reads a TOML config file (unknown keys are errors). The timing keys it does not set
    /// are its backend's defaults ([`NodeConfig::for_backend`]): a file that names
    /// `backend = "pg-lease"` and no timing runs on pg-lease's 3 s lease.
    pub fn from_file(path: &Path) -> Result<NodeConfig, ConfigError> {
        NodeConfig::from_file_as(path, None)
    }

    /// [`NodeConfig::from_file`], with `backend` (when given) in place of the file's own
    /// `backend` key, before the backend's timing defaults fill the keys the file leaves out:
    /// what `--config FILE --backend NAME` means.
    pub fn from_file_as(
        path: &Path,
        backend: Option<BackendKind>,
    ) -> Result<NodeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let parse = |source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        };
        // Parsed straight from the text (not through `Deserialize for NodeConfig`), so that an
        // error names its line and column.
        let table: toml::Table = toml::from_str(&text).map_err(parse)?;
        let mut c = NodeConfig::deserialize(toml::Deserializer::new(&text)).map_err(parse)?;
        if let Some(b) = backend {
            c.backend = b;
        }
        Ok(c.with_backend_timing(|key| table.contains_key(key)))
    }

    /// The construction-time checks. Rejects any config whose lease arithmetic cannot be safe;
    /// a timing error names the setting to change and a value that works. In order: the timing,
    /// this node's id, each section on its own ([`Section::validate`]: sequencer, http,
    /// term_backoff, failure_budget, detector, then the resource's and the backends', then
    /// shards), then what spans sections (this node in the detector's group,
    /// the step-down bound, the TLS files, this node among the shards' members, the admin
    /// token), so that of two errors in one config the first in that order is reported.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_timing()?;
        self.validate_node()?;
        self.election_timeout_range_ms()?;
        let sections = self.sections();
        for section in sections {
            section.validate()?;
        }
        self.detector.check_member(&self.node_id)?;
        self.check_stepdown_bound()?;
        tls::check_files(&sections)?;
        self.validate_shard_members()?;
        self.check_admin_surface(self.http_listen.ip())
    }

    /// The node's own keys: its id, and the injected clock drift.
    fn validate_node(&self) -> Result<(), ConfigError> {
        if self.node_id.is_empty()
            || self.node_id.len() > 64
            || !self
                .node_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ConfigError::Invalid(format!(
                "node_id {:?}: 1-64 of [A-Za-z0-9_-]",
                self.node_id
            )));
        }
        if self.clock_drift.abs() >= 0.5 {
            return Err(ConfigError::Invalid(
                "clock_drift must be in (-0.5, 0.5)".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 43: a config file that named `backend = "pg-lease"` and set no timing ran on
    /// raft's 150 ms lease renewed every 40 ms, against PostgreSQL, without a word. It gets
    /// pg-lease's timing now, from `from_file` and from plain TOML parsing alike; the keys it
    /// does set keep their values, and `--backend` (from_file_as) picks the defaults too.
    #[test]
    fn a_file_that_names_pg_lease_gets_pg_lease_timing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        let text = "node_id = \"n1\"\nbackend = \"pg-lease\"\n\n[pg_lease]\ndatabase_url = \"postgres://baton_lease:pw@db/baton\"\n";
        std::fs::write(&path, text).unwrap();
        let pg = NodeConfig::for_backend(BackendKind::PgLease);
        let timing = |c: &NodeConfig| {
            (
                c.lease_ttl_ms,
                c.renew_interval_ms,
                c.retry_interval_ms,
                c.deadline_margin_ms,
            )
        };
        let from_file = NodeConfig::from_file(&path).unwrap();
        assert_eq!(timing(&from_file), timing(&pg), "from_file");
        assert_eq!(timing(&from_file), (3000, 800, 250, 100));
        let parsed: NodeConfig = toml::from_str(text).unwrap();
        assert_eq!(timing(&parsed), timing(&pg), "toml::from_str");
        from_file.validate().unwrap();

        // A key the file sets is kept; the others are still pg-lease's.
        let set = format!("lease_ttl_ms = 6000\n{text}");
        let parsed: NodeConfig = toml::from_str(&set).unwrap();
        assert_eq!(timing(&parsed), (6000, 800, 250, 100));

        // No backend named: raft, with raft's timing.
        let raft: NodeConfig = toml::from_str("node_id = \"n1\"\n").unwrap();
        assert_eq!(timing(&raft), timing(&NodeConfig::default()));
        // A raft file run with --backend etcd gets etcd's timing.
        std::fs::write(&path, "node_id = \"n1\"\n").unwrap();
        let etcd = NodeConfig::from_file_as(&path, Some(BackendKind::Etcd)).unwrap();
        assert_eq!(etcd.backend, BackendKind::Etcd);
        assert_eq!(
            timing(&etcd),
            timing(&NodeConfig::for_backend(BackendKind::Etcd))
        );

        // from_file still says where a bad key is.
        std::fs::write(&path, "node_id = \"n1\"\nlease_tll_ms = 5\n").unwrap();
        let err = NodeConfig::from_file(&path).unwrap_err().to_string();
        assert!(
            err.contains("lease_tll_ms") && err.contains("line 2"),
            "{err}"
        );
        assert!(toml::from_str::<NodeConfig>("lease_tll_ms = 5\n").is_err());
    }

    /// Every table of the config is a section [`NodeConfig::sections`] lists, so that each is
    /// validated and redacted.
    #[test]
    fn every_table_is_a_listed_section() {
        let c = NodeConfig::default();
        let table = toml::Table::try_from(&c).unwrap();
        let listed: Vec<&str> = c.sections().iter().map(|s| s.name()).collect();
        let tables: Vec<&str> = table
            .iter()
            .filter(|(_, v)| v.is_table())
            .map(|(k, _)| k.as_str())
            .collect();
        for t in &tables {
            assert!(listed.contains(t), "[{t}] is not in NodeConfig::sections");
        }
        assert_eq!(listed.len(), tables.len(), "{listed:?} against {tables:?}");
    }

    /// What a report leaves out: exactly these keys (the list `redacted_json` kept before each
    /// section said its own).
    #[test]
    fn the_report_leaves_out_what_differs_per_node_and_the_secrets() {
        let c = NodeConfig::default();
        let full = serde_json::to_value(&c).unwrap();
        let redacted = c.redacted_json();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            let o = v.as_object().unwrap();
            let mut out: Vec<String> = o.keys().cloned().collect();
            for (k, sub) in o {
                if let Some(s) = sub.as_object() {
                    out.extend(s.keys().map(|key| format!("{k}.{key}")));
                }
            }
            out
        };
        let kept = keys(&redacted);
        let mut gone: Vec<String> = keys(&full)
            .into_iter()
            .filter(|k| !kept.contains(k))
            .collect();
        gone.sort();
        let mut expected = vec![
            "node_id",
            "http_listen",
            "advertise_addr",
            "state_dir",
            "admin_token",
            "resource.database_url",
            "pg_lease.database_url",
            "etcd.endpoints",
            "redis.url",
            "redis.sentinels",
            "redis.sentinel_password",
            "raft.peers",
            "raft.peer_listen",
            "raft.cluster_secret",
            "raft.cluster_secret_file",
            "zk.connect",
            "resource.tls_ca_file",
            "pg_lease.tls_ca_file",
            "etcd.tls_ca_file",
            "redis.tls_ca_file",
            "http.tls_cert_file",
            "http.tls_key_file",
            "http.member_ca_file",
        ];
        expected.sort();
        assert_eq!(gone, expected);
    }
}
