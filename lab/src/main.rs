//! The `baton` binary: thin subcommands over the library.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use baton::backends::BackendKind;
use baton::config::{parse_duration_ms, Fencing, NodeConfig};
use baton_lab::fleet::{self, FleetSpec, FleetState};
use clap::Parser;

use baton_lab::cli::{Cli, Cmd, ConfigCmd, FleetCmd, NodeArgs, OnExit, RunArgs};

fn node_config(a: NodeArgs) -> anyhow::Result<NodeConfig> {
    let mut c = match &a.config {
        // A --backend flag picks that backend's timing for the keys the file leaves out.
        Some(p) => NodeConfig::from_file_as(p, a.backend)?,
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
            let admin_url = baton_lab::admin_url::prepare(&admin_url, false).await?.url;
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
        Cmd::CliReference => {
            print!("{}", baton_lab::cli_doc::reference());
            Ok(())
        }
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
    // A lease or election timeout given on the command line is the operator's choice: kept, and
    // refused below if the margin cannot fit in it. Otherwise the lease is derived from the
    // margin (what `config init --child-stop-margin` writes), so the default timing of every
    // backend works with any stop timeout.
    let timing_given = args.node.lease_ttl.is_some() || args.node.election_timeout.is_some();
    let mut cfg = node_config(args.node)?;
    cfg.work_stop_margin_ms = args.child_stop_margin.unwrap_or(args.stop_timeout + 250);
    if !timing_given {
        derive_run_timing(&mut cfg);
    }
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

/// Raises `cfg`'s lease (on raft, its election timeout) just enough that the watchdog keeps its
/// renewal headroom after `baton run`'s stop margin, and says so when it changed anything.
fn derive_run_timing(cfg: &mut NodeConfig) {
    let (ttl_ms, election) = (cfg.lease_ttl_ms, cfg.election_timeout_ms.clone());
    cfg.fit_stop_margin(cfg.work_stop_margin_ms);
    if cfg.lease_ttl_ms != ttl_ms || cfg.election_timeout_ms != election {
        tracing::info!(
            lease_ttl_ms = cfg.lease_ttl_ms,
            was_ms = ttl_ms,
            election_timeout_ms = %cfg.election_timeout_ms,
            child_stop_margin_ms = cfg.work_stop_margin_ms,
            "baton run: lease derived from the stop margin, so the program is gone before the lease could expire (--lease-ttl / --election-timeout choose it yourself)"
        );
    }
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
