//! Chaos against a running local fleet (SPEC §5): kill, partition and pause the leader, and skew
//! one node's clock. Library API for the experiment runner, plus `baton chaos ...`.
//!
//! | fault | how | verified applied | undone |
//! |---|---|---|---|
//! | [`kill_leader`] | `kill -9` of the leader's pid | the pid is gone | (not undone: restart with `fleet start`) |
//! | [`partition_leader`] | DROP to/from the election address (raft: the peers' addresses) in the leader's namespace | TCP connects from its namespace to the backend time out, to PostgreSQL connect; clients still reach it | rules removed; the backend connects again |
//! | [`pause_leader`] | SIGSTOP / SIGCONT of the leader's pid | `/proc/<pid>/stat` state `T` | SIGCONT; state no longer `T` |
//! | [`skew_node`] | `clock_skew_ms` / `clock_drift` in its `config.toml`, restart | its `/status` answers | (set it back with another `skew`) |
//! | [`sentinel_failover`] | `kill -9` of the Redis primary (`fleet up --redis-topology sentinel`) | the Sentinels name the replica as primary | the old primary runs again, as the new one's replica |
//! | [`pg_promote`] | `kill -9` of the resource's PostgreSQL primary, `pg_ctl promote` of its standby (`fleet up --resource-standby`) | the primary's processes are gone; promote returned | (not undone: the promoted standby is the fleet's `postgres` from then on) |
//!
//! Partition and pause are undone by guards, also on error, panic or a dropped future (Ctrl-C in
//! the CLI); `baton chaos heal --dir D` removes every baton rule from the fleet's namespaces and
//! continues stopped nodes, whatever happened before. Partitions need a fleet started with
//! `baton fleet up N --netns` (see [`netns`]): the fault rules live *inside* the node's
//! namespace, never in the root namespace.
//!
//! **pg-lease:** the lease row lives in the same PostgreSQL server (same port) as the fenced
//! resource. iptables cannot separate two connections to one server port, so in a `--netns`
//! fleet PostgreSQL listens on two bridge addresses: the node's resource URL uses the gateway
//! (`.1`), its lease URL the election address (`.2`). The partition drops `.2` only: the lease
//! connection is cut, the resource connection is not.

pub mod faults;
/// The namespaces themselves are the fleet's (`fleet up --netns`); chaos cuts their links.
pub use crate::fleet::netns;
pub mod relay;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

pub use faults::{
    heal_all, kill_leader, kill_leader_report, partition_leader, partition_leader_from,
    partition_node, pause_leader, pause_node, pg_promote, pg_promote_lagging, sentinel_failover,
    skew_node, skew_node_report, store_marks, CutTarget, FaultReport, PromoteOutcome, StoreMarks,
};
pub use netns::NetnsFleet;

use crate::fleet::FleetState;
use baton::config::parse_duration_ms;

#[derive(Args, Debug)]
pub struct ChaosArgs {
    #[command(subcommand)]
    pub cmd: ChaosCmd,
}

