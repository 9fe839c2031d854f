//! The `baton` command line (clap): every subcommand, flag and default, in the library so that
//! tests parse the docs' command lines with the real parser (`Cli::try_parse_from`) and
//! `baton cli-reference` writes docs/cli.md from the same definitions. `main.rs` runs them.

use std::path::PathBuf;

use baton::backends::BackendKind;
use baton::config::{parse_duration_ms, Fencing};
use clap::{Args, Parser, Subcommand};

use crate::fleet;

#[derive(Parser)]
#[command(
    name = "baton",
    version,
    about = "Leader election that stays correct when leadership is wrong"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run one fleet member: campaign, lead while (and only while) elected, serve HTTP.
    Node(NodeArgs),
    /// A fleet member whose leader work is CMD: `baton run [node flags] -- CMD ARGS...`. CMD runs
    /// only while this node leads (env BATON_TOKEN, BATON_HOLDER, BATON_NODE_ID,
    /// BATON_DATABASE_URL), in its own process group, stopped (SIGTERM, SIGKILL, every process
    /// gone) before the lease is released.
    Run(RunArgs),
    /// Start, inspect and stop a local fleet (private servers + N nodes on loopback).
    Fleet {
        #[command(subcommand)]
        cmd: FleetCmd,
    },
    /// Benchmarks against a local fleet (e.g. `baton bench failover --backend raft --trials 20`).
    Bench {
        #[command(subcommand)]
        cmd: crate::bench::BenchCmd,
    },
    /// Open-loop load on POST /next of whichever node leads; writes a history for `baton check`.
    Load(crate::load::LoadArgs),
    /// Check the fence ledger and client histories against the invariants; non-zero exit on a violation.
    Check(crate::check::CheckArgs),
    /// Faults against a running fleet: kill-leader, partition-leader, gc-pause-leader, skew,
    /// pg-promote, sentinel-failover, heal.
    Chaos(crate::chaos::ChaosArgs),
    /// Run an experiment (`experiments/NAME.toml`) and write `experiments/results/NAME/`.
    Exp(crate::exp::ExpArgs),
    /// Apply the fenced resource's roles and schema (as a superuser); optionally flip its fencing switch.
    Migrate {
        /// The database superuser's URL (postgres://postgres@HOST:5432/DB). Without a password
        /// in it, PGPASSWORD, ~/.pgpass (or PGPASSFILE) or a prompt on a terminal gives it.
        #[arg(long)]
        admin_url: String,
        /// Turn the fence on or off (off exists only to show the bug it prevents).
        #[arg(long)]
        fencing: Option<Fencing>,
    },
    /// Node configs: `init` writes a commented one for a real host from a few flags;
    /// `reference` prints every key, its default and unit (deploy/config-reference.md).
    Config {
        #[command(subcommand)]
        cmd: ConfigCmd,
    },
    /// Inspect the fenced resource (`status`), or recover from a poisoned max_token (`reset`).
    Fence {
        #[command(subcommand)]
        cmd: crate::fence_admin::FenceCmd,
    },
    /// The fleet-wide failure budget (`[failure_budget]`): inspect it (`status`), or let a
    /// fleet that spent it campaign again (`reset`).
    Budget {
        #[command(subcommand)]
        cmd: crate::budget_admin::BudgetCmd,
    },
    /// Set up a database for a service that embeds baton: schema and roles (`init`), access to
    /// the service's own tables (`grant`).
    Db {
        #[command(subcommand)]
        cmd: crate::db_admin::DbCmd,
    },
    /// Print this command line's reference (Markdown: every command, subcommand and flag),
    /// generated from these definitions; docs/cli.md is its output, compared by a test.
    CliReference,
}

#[derive(Subcommand)]
pub enum ConfigCmd {
    /// Write a commented node config for a real host (stdout, or --out FILE at 0600).
    Init(Box<crate::config_doc::InitArgs>),
    /// Print the config reference (Markdown), generated from the code.
    Reference,
}

