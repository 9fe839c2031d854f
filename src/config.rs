//! Node configuration: a TOML file (`config/*.toml`) overlaid by command-line flags.
//!
//! Timing is validated when the config is built, in the spirit of client-go's leaderelection:
//! `lease_ttl > renew_interval > retry_interval`, and the renewal must fit inside the lease with
//! room for the watchdog's safety margin. A config that fails this never starts a node.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::elector::BackendKind;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot parse config {path}: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("invalid duration {0:?}: use e.g. 3s, 250ms or a plain number of milliseconds")]
    Duration(String),
    #[error("invalid timing: {0}")]
    Timing(String),
    #[error("invalid config: {0}")]
    Invalid(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fencing {
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

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    pub node_id: String,
    pub backend: BackendKind,
    /// Where this node's HTTP server listens.
    pub http_listen: SocketAddr,
    /// The address other nodes and clients should use (defaults to the bound address).
    pub advertise_addr: Option<String>,
    pub lease_ttl_ms: u64,
    pub renew_interval_ms: u64,
    pub retry_interval_ms: u64,
    /// The largest clock-rate error the lease arithmetic tolerates (0.01 = 1%).
    pub clock_rate_error: f64,
    /// A fixed margin subtracted from every lease deadline on top of the rate error.
    pub deadline_margin_ms: u64,
    /// Offset of this node's wall clock (experiments only; wall time never decides a lease).
    pub clock_skew_ms: i64,
    /// Injected rate error of this node's clock (experiments only).
    pub clock_drift: f64,
    /// Raft election timeout range in ms, "min-max".
    pub election_timeout_ms: String,
    pub fencing: Fencing,
    /// How long demotion waits for each leader-work actor to stop before killing it.
    pub work_stop_timeout_ms: u64,
    /// Extra time taken off every lease deadline so that leader work which needs time to stop
    /// (an external program: `baton run --child-stop-margin`) has stopped before the lease could
    /// expire: the watchdog demotes this much earlier. 0 by default.
    pub work_stop_margin_ms: u64,
    /// Bearer token required by `POST /stepdown` when set.
    pub admin_token: Option<String>,
    pub state_dir: PathBuf,
    pub etcd: EtcdConfig,
    pub raft: RaftConfig,
    pub redis: RedisConfig,
    pub zk: ZkConfig,
    pub pg_lease: PgLeaseConfig,
    pub resource: ResourceConfig,
    pub scheduler: SchedulerConfig,
    pub sequencer: SequencerConfig,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    /// The election name; `etcdctl elect NAME` on the same name interoperates.
    pub election_name: String,
    pub request_timeout_ms: u64,
}

/// One member of a raft fleet.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PeerSpec {
    pub id: String,
    /// `host:port` of the member's client HTTP server (where followers redirect clients).
    pub addr: String,
    /// `host:port` of the member's raft peer listener (`POST /peer/...`, authenticated).
    pub peer_addr: String,
}

/// A secret that never shows in `Debug` output (logs); it serializes as the plain string, so a
/// generated config file carries it. Keep such files private (`baton fleet` writes them 0600).
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }
    /// The secret itself: for keying a MAC, never for printing.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftConfig {
    /// Every member, this node included.
    pub peers: Vec<PeerSpec>,
    pub heartbeat_interval_ms: u64,
    /// Where this node's raft peer listener binds; defaults to this node's `peer_addr` in
    /// `peers`. Never the client port: peer RPC has its own listener.
    pub peer_listen: Option<SocketAddr>,
    /// The shared cluster secret keying every peer request's HMAC. Required whenever the group
    /// has more than one member or the peer listener is not on loopback.
    pub cluster_secret: Option<Secret>,
    /// Or: a file holding it (surrounding whitespace trimmed). Not both.
    pub cluster_secret_file: Option<PathBuf>,
}