#[derive(Subcommand, Debug)]
pub enum ChaosCmd {
    /// kill -9 the current leader.
    KillLeader {
        /// The fleet's directory (its state file, configs, logs and servers).
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
    /// Cut the leader from its election backend (raft: from its peers) for S seconds, while it
    /// keeps serving clients and reaching PostgreSQL (`--from resource`: from PostgreSQL only;
    /// `both`: from both). Needs `fleet up --netns`.
    PartitionLeader {
        /// How long to hold the partition, seconds (fractions allowed).
        #[arg(long)]
        secs: f64,
        /// What the leader is cut from.
        #[arg(long, value_enum, default_value = "backend")]
        from: CutTarget,
        /// The fleet's directory (its state file, configs, logs and servers).
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
    /// Stop-the-world pause of the leader (SIGSTOP, then SIGCONT after N ms).
    GcPauseLeader {
        /// Pause length in milliseconds.
        #[arg(long)]
        ms: u64,
        /// The fleet's directory (its state file, configs, logs and servers).
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
    /// Set one node's clock skew (and drift) and restart it.
    Skew {
        /// The node whose clock to skew (its id).
        #[arg(long)]
        node: String,
        /// Wall-clock offset, e.g. 200ms, -1.5s.
        #[arg(long, allow_hyphen_values = true)]
        skew: String,
        /// Clock rate error, e.g. 0.01 (1 % fast), -0.01 (slow).
        #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
        drift: f64,
        /// The fleet's directory (its state file, configs, logs and servers).
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
    /// kill -9 the fenced resource's PostgreSQL primary and promote its standby (a fleet
    /// started with `--resource-standby`); the promoted standby is the fleet's from then on.
    PgPromote {
        /// The fleet's directory (its state file, configs, logs and servers).
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
    /// kill -9 the Redis primary of a fleet started with `--redis-topology sentinel`; report
    /// when the Sentinels named the replica as primary. The old primary then runs again as the
    /// new one's replica.
    SentinelFailover {
        /// The fleet's directory (its state file, configs, logs and servers).
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
    /// Undo every fault: remove all baton iptables rules, SIGCONT stopped nodes.
    Heal {
        /// The fleet's directory (its state file, configs, logs and servers).
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
    /// (internal) The TCP relay a `--netns` fleet runs for Redis / ZooKeeper.
    #[command(hide = true)]
    Relay {
        /// LISTEN=TARGET, e.g. 10.213.0.2:6379=127.0.0.1:6379.
        #[arg(long = "pair", required = true)]
        pairs: Vec<String>,
    },
}

fn parse_signed_ms(text: &str) -> anyhow::Result<i64> {
    let t = text.trim();
    let (neg, rest) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let ms = parse_duration_ms(rest)? as i64;
    Ok(if neg { -ms } else { ms })
}

fn print_report(r: &FaultReport) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(r)?);
    Ok(())
}

/// Runs a fault future; on Ctrl-C drops it (its guard heals) and heals the fleet again.
async fn interruptible<T>(
    state: &FleetState,
    fut: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::select! {
        r = fut => r,
        _ = tokio::signal::ctrl_c() => {
            let st = state.clone();
            let did = tokio::task::spawn_blocking(move || heal_all(&st)).await?;
            anyhow::bail!("interrupted; healed ({})", if did.is_empty() { "the fault guard had already undone it".to_string() } else { did.join("; ") })
        }
    }
}

pub async fn cli_main(args: ChaosArgs) -> anyhow::Result<()> {
    match args.cmd {
        ChaosCmd::Relay { pairs } => {
            let pairs = pairs
                .iter()
                .map(|p| relay::parse_pair(p))
                .collect::<anyhow::Result<Vec<_>>>()?;
            relay::run(pairs).await
        }
        ChaosCmd::KillLeader { dir } => {
            let state = FleetState::load(&dir)?;
            let r = kill_leader_report(&state).await?;
            println!("kill-leader: {} — {}", r.node, r.detail);
            print_report(&r)
        }
        ChaosCmd::PartitionLeader { secs, from, dir } => {
            if !(secs.is_finite() && secs > 0.0) {
                anyhow::bail!("--secs must be > 0");
            }
            let state = FleetState::load(&dir)?;
            let r = interruptible(
                &state,
                partition_leader_from(&state, from, Duration::from_secs_f64(secs)),
            )
            .await?;
            println!("partition-leader: {} — {}", r.node, r.detail);
            print_report(&r)
        }
        ChaosCmd::GcPauseLeader { ms, dir } => {
            let state = FleetState::load(&dir)?;
            let r = interruptible(&state, pause_leader(&state, Duration::from_millis(ms))).await?;
            println!("gc-pause-leader: {} — {}", r.node, r.detail);
            print_report(&r)
        }
        ChaosCmd::Skew {
            node,
            skew,
            drift,
            dir,
        } => {
            let skew_ms = parse_signed_ms(&skew)?;
            let mut state = FleetState::load(&dir)?;
            let r = skew_node_report(&mut state, &node, skew_ms, drift).await?;
            println!("skew: {} — {}", r.node, r.detail);
            print_report(&r)
        }
        ChaosCmd::PgPromote { dir } => {
            let mut state = FleetState::load(&dir)?;
            let r = pg_promote(&mut state).await?;
            println!("pg-promote: {}", r.detail);
            print_report(&r)
        }
        ChaosCmd::SentinelFailover { dir } => {
            let mut state = FleetState::load(&dir)?;
            let r = sentinel_failover(&mut state).await?;
            println!("sentinel-failover: {}", r.detail);
            print_report(&r)
        }
        ChaosCmd::Heal { dir } => {
            let state = FleetState::load(&dir)?;
            let did = tokio::task::spawn_blocking(move || heal_all(&state)).await?;
            if did.is_empty() {
                println!("heal: nothing to undo (no baton rules, no stopped node)");
            }
            for d in did {
                println!("heal: {d}");
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_durations_parse() {
        assert_eq!(parse_signed_ms("200ms").unwrap(), 200);
        assert_eq!(parse_signed_ms("-1.5s").unwrap(), -1500);
        assert_eq!(parse_signed_ms("+2s").unwrap(), 2000);
        assert!(parse_signed_ms("soon").is_err());
    }

    #[test]
    fn relay_pairs_parse() {
        let (l, t) = relay::parse_pair("10.213.0.2:6379=127.0.0.1:6379").unwrap();
        assert_eq!(l.port(), 6379);
        assert!(t.ip().is_loopback());
        assert!(relay::parse_pair("10.213.0.2:6379").is_err());
    }

    #[test]
    fn proc_state_of_ourselves_is_running_or_sleeping() {
        let s = faults::proc_state(std::process::id()).unwrap();
        assert!(matches!(s, 'R' | 'S' | 'D'), "{s}");
    }
}
