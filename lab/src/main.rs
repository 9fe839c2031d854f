//! The `baton` binary: thin subcommands over the library.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use baton::backends::BackendKind;
use baton::config::{parse_duration_ms, Fencing, NodeConfig};
use baton_lab::fleet::{self, FleetSpec, FleetState};
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "baton",
    version,
    about = "Leader election that stays correct when leadership is wrong"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
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
        cmd: baton_lab::bench::BenchCmd,
    },
    /// Open-loop load on POST /next of whichever node leads; writes a history for `baton check`.
    Load(baton_lab::load::LoadArgs),
    /// Check the fence ledger and client histories against the invariants; non-zero exit on a violation.
    Check(baton_lab::check::CheckArgs),
    /// Faults against a running fleet: kill-leader, partition-leader, gc-pause-leader, skew, heal.
    Chaos(baton_lab::chaos::ChaosArgs),
    /// Run an experiment (`experiments/NAME.toml`) and write `experiments/results/NAME/`.
    Exp(baton_lab::exp::ExpArgs),
    /// Apply the fenced resource's roles and schema (as a superuser); optionally flip its fencing switch.
    Migrate {
        #[arg(long)]
        admin_url: String,
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
        cmd: baton_lab::fence_admin::FenceCmd,
    },
    /// The fleet-wide failure budget (`[failure_budget]`): inspect it (`status`), or let a
    /// fleet that spent it campaign again (`reset`).
    Budget {
        #[command(subcommand)]
        cmd: baton_lab::budget_admin::BudgetCmd,
    },
    /// Set up a database for a service that embeds baton: schema and roles (`init`), access to
    /// the service's own tables (`grant`).
    Db {
        #[command(subcommand)]
        cmd: baton_lab::db_admin::DbCmd,
    },
}

#[derive(Subcommand)]
enum ConfigCmd {
    /// Write a commented node config for a real host (stdout, or --out FILE at 0600).
    Init(Box<baton_lab::config_doc::InitArgs>),
    /// Print the config reference (Markdown), generated from the code.
    Reference,
}

