//! `[shards]`: how many independent terms a fleet runs and over which members, and each shard's
//! names ([`ShardNames`]), which a node gives its backend beside its one shared config.

use serde::{Deserialize, Serialize};

use super::{ConfigError, NodeConfig, Section};
use crate::shard::ShardId;

/// The most shards a fleet may run (each is a full term with its own backend session).
pub const MAX_SHARDS: u32 = 4096;

/// One member of a sharded fleet, for placement: its id and its client HTTP address (probed
/// with `GET /healthz` to tell live members from dead ones).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MemberSpec {
    /// The member's node id.
    pub id: String,
    /// `host:port` of the member's client HTTP server.
    pub addr: String,
}

/// `[shards]`: K shards, each a full term (own election, token, watchdog and fence row),
/// spread over the live members by balanced rendezvous hashing (see [`crate::shard`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShardsConfig {
    /// K, the number of shards (1: one leader for the fleet, today's behaviour).
    pub count: u32,
    /// Every member that may own shards, this node included (K > 1 only). Empty: the raft
    /// peers' ids and client addresses.
    pub members: Vec<MemberSpec>,
    /// How often each member's `GET /healthz` is probed.
    pub probe_interval_ms: u64,
    /// A member that has not answered a probe for this long is not live: its shards are
    /// placed elsewhere (the backend still waits out its lease before a new owner wins).
    /// Counting a member dead long before its leases could expire gains little (nobody can win
    /// its shards sooner) and costs hand-overs when a loaded member answers late: the default
    /// is two thirds of the lease backends' 3 s TTL (1 s moved shards back and forth on a
    /// saturated 2-core machine, where `/healthz` is served at nice 5 behind the timers).
    pub down_after_ms: u64,
    /// A shard with no known leader is campaigned for, whatever the placement says, by the live
    /// members in their rendezvous order for it: the member ranked r after `r x` this long (at
    /// least once this long), so a disagreement between views does not leave a shard dark, and
    /// a slow start does not draw every member into every election at once.
    pub orphan_grace_ms: u64,
}

impl Default for ShardsConfig {
    fn default() -> Self {
        ShardsConfig {
            count: 1,
            members: Vec::new(),
            probe_interval_ms: 200,
            down_after_ms: 2000,
            orphan_grace_ms: 1500,
        }
    }
}

impl Section for ShardsConfig {
    fn name(&self) -> &'static str {
        "shards"
    }

    /// K in range, and with K > 1 a probe interval that can tell a member down.
    fn validate(&self) -> Result<(), ConfigError> {
        let k = self.count;
        if !(1..=MAX_SHARDS).contains(&k) {
            return Err(ConfigError::Invalid(format!(
                "[shards] count must be in 1..={MAX_SHARDS}, got {k}"
            )));
        }
        if k > 1 && (self.probe_interval_ms == 0 || self.down_after_ms < 2 * self.probe_interval_ms)
        {
            return Err(ConfigError::Invalid(format!(
                "[shards] down_after_ms ({}) must be at least 2 x probe_interval_ms ({}), and the interval > 0",
                self.down_after_ms, self.probe_interval_ms
            )));
        }
        Ok(())
    }
}

/// What one shard of a node is called where it differs from the others: its id, and the suffix
/// its election's name carries in the backend's section (`""` for shard 0, whose election is the
/// configured one, so a one-shard node elects exactly as before shards; `-shard-N` for the
/// others, see [`ShardId::election_suffix`]). A node passes one per shard to its backend beside
/// its one shared [`NodeConfig`] ([`NodeConfig::shard_names`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardNames {
    /// The shard.
    pub shard: ShardId,
    /// What the shard's election name carries after the section's configured one (`[etcd]
    /// election_name`, `[redis] key`, `[zk] election_path`, `[pg_lease] lease_name`).
    pub election_suffix: String,
}

impl ShardNames {
    /// Shard `shard`'s names in a node.
    pub fn of(shard: ShardId) -> ShardNames {
        ShardNames {
            shard,
            election_suffix: shard.election_suffix(),
        }
    }

    /// A shard whose election name carries `suffix` instead (tests that put one node's shards
    /// into elections of their own choosing).
    pub fn with_suffix(shard: ShardId, suffix: impl Into<String>) -> ShardNames {
        ShardNames {
            shard,
            election_suffix: suffix.into(),
        }
    }

    /// This shard's election name, for a section whose configured name is `base`.
    pub fn election(&self, base: &str) -> String {
        format!("{base}{}", self.election_suffix)
    }
}

impl NodeConfig {
    /// The shard count K (`[shards] count`, at least 1).
    pub fn shard_count(&self) -> u32 {
        self.shards.count.max(1)
    }

    /// The members placement spreads shards over: `[shards] members`, or the raft peers.
    pub fn shard_members(&self) -> Vec<MemberSpec> {
        if !self.shards.members.is_empty() {
            return self.shards.members.clone();
        }
        self.raft
            .peers
            .iter()
            .map(|p| MemberSpec {
                id: p.id.clone(),
                addr: p.addr.clone(),
            })
            .collect()
    }

    /// Every shard's names, shard 0 first ([`NodeConfig::shard_count`] of them).
    pub fn shard_names(&self) -> Vec<ShardNames> {
        (0..self.shard_count())
            .map(|s| ShardNames::of(ShardId(s)))
            .collect()
    }

    /// With K > 1: this node among the members, and HTTPS members verified against a CA.
    pub(super) fn validate_shard_members(&self) -> Result<(), ConfigError> {
        let k = self.shards.count;
        if k <= 1 {
            return Ok(());
        }
        if self.http.tls_cert_file.is_some() && self.http.member_ca_file.is_none() {
            return Err(ConfigError::Invalid(
                "[shards] count > 1 with HTTPS needs [http] member_ca_file: the CA bundle the members' certificates chain to, which placement verifies them against when it probes them".into(),
            ));
        }
        let members = self.shard_members();
        if !members.iter().any(|m| m.id == self.node_id) {
            return Err(ConfigError::Invalid(format!(
                "[shards] count = {k} needs [shards] members listing every member, this node ({}) included",
                self.node_id
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::*;
    use crate::shard::ShardId;

    #[test]
    fn shard_zero_keeps_the_configured_names_and_the_others_carry_a_suffix() {
        let mut c = NodeConfig::default();
        c.shards.count = 3;
        let names = c.shard_names();
        assert_eq!(names.len(), 3);
        assert_eq!(names[0], ShardNames::of(ShardId(0)));
        assert_eq!(names[0].election(&c.etcd.election_name), "baton");
        assert_eq!(names[2].election(&c.redis.key), "baton:leader-shard-2");
        assert_eq!(
            names[1].election(&c.zk.election_path),
            "/baton/election-shard-1"
        );
        assert_eq!(
            ShardNames::with_suffix(ShardId(1), "-x").election("e"),
            "e-x"
        );
    }
}