impl RaftConfig {
    /// The configured cluster secret, read from the file if that is how it was given.
    pub fn secret(&self) -> Result<Option<Secret>, ConfigError> {
        match (&self.cluster_secret, &self.cluster_secret_file) {
            (Some(_), Some(_)) => Err(ConfigError::Invalid(
                "raft: set cluster_secret or cluster_secret_file, not both".into(),
            )),
            (Some(s), None) => Ok(Some(s.clone())),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                Ok(Some(Secret::new(text.trim())))
            }
            (None, None) => Ok(None),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    pub url: String,
    /// The lock key; the fenced variant keeps its token counter at `<key>:token`.
    pub key: String,
    pub request_timeout_ms: u64,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: "redis://127.0.0.1:6379/".into(),
            key: "baton:leader".into(),
            request_timeout_ms: 1000,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ZkConfig {
    /// `host:port,host:port,...`
    pub connect: String,
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

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PgLeaseConfig {
    /// May be the fenced resource's server, but the lease lives in its own table.
    pub database_url: String,
    pub lease_name: String,
}

impl Default for PgLeaseConfig {
    fn default() -> Self {
        PgLeaseConfig {
            database_url: "postgres://postgres@127.0.0.1:5432/baton".into(),
            lease_name: "baton".into(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourceConfig {
    /// The fenced resource, connected to as the application role (which may only call functions).
    pub database_url: String,
    pub pool_size: usize,
    pub statement_timeout_ms: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    pub enabled: bool,
    pub tick_interval_ms: u64,
    /// Jobs taken from the work-set per tick.
    pub jobs_per_tick: i64,
    /// Publish the cursor through the fence every this many ticks (and always on demotion).
    pub checkpoint_every_ticks: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SequencerConfig {
    pub enabled: bool,
    /// Upper bound on IDs committed in one group commit.
    pub max_batch_ids: usize,
    /// Largest `?n=` a client may ask for.
    pub max_block: u32,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            node_id: "n1".into(),
            backend: BackendKind::Etcd,
            http_listen: "127.0.0.1:0".parse().unwrap(),
            advertise_addr: None,
            lease_ttl_ms: 3000,
            renew_interval_ms: 1000,
            retry_interval_ms: 250,
            clock_rate_error: 0.01,
            deadline_margin_ms: 100,
            clock_skew_ms: 0,
            clock_drift: 0.0,
            election_timeout_ms: "150-300".into(),
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
        }
    }
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            election_name: "baton".into(),
            request_timeout_ms: 1000,
        }
    }
}

impl Default for ResourceConfig {
    fn default() -> Self {
        ResourceConfig {
            database_url: "postgres://baton_app@127.0.0.1:5432/baton".into(),
            pool_size: 4,
            statement_timeout_ms: 2000,
        }
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            enabled: true,
            tick_interval_ms: 1000,
            jobs_per_tick: 1000,
            checkpoint_every_ticks: 10,
        }
    }
}

impl Default for SequencerConfig {
    fn default() -> Self {
        SequencerConfig {
            enabled: true,
            max_batch_ids: 4096,
            max_block: 1000,
        }
    }
}

impl NodeConfig {
    /// This config minus what differs per node or per run (ids, addresses, paths, URLs,
    /// secrets): what a benchmark or experiment report records as "the config".
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
            for (section, key) in [
                ("resource", "database_url"),
                ("pg_lease", "database_url"),
                ("etcd", "endpoints"),
                ("redis", "url"),
                ("raft", "peers"),
                ("raft", "peer_listen"),
                ("raft", "cluster_secret"),
                ("raft", "cluster_secret_file"),
                ("zk", "connect"),
            ] {
                if let Some(s) = o.get_mut(section).and_then(|s| s.as_object_mut()) {
                    s.remove(key);
                }
            }
        }
        v
    }

    pub fn from_file(path: &Path) -> Result<NodeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })
    }

    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }
    pub fn renew_interval(&self) -> Duration {
        Duration::from_millis(self.renew_interval_ms)
    }
    pub fn retry_interval(&self) -> Duration {
        Duration::from_millis(self.retry_interval_ms)
    }
    pub fn work_stop_timeout(&self) -> Duration {
        Duration::from_millis(self.work_stop_timeout_ms)
    }

    /// How much of a granted TTL the node gives up so it stops before the backend expires it:
    /// the clock-rate error over the whole TTL plus a fixed margin, plus the time leader work is
    /// given to stop ([`NodeConfig::work_stop_margin_ms`]).
    pub fn lease_safety_margin(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.clock_rate_error)
            + Duration::from_millis(self.deadline_margin_ms)
            + self.work_stop_margin()
    }

    /// [`NodeConfig::work_stop_margin_ms`] as a duration.
    pub fn work_stop_margin(&self) -> Duration {
        Duration::from_millis(self.work_stop_margin_ms)
    }

    /// `(min, max)` of the Raft election timeout.
    pub fn election_timeout_range_ms(&self) -> Result<(u64, u64), ConfigError> {
        let bad = || {
            ConfigError::Invalid(format!(
                "election_timeout_ms {:?}: use MIN-MAX in ms",
                self.election_timeout_ms
            ))
        };
        let (lo, hi) = match self.election_timeout_ms.split_once('-') {
            Some((lo, hi)) => (
                lo.trim().parse().map_err(|_| bad())?,
                hi.trim().parse().map_err(|_| bad())?,
            ),
            None => {
                let v: u64 = self.election_timeout_ms.trim().parse().map_err(|_| bad())?;
                (v, v * 2)
            }
        };
        if lo == 0 || lo > hi {
            return Err(bad());
        }
        Ok((lo, hi))
    }

    /// The construction-time checks. Rejects any config whose lease arithmetic cannot be safe.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let (ttl, renew, retry) = (
            self.lease_ttl_ms,
            self.renew_interval_ms,
            self.retry_interval_ms,
        );
        if retry == 0 {
            return Err(ConfigError::Timing("retry_interval_ms must be > 0".into()));
        }
        if !(ttl > renew && renew > retry) {
            return Err(ConfigError::Timing(format!(
                "need lease_ttl_ms ({ttl}) > renew_interval_ms ({renew}) > retry_interval_ms ({retry})"
            )));
        }
        if !(0.0..0.5).contains(&self.clock_rate_error) {
            return Err(ConfigError::Timing(
                "clock_rate_error must be in [0, 0.5)".into(),
            ));
        }
        let usable = self
            .lease_ttl()
            .saturating_sub(self.lease_safety_margin(self.lease_ttl()));
        if self.renew_interval() >= usable {
            return Err(ConfigError::Timing(format!(
                "renew_interval_ms ({renew}) must be below the usable lease ({} ms = TTL minus safety margin)",
                usable.as_millis()
            )));
        }
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
        self.election_timeout_range_ms()?;
        if self.sequencer.max_batch_ids == 0 || self.sequencer.max_block == 0 {
            return Err(ConfigError::Invalid("sequencer limits must be > 0".into()));
        }
        Ok(())
    }
}