#[derive(Args)]
struct NodeArgs {
    /// A TOML config (see config/); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    node_id: Option<String>,
    #[arg(long)]
    backend: Option<BackendKind>,
    /// HTTP listen address, e.g. 127.0.0.1:7001.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Lease TTL, e.g. 3s.
    #[arg(long, value_parser = parse_duration_ms)]
    lease_ttl: Option<u64>,
    #[arg(long, value_parser = parse_duration_ms)]
    renew_interval: Option<u64>,
    #[arg(long, value_parser = parse_duration_ms)]
    retry_interval: Option<u64>,
    /// Offset of this node's wall clock, e.g. 200ms or -200 (labels only; never decides a lease).
    #[arg(long, allow_hyphen_values = true)]
    clock_skew: Option<String>,
    /// Rate error of this node's clock, e.g. 0.01 for 1% fast.
    #[arg(long, allow_hyphen_values = true)]
    clock_drift: Option<f64>,
    /// Raft election timeout range in ms, MIN-MAX.
    #[arg(long)]
    election_timeout: Option<String>,
    /// Raft heartbeat interval, e.g. 50ms (must be well under the election timeout's minimum).
    #[arg(long, value_parser = parse_duration_ms)]
    heartbeat_interval: Option<u64>,
    #[arg(long)]
    fencing: Option<Fencing>,
    /// How `GET /read` answers without `?mode=`: lease, quorum or resource.
    #[arg(long)]
    read_mode: Option<baton::config::ReadMode>,
    /// Margin taken off the lease read window, e.g. 50ms.
    #[arg(long, value_parser = parse_duration_ms)]
    read_lease_margin: Option<u64>,
    /// Comma-separated etcd endpoints.
    #[arg(long, value_delimiter = ',')]
    etcd_endpoints: Option<Vec<String>>,
    #[arg(long)]
    database_url: Option<String>,
    #[arg(long)]
    state_dir: Option<PathBuf>,
    #[arg(long, env = "BATON_ADMIN_TOKEN")]
    admin_token: Option<String>,
    /// K shards, each its own term (election, token, fence row); K > 1 needs [shards] members
    /// in the config (as `baton fleet up --shards K` writes it).
    #[arg(long)]
    shards: Option<u32>,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// Time between SIGTERM and SIGKILL to CMD's process group on demotion.
    #[arg(long, value_parser = parse_duration_ms, default_value = "1s")]
    stop_timeout: u64,
    /// How much earlier than its lease deadline the node demotes, so CMD is gone before the
    /// lease can expire (keep it above --stop-timeout). Default: the stop timeout + 250 ms.
    #[arg(long, value_parser = parse_duration_ms)]
    child_stop_margin: Option<u64>,
    /// What to do when CMD exits on its own: restart it in the same term, or demote so another
    /// node tries.
    #[arg(long, value_enum, default_value = "restart")]
    on_exit: OnExit,
    /// With --on-exit restart: restarts allowed within --restart-within before the node demotes.
    #[arg(long, default_value_t = 5)]
    restart_max: u32,
    #[arg(long, value_parser = parse_duration_ms, default_value = "60s")]
    restart_within: u64,
    /// With --on-exit restart: the wait before the first restart; each later one within
    /// --restart-within waits twice as long (at most 30 s).
    #[arg(long, value_parser = parse_duration_ms, default_value = "1s")]
    restart_backoff: u64,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<std::ffi::OsString>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum OnExit {
    Restart,
    Demote,
}

#[derive(Subcommand)]
enum FleetCmd {
    /// Start N nodes and the servers their backend needs.
    Up {
        nodes: usize,
        #[arg(long, default_value = "raft")]
        backend: BackendKind,
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
        /// Base node config; defaults to config/<backend>.toml when present.
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long, default_value = "on")]
        fencing: Fencing,
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
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Stop every node and server of the fleet, by pid.
    Down {
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
    /// kill -9 one node.
    Kill {
        id: String,
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
    /// (Re)start one node with its config and state dir.
    Start {
        id: String,
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
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
    /// `POST /stepdown` to the current leader, with the fleet's admin token.
    Stepdown {
        /// Hand leadership to this node (raft only).
        #[arg(long)]
        to: Option<String>,
        #[arg(long, default_value = "state/fleet")]
        dir: PathBuf,
    },
}

fn node_config(a: NodeArgs) -> anyhow::Result<NodeConfig> {
    let mut c = match &a.config {
        Some(p) => NodeConfig::from_file(p)?,
        None => NodeConfig::for_backend(a.backend.unwrap_or(BackendKind::Raft)),
    };
    if let Some(v) = a.node_id {
        c.state_dir = PathBuf::from("state").join(&v);
        c.node_id = v;
    }
    if let Some(v) = a.backend {
        c.backend = v;
    }
    if let Some(v) = a.listen {
        c.http_listen = v;
    }
    if let Some(v) = a.lease_ttl {
        c.lease_ttl_ms = v;
    }
    if let Some(v) = a.renew_interval {
        c.renew_interval_ms = v;
    }
    if let Some(v) = a.retry_interval {
        c.retry_interval_ms = v;
    }
    if let Some(v) = a.clock_skew {
        let neg = v.starts_with('-');
        let ms = parse_duration_ms(v.trim_start_matches('-'))? as i64;
        c.clock_skew_ms = if neg { -ms } else { ms };
    }
    if let Some(v) = a.clock_drift {
        c.clock_drift = v;
    }
    if let Some(v) = a.election_timeout {
        c.election_timeout_ms = v;
    }
    if let Some(v) = a.heartbeat_interval {
        c.raft.heartbeat_interval_ms = v;
    }
    if let Some(v) = a.fencing {
        c.fencing = v;
    }
    if let Some(v) = a.read_mode {
        c.read_mode_default = v;
    }
    if let Some(v) = a.read_lease_margin {
        c.read_lease_margin_ms = v;
    }
    if let Some(v) = a.etcd_endpoints {
        c.etcd.endpoints = v;
    }
    if let Some(v) = a.database_url {
        c.resource.database_url = v;
    }
    if let Some(v) = a.state_dir {
        c.state_dir = v;
    }
    if let Some(v) = a.admin_token {
        c.admin_token = Some(v.into());
    }
    if let Some(v) = a.shards {
        c.shards.count = v;
    }
    c.validate()?;
    Ok(c)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// mimalloc instead of glibc malloc: at 50k requests/s malloc/free were ~7% of the machine's CPU
/// (perf during `baton bench next`), and this binary is both the node and the load generator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    baton_lab::logging::init();
    match Cli::parse().cmd {
        Cmd::Node(args) => {
            let cfg = node_config(args)?;
            let listener = tokio::net::TcpListener::bind(cfg.http_listen)
                .await
                .with_context(|| format!("binding {}", cfg.http_listen))?;
            baton::node::NodeBuilder::new(cfg)
                .with_default_work()
                .run(listener, shutdown_signal())
                .await
        }
        Cmd::Run(args) => run_child(args).await,
        Cmd::Migrate { admin_url, fencing } => {
            baton::work::fence::migrate(&admin_url, fencing.map(|f| f == Fencing::On)).await?;
            println!(
                "migrated; fencing {}",
                match fencing {
                    Some(Fencing::Off) => "off",
                    Some(Fencing::On) => "on",
                    None => "unchanged",
                }
            );
            Ok(())
        }
        Cmd::Fleet { cmd } => fleet_cmd(cmd).await,
        Cmd::Config { cmd } => config_cmd(cmd),
        Cmd::Fence { cmd } => baton_lab::fence_admin::run(cmd).await,
        Cmd::Budget { cmd } => baton_lab::budget_admin::run(cmd).await,
        Cmd::Db { cmd } => baton_lab::db_admin::run(cmd).await,
        Cmd::Load(args) => baton_lab::load::cli_main(args).await,
        Cmd::Check(args) => std::process::exit(baton_lab::check::cli_main(args).await?),
        Cmd::Bench { cmd } => baton_lab::bench::run(cmd).await,
        Cmd::Exp(args) => std::process::exit(baton_lab::exp::cli_main(args).await?),
        Cmd::Chaos(args) => baton_lab::chaos::cli_main(args).await,
    }
}

fn config_cmd(cmd: ConfigCmd) -> anyhow::Result<()> {
    use baton_lab::config_doc as doc;
    match cmd {
        ConfigCmd::Reference => print!("{}", doc::reference()),
        ConfigCmd::Init(args) => {
            let text = doc::init_toml(&doc::init_config(&args)?);
            match &args.out {
                Some(path) => {
                    doc::write_new_private(path, &text)?;
                    println!("wrote {} (0600)", path.display());
                }
                None => print!("{text}"),
            }
        }
    }
    Ok(())
}

/// `baton run`: a node whose only leader work is the program (no sequencer, no scheduler).
async fn run_child(args: RunArgs) -> anyhow::Result<()> {
    use baton::work::child::{become_subreaper, ChildSpec, ChildWork, KILL_GRACE};
    use baton::work::SupervisionPolicy;
    // Orphaned grandchildren come to us, so the stop barrier can reap them (PID 1 of a
    // container often does not).
    if let Err(e) = become_subreaper() {
        tracing::warn!(%e, "not a subreaper: orphaned grandchildren may linger as zombies");
    }
    let stop_timeout = Duration::from_millis(args.stop_timeout);
    let mut cfg = node_config(args.node)?;
    cfg.work_stop_margin_ms = args.child_stop_margin.unwrap_or(args.stop_timeout + 250);
    // The supervisor must wait out the whole barrier, never give up on it first.
    let needed_ms = (stop_timeout + KILL_GRACE).as_millis() as u64;
    cfg.work_stop_timeout_ms = cfg.work_stop_timeout_ms.max(needed_ms);
    cfg.validate().with_context(|| {
        format!(
            "baton run demotes --child-stop-margin ({} ms) before each lease deadline, so the program is gone before the lease can expire; the lease must leave room for that",
            cfg.work_stop_margin_ms
        )
    })?;
    let spec = ChildSpec {
        command: args.command,
        stop_timeout,
        database_url: Some(cfg.resource.database_url.clone()),
    };
    let policy = match args.on_exit {
        OnExit::Demote => SupervisionPolicy::Demote,
        OnExit::Restart => SupervisionPolicy::Restart {
            max: args.restart_max,
            within: Duration::from_millis(args.restart_within),
            backoff: Duration::from_millis(args.restart_backoff),
        },
    };
    let listener = tokio::net::TcpListener::bind(cfg.http_listen)
        .await
        .with_context(|| format!("binding {}", cfg.http_listen))?;
    let work = ChildWork::new(spec)?
        .with_lease_expiry_after_deadline(cfg.lease_expiry_after_watchdog_deadline());
    baton::node::NodeBuilder::new(cfg)
        .with_work_supervised(Arc::new(work), policy)
        .run(listener, shutdown_signal())
        .await
}

async fn fleet_cmd(cmd: FleetCmd) -> anyhow::Result<()> {
    match cmd {
        FleetCmd::Up {
            nodes,
            backend,
            dir,
            config,
            fencing,
            lease_ttl,
            foreground,
            run_for,
            netns,
            shards,
            resource_standby,
            redis_topology,
        } => {
            let base_config = config.or_else(|| fleet::default_base_config_for(backend, shards));
            let spec = FleetSpec {
                nodes,
                backend,
                dir,
                base_config,
                fencing,
                lease_ttl_ms: lease_ttl,
                node_args: Vec::new(),
                shards,
                resource_standby,
                redis_topology,
            };
            let state = if netns {
                baton_lab::chaos::netns::up_interruptible(&spec).await?
            } else {
                fleet::up(&spec).await?
            };
            println!(
                "fleet up in {}: {} nodes on {}, PostgreSQL on 127.0.0.1:{}",
                state.dir.display(),
                state.nodes.len(),
                backend,
                state.postgres.port
            );
            if let Some(set) = &state.redis_sentinel {
                println!(
                    "Redis primary on 127.0.0.1:{}, replica on 127.0.0.1:{}, Sentinels ({}) on {}",
                    state.redis.as_ref().map_or(0, |r| r.port),
                    set.replica.port,
                    set.master_name,
                    set.addrs().join(", ")
                );
            }
            if let Some(n) = &state.netns {
                println!(
                    "network namespaces {}-n1..n{} on bridge {} ({}): PostgreSQL via {}, election backend via {}",
                    n.bridge,
                    n.nodes.len(),
                    n.bridge,
                    n.subnet,
                    n.gateway,
                    n.election
                );
            }
            if let Err(e) = fleet::current_leader(&state, Duration::from_secs(30)).await {
                eprintln!("{e:#}");
            }
            fleet::print_status(&fleet::status(&state).await);
            if shards > 1 {
                tokio::time::sleep(Duration::from_secs(2)).await;
                fleet::print_placement(&fleet::status(&state).await);
            }
            if foreground {
                run_foreground(&state, run_for.map(Duration::from_millis)).await;
                state.down();
                println!("fleet stopped");
            }
            Ok(())
        }
        FleetCmd::Status { dir, json } => {
            let state = FleetState::load(&dir)?;
            let rows = fleet::status(&state).await;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                fleet::print_status(&rows);
                fleet::print_placement(&rows);
            }
            Ok(())
        }
        FleetCmd::Down { dir } => {
            let state = FleetState::load(&dir)?;
            tokio::task::spawn_blocking(move || state.down()).await?;
            println!("fleet stopped");
            Ok(())
        }
        FleetCmd::Kill { id, dir } => {
            FleetState::load(&dir)?.kill_node(&id)?;
            println!("killed {id} (SIGKILL)");
            Ok(())
        }
        FleetCmd::Start { id, dir } => {
            let pid = FleetState::load(&dir)?.start_node(&id)?;
            println!("started {id} as pid {pid}");
            Ok(())
        }
        FleetCmd::Restart {
            rolling,
            settle,
            dir,
        } => {
            anyhow::ensure!(
                rolling,
                "only --rolling restarts exist (one node at a time)"
            );
            let mut state = FleetState::load(&dir)?;
            state.restart_rolling(Duration::from_millis(settle)).await?;
            println!("rolling restart done");
            fleet::print_status(&fleet::status(&state).await);
            fleet::print_placement(&fleet::status(&state).await);
            Ok(())
        }
        FleetCmd::Stepdown { to, dir } => fleet_stepdown(&FleetState::load(&dir)?, to).await,
    }
}

async fn fleet_stepdown(state: &FleetState, to: Option<String>) -> anyhow::Result<()> {
    let rows = fleet::status(state).await;
    let leader = fleet::leader_row(&rows).context("no node says it leads")?;
    let path = match &to {
        Some(t) => format!("/stepdown?to={t}"),
        None => "/stepdown".to_owned(),
    };
    let r = state
        .admin_client(Duration::from_secs(40))
        .post(&leader.http_addr, &path)
        .await?;
    if r.status != 200 {
        anyhow::bail!(
            "POST {path} to {} answered {}: {}",
            leader.id,
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }
    println!("{} stepped down: {}", leader.id, r.json()["stepped_down"]);
    Ok(())
}

/// Takes a few IDs from the leader, then prints every leadership change until Ctrl-C.
async fn run_foreground(state: &FleetState, run_for: Option<Duration>) {
    let client = fleet::client::NodeClient::new(Duration::from_secs(2));
    if let Some(r) = fleet::leader_row(&fleet::status(state).await) {
        for _ in 0..3 {
            if let Ok(reply) = client.post(&r.http_addr, "/next").await {
                println!(
                    "POST /next on {} -> {} {}",
                    r.id,
                    reply.status.as_u16(),
                    String::from_utf8_lossy(&reply.body)
                );
            }
        }
    }
    println!("watching leadership (Ctrl-C stops the fleet)...");
    let stop = async {
        match run_for {
            Some(d) => tokio::time::sleep(d).await,
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    tokio::pin!(stop);
    let mut last: Option<(String, i64)> = None;
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        let rows = fleet::status(state).await;
        let now = fleet::leader_row(&rows).map(|r| (r.id.clone(), r.token.unwrap_or(0)));
        if now != last {
            match &now {
                Some((id, tok)) => println!("leader: {id} (token {tok})"),
                None => println!("no leader"),
            }
            last = now;
        }
    }
}

/// The justfile is how the project was specified to be used (SPEC §1: `just fleet 9`, `just exp
/// graceful-stepdown`, `just test`): `just` itself runs (scripts/ensure-deps.sh installs it), and
/// every `baton` command line its recipes expand to parses with this binary's CLI as it is.
#[cfg(test)]
mod justfile_tests {
    use std::path::{Path, PathBuf};
    use std::process::{Command, Output};

    use clap::Parser;

    use super::Cli;

    const BATON_IN_RECIPES: &str = "target/release/baton";

    fn repo() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn just(args: &[&str]) -> Output {
        Command::new("just")
            .arg("--justfile")
            .arg(repo().join("justfile"))
            .args(args)
            .output()
            .expect("`just` on PATH: scripts/ensure-deps.sh installs it (PyPI rust-just)")
    }

    /// The `baton` invocations in one shell line of a recipe, a `$(...)` inside it included.
    fn baton_invocations(line: &str) -> Vec<Vec<String>> {
        let mut found = Vec::new();
        let mut line = line.to_owned();
        if let (Some(open), Some(close)) = (line.find("$("), line.rfind(')')) {
            found.extend(baton_invocations(&line[open + 2..close]));
            line.replace_range(open..=close, "n1");
        }
        for part in line.split(['|', ';', '>', '&']) {
            if let Some(args) = part.trim().strip_prefix(BATON_IN_RECIPES) {
                found.push(args.split_whitespace().map(str::to_owned).collect());
            }
        }
        found
    }

    #[test]
    fn just_lists_the_recipes_the_spec_names() {
        let out = just(&["--list"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        for recipe in ["fleet", "exp", "test", "build", "promtool", "kill-leader"] {
            assert!(
                text.lines().any(
                    |l| l.trim_start().starts_with(&format!("{recipe} ")) || l.trim() == recipe
                ),
                "no recipe {recipe}:\n{text}"
            );
        }
    }

    #[test]
    fn every_recipes_baton_command_parses_with_the_cli() {
        let calls: &[&[&str]] = &[
            &["fleet", "9"],
            &["fleet", "3", "etcd"],
            &["up"],
            &["status"],
            &["down"],
            &["kill-leader"],
            &["exp", "graceful-stepdown"],
            &["exp", "churn", "--backends", "etcd", "--duration", "90s"],
            &["exp", "clean-kill", "--quick"],
            &["bench-failover", "etcd", "20"],
            &["test"],
        ];
        for call in calls {
            let mut args = vec!["--dry-run"];
            args.extend_from_slice(call);
            let out = just(&args);
            // --dry-run prints each recipe line (its dependencies' too) on stderr.
            let lines = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(out.status.success(), "just {call:?}: {lines}");
            let mut checked = 0;
            for line in lines.lines() {
                for argv in baton_invocations(line) {
                    let parsed = Cli::try_parse_from(
                        std::iter::once("baton".to_owned()).chain(argv.clone()),
                    );
                    assert!(
                        parsed.is_ok(),
                        "just {call:?} runs `baton {}`, which the CLI refuses: {}",
                        argv.join(" "),
                        parsed.err().map(|e| e.to_string()).unwrap_or_default()
                    );
                    checked += 1;
                }
                if let Some(script) = line.strip_prefix("bash ") {
                    assert!(
                        repo().join(script.trim()).is_file(),
                        "just {call:?}: no {script}"
                    );
                    checked += 1;
                }
            }
            assert!(checked > 0, "just {call:?} ran nothing checkable:\n{lines}");
        }
        // `just exp NAME` reads experiments/NAME.toml.
        assert!(repo().join("experiments/graceful-stepdown.toml").is_file());
    }

    /// One recipe run for real: the cheap one (promtool on the shipped Prometheus files).
    #[test]
    fn just_promtool_passes() {
        let out = just(&["promtool"]);
        assert!(
            out.status.success(),
            "just promtool: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