#[derive(Args)]
pub struct NodeArgs {
    /// A TOML config (see config/); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// This node's id (a letter or digit, then letters, digits, `-` or `_`); unique in the fleet.
    #[arg(long)]
    pub node_id: Option<String>,
    /// The election backend: raft, etcd, redis, redis-naive, zk or pg-lease.
    #[arg(long)]
    pub backend: Option<BackendKind>,
    /// HTTP listen address, e.g. 127.0.0.1:7001.
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// Lease TTL, e.g. 3s.
    #[arg(long, value_parser = parse_duration_ms)]
    pub lease_ttl: Option<u64>,
    /// How often the leader renews its lease, e.g. 1s.
    #[arg(long, value_parser = parse_duration_ms)]
    pub renew_interval: Option<u64>,
    /// How often a candidate retries a failed campaign, e.g. 500ms.
    #[arg(long, value_parser = parse_duration_ms)]
    pub retry_interval: Option<u64>,
    /// Offset of this node's wall clock, e.g. 200ms or -200 (labels only; never decides a lease).
    #[arg(long, allow_hyphen_values = true)]
    pub clock_skew: Option<String>,
    /// Rate error of this node's clock, e.g. 0.01 for 1% fast.
    #[arg(long, allow_hyphen_values = true)]
    pub clock_drift: Option<f64>,
    /// Raft election timeout range in ms, MIN-MAX.
    #[arg(long)]
    pub election_timeout: Option<String>,
    /// Raft heartbeat interval, e.g. 50ms (must be well under the election timeout's minimum).
    #[arg(long, value_parser = parse_duration_ms)]
    pub heartbeat_interval: Option<u64>,
    /// on (the default), or off: the fence accepts every write (only to show the bug it prevents).
    #[arg(long)]
    pub fencing: Option<Fencing>,
    /// How `GET /read` answers without `?mode=`: lease, quorum or resource.
    #[arg(long)]
    pub read_mode: Option<baton::config::ReadMode>,
    /// Margin taken off the lease read window, e.g. 50ms.
    #[arg(long, value_parser = parse_duration_ms)]
    pub read_lease_margin: Option<u64>,
    /// Comma-separated etcd endpoints.
    #[arg(long, value_delimiter = ',')]
    pub etcd_endpoints: Option<Vec<String>>,
    /// The fenced resource's PostgreSQL URL (this node's role; `[resource] database_url`).
    #[arg(long)]
    pub database_url: Option<String>,
    /// Where this node keeps its state (raft log and vote, actor trace).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// The token POST /stepdown requires (needed when --listen is not loopback).
    #[arg(long, env = "BATON_ADMIN_TOKEN")]
    pub admin_token: Option<String>,
    /// K shards, each its own term (election, token, fence row). Placement spreads them over
    /// `[shards] members` from the config, or over the raft peers when it names none.
    #[arg(long)]
    pub shards: Option<u32>,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    /// Time between SIGTERM and SIGKILL to CMD's process group on demotion.
    #[arg(long, value_parser = parse_duration_ms, default_value = "1s")]
    pub stop_timeout: u64,
    /// How much earlier than its lease deadline the node demotes, so CMD is gone before the
    /// lease can expire (keep it above --stop-timeout). Default: the stop timeout + 250 ms.
    /// The lease (on raft, the election timeout) is raised to fit it, unless --lease-ttl or
    /// --election-timeout is given: then a margin that does not fit is refused.
    #[arg(long, value_parser = parse_duration_ms)]
    pub child_stop_margin: Option<u64>,
    /// What to do when CMD exits on its own: restart it in the same term, or demote so another
    /// node tries.
    #[arg(long, value_enum, default_value = "restart")]
    pub on_exit: OnExit,
    /// With --on-exit restart: restarts allowed within --restart-within before the node demotes
    /// (the term then counts as failed toward the fleet's failure budget).
    // Issue 43: 2 restarts 0.5 s then 1 s apart, so a program that always fails ends its term
    // in about 1.5 s and spends the default budget (5 failed terms) in well under 30 s; 5
    // restarts from 1 s (1+2+4+8+16 s) took ~34 s a term and 3.5 minutes to stop the fleet.
    #[arg(long, default_value_t = 2)]
    pub restart_max: u32,
    /// With --on-exit restart: the window --restart-max counts restarts in.
    #[arg(long, value_parser = parse_duration_ms, default_value = "60s")]
    pub restart_within: u64,
    /// With --on-exit restart: the wait before the first restart; each later one within
    /// --restart-within waits twice as long (at most 30 s).
    #[arg(long, value_parser = parse_duration_ms, default_value = "500ms")]
    pub restart_backoff: u64,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum OnExit {
    Restart,
    Demote,
}

#[derive(Subcommand)]
pub enum FleetCmd {
    /// Start N nodes and the servers their backend needs.
    Up {
        /// How many nodes to start.
        nodes: usize,
        /// The election backend: raft, etcd, redis, redis-naive, zk or pg-lease (the servers it needs are started too).
        #[arg(long, default_value = "raft")]
        backend: BackendKind,
        /// The fleet's directory (its state file, configs, logs and servers).
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
        /// Base node config; defaults to config/<backend>.toml when present.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Start the fleet with the fence on or off (off exists only to show the bug).
        #[arg(long, default_value = "on")]
        fencing: Fencing,
        /// Lease TTL for every node, e.g. 3s (default: the backend config's).
        #[arg(long, value_parser = parse_duration_ms)]
        lease_ttl: Option<u64>,
        /// Stay in the foreground, print leadership changes, stop everything on Ctrl-C.
        #[arg(long)]
        foreground: bool,
        /// With --foreground: stop by itself after this long (e.g. 20s).
        #[arg(long = "for", value_parser = parse_duration_ms)]
        run_for: Option<u64>,
        /// One network namespace per node behind a bridge (needs root): for `baton chaos
        /// partition-leader`. Removed again by `fleet down`.
        #[arg(long)]
        netns: bool,
        /// K shards, each its own term, placed over the nodes (raft with K > 1 and no --config
        /// runs on config/raft-shards.toml: 3 s shard leases).
        #[arg(long, default_value_t = 1)]
        shards: u32,
        /// A streaming standby of the fenced resource's PostgreSQL; the nodes find whichever
        /// server accepts writes. `async` warns: its promotion can lose acknowledged IDs.
        #[arg(long, value_enum)]
        resource_standby: Option<fleet::StandbyMode>,
        /// The redis backends' Redis: `single`, or `sentinel` (a primary, one replica, three
        /// Sentinels; the nodes follow the primary the Sentinels name).
        #[arg(long, value_enum, default_value = "single")]
        redis_topology: fleet::RedisTopology,
    },
    /// Print each node's id, pid, HTTP address, role and token.
    Status {
        /// The fleet's directory (its state file, configs, logs and servers).
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Stop every node and server of the fleet, by pid.
    Down {
        /// The fleet's directory (its state file, configs, logs and servers).
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
    /// kill -9 one node.
    Kill {
        /// The node's id (n1, n2, ...).
        id: String,
        /// The fleet's directory (its state file, configs, logs and servers).
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
    /// (Re)start one node with its config and state dir.
    Start {
        /// The node's id (n1, n2, ...).
        id: String,
        /// The fleet's directory (its state file, configs, logs and servers).
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
    /// Restart every node, one at a time (SIGTERM: drain, demote, release; then start again).
    Restart {
        /// One node at a time, each given --settle to come back before the next (the only
        /// mode there is; the flag says so in scripts).
        #[arg(long)]
        rolling: bool,
        /// How long each restarted node is given before the next one stops.
        #[arg(long, value_parser = parse_duration_ms, default_value = "3s")]
        settle: u64,
        /// The fleet's directory (its state file, configs, logs and servers).
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
    /// `POST /stepdown` to the current leader, with the fleet's admin token.
    Stepdown {
        /// Hand leadership to this node (raft only).
        #[arg(long)]
        to: Option<String>,
        /// The fleet's directory (its state file, configs, logs and servers).
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
}