/// Parses `3s`, `250ms`, `1.5s`, `2m` or a plain number of milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, ConfigError> {
    let t = text.trim();
    let err = || ConfigError::Duration(text.to_owned());
    let (num, scale) = if let Some(v) = t.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = t.strip_suffix('s') {
        (v, 1000.0)
    } else if let Some(v) = t.strip_suffix('m') {
        (v, 60_000.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| err())?;
    if !v.is_finite() || v < 0.0 {
        return Err(err());
    }
    Ok((v * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_timing_is_valid() {
        NodeConfig::default().validate().unwrap();
    }

    #[test]
    fn ttl_must_exceed_renew_which_must_exceed_retry() {
        let mut c = NodeConfig {
            renew_interval_ms: 3000,
            ..NodeConfig::default()
        };
        assert!(matches!(c.validate(), Err(ConfigError::Timing(_))));
        c.renew_interval_ms = 200;
        assert!(matches!(c.validate(), Err(ConfigError::Timing(_))));
        c.renew_interval_ms = 1000;
        c.retry_interval_ms = 0;
        assert!(matches!(c.validate(), Err(ConfigError::Timing(_))));
    }

    #[test]
    fn renew_must_fit_inside_the_usable_lease() {
        // 3 s TTL, 1% + 100 ms margin -> 2.87 s usable; renewing every 2.9 s cannot keep it.
        let c = NodeConfig {
            renew_interval_ms: 2900,
            ..NodeConfig::default()
        };
        assert!(matches!(c.validate(), Err(ConfigError::Timing(_))));
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration_ms("3s").unwrap(), 3000);
        assert_eq!(parse_duration_ms("250ms").unwrap(), 250);
        assert_eq!(parse_duration_ms("1.5s").unwrap(), 1500);
        assert_eq!(parse_duration_ms("40").unwrap(), 40);
        assert!(parse_duration_ms("-1s").is_err());
        assert!(parse_duration_ms("soon").is_err());
    }

    #[test]
    fn election_timeout_range_parses() {
        let c = NodeConfig {
            election_timeout_ms: "150-300".into(),
            ..NodeConfig::default()
        };
        assert_eq!(c.election_timeout_range_ms().unwrap(), (150, 300));
        let c = NodeConfig {
            election_timeout_ms: "300-150".into(),
            ..NodeConfig::default()
        };
        assert!(c.validate().is_err());
    }
}

#[cfg(test)]
mod secret_tests {
    use super::*;

    #[test]
    fn the_cluster_secret_never_shows_in_debug_or_redacted_json() {
        let mut c = NodeConfig::default();
        c.raft.cluster_secret = Some(Secret::new("hunter2-hunter2-hunter2"));
        c.raft.cluster_secret_file = Some(PathBuf::from("/etc/baton/secret"));
        assert!(!format!("{c:?}").contains("hunter2"));
        let redacted = c.redacted_json().to_string();
        assert!(!redacted.contains("hunter2"), "{redacted}");
        assert!(!redacted.contains("/etc/baton/secret"), "{redacted}");
        // The generated TOML does carry it: that is how every node of a fleet gets it.
        assert!(toml::to_string(&c).unwrap().contains("hunter2"));
    }

    #[test]
    fn secret_inline_or_from_a_file_not_both() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "  from-the-file-0123456789\n").unwrap();
        let mut r = RaftConfig {
            cluster_secret_file: Some(path),
            ..RaftConfig::default()
        };
        assert_eq!(
            r.secret().unwrap().unwrap().expose(),
            "from-the-file-0123456789"
        );
        r.cluster_secret = Some(Secret::new("inline"));
        assert!(r.secret().is_err());
        r.cluster_secret_file = None;
        assert_eq!(r.secret().unwrap().unwrap().expose(), "inline");
    }
}
