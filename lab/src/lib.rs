//! The lab that proves baton: everything here depends on the `baton` library, never the other way
//! round (Cargo enforces it: `baton` does not depend on this crate).
//!
//! # Layout
//!
//! ```text
//! fleet/             private servers (PostgreSQL, etcd, Redis, ZooKeeper) and local fleets (`baton fleet`)
//! load/              open-loop load on POST /next: the client history + HDR latency (`baton load`)
//! check/             the history checker: one invariant per file over the ledger + histories (`baton check`)
//! bench/             `baton bench failover|next`: kill -9 / step-down trials, the sequencer benchmark
//! exp/               `baton exp NAME`: experiments/NAME.toml → fleet, load, faults, checker, results + SVG plots
//! cli.rs            the `baton` command line (clap): every command and flag, parsed by main.rs and the docs test
//! cli_doc.rs         `baton cli-reference`: docs/cli.md, generated from cli.rs
//! config_doc.rs      `baton config reference|init`: the node config's reference and a host's config, from the code
//! fence_admin.rs     `baton fence status|reset`: inspect the fence, recover from a poisoned max_token
//! admin_url.rs       every --admin-url: the password as PostgreSQL's tools take it, a missing database said or created
//! budget_admin.rs    `baton budget status|reset`: the fleet-wide failure budget, and its reset
//! chaos/             `baton chaos`: kill / partition (netns + iptables) / pause the leader, clock skew
//! plots.rs           SVG plots for `baton exp` and `baton bench`: leaders acting, seq vs time, CDFs, lines
//! report.rs          what every report records: order statistics (Summary), the machine, the commit
//! logging.rs         the binary's log lines: plain text off a terminal, openraft's repeats limited
//! main.rs            the `baton` binary (clap)
//! ```

pub mod admin_url;
pub mod bench;
pub mod budget_admin;
pub mod chaos;
pub mod check;
pub mod cli;
pub mod cli_doc;
pub mod config_doc;
pub mod db_admin;
pub mod exp;
pub mod fence_admin;
pub mod fleet;
pub mod load;
pub mod logging;
pub mod plots;
pub mod report;

use std::path::{Path, PathBuf};

/// The repository root, where `config/` and `experiments/` live. Commands run from the root find
/// them relative to the working directory; tests (whose working directory is `lab/`) and a binary
/// started elsewhere fall back to the checkout this crate was built from.
pub fn repo_path(rel: impl AsRef<Path>) -> PathBuf {
    let rel = rel.as_ref();
    if rel.is_absolute() || rel.exists() {
        return rel.to_path_buf();
    }
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    if built_from.exists() {
        built_from
    } else {
        rel.to_path_buf()
    }
}

/// Wall-clock milliseconds since the Unix epoch (0 if the clock reads before it): a label for
/// reports, never a measurement.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
