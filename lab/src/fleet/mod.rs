//! Local fleets: private backend servers plus N detached `baton node` processes on loopback,
//! described by a state file (`fleet.json`) that `baton fleet status|down|kill|start` read.

pub mod client;
pub mod meter;
pub mod netns;
pub mod redis_server;
pub mod servers;
pub mod zk_server;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use baton::backends::BackendKind;
use baton::config::{Fencing, NodeConfig};
use redis_server::{RedisSentinelSet, RedisServer};
use servers::{free_ports, pid_alive, spawn_detached, stop_pid, EtcdCluster, PgServer};
use zk_server::ZkEnsemble;

pub const STATE_FILE: &str = "fleet.json";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FleetNode {
    pub id: String,
    pub pid: u32,
    pub http_addr: String,
    /// The raft peer listener (raft fleets only): chaos cuts it to partition a node.
    #[serde(default)]
    pub peer_addr: Option<String>,
    pub config: PathBuf,
    pub log: PathBuf,
    /// When the process `pid` names started ([`servers::start_ticks`]). A state file whose pid
    /// now names a process that started at another time loads with pid 0 (not running), so
    /// `fleet down` or `fleet up` in an old directory never signals whoever reuses the pid.
    #[serde(default)]
    pub started_ticks: Option<u64>,
}

/// Sets to 0 ("not running") every pid of `state` whose process is gone and which names another
/// process now: nodes, backend servers, the netns relay. PostgreSQL is found by its own
/// `postmaster.pid`, which PostgreSQL checks itself.
fn forget_reused_pids(state: &mut FleetState) {
    for n in &mut state.nodes {
        n.pid = servers::ours(n.pid, n.started_ticks);
    }
    for m in state.etcd.iter_mut().flat_map(|e| e.members.iter_mut()) {
        m.pid = servers::ours(m.pid, m.started_ticks);
    }
    for m in state.zk.iter_mut().flat_map(|z| z.members.iter_mut()) {
        m.pid = servers::ours(m.pid, m.started_ticks);
    }
    if let Some(r) = &mut state.redis {
        r.pid = servers::ours(r.pid, r.started_ticks);
    }
    for r in state
        .redis_sentinel
        .iter_mut()
        .flat_map(|s| std::iter::once(&mut s.replica).chain(s.sentinels.iter_mut()))
    {
        r.pid = servers::ours(r.pid, r.started_ticks);
    }
    if let Some(net) = &mut state.netns {
        net.relay_pid = net
            .relay_pid
            .map(|p| servers::ours(p, net.relay_started_ticks))
            .filter(|&p| p != 0);
    }
}

impl FleetNode {
    /// Whether `pid` still names the process this node started as.
    fn pid_is_ours(&self) -> bool {
        servers::ours(self.pid, self.started_ticks) != 0
    }
}

/// Writes a file only its owner can read: node configs and fleet.json carry secrets (the
/// cluster secret, the admin token, database passwords).
pub fn write_private(path: &Path, contents: impl AsRef<[u8]>) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(contents.as_ref())
}

/// A fresh cluster secret for one raft fleet: 32 random bytes, hex. Every node's TOML carries it
/// (written 0600), so `baton node --config ...` and every other command keep working.
fn generate_cluster_secret() -> baton::config::Secret {
    baton::config::Secret::new(random_hex(32))
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FleetState {
    pub dir: PathBuf,
    pub backend: BackendKind,
    pub fencing: Fencing,
    pub postgres: PgServer,
    /// The resource's streaming standby (`fleet up --resource-standby`), promoted by hand or by
    /// the `pg-promote` fault.
    #[serde(default)]
    pub postgres_standby: Option<PgServer>,
    pub etcd: Option<EtcdCluster>,
    /// The private Redis of the `redis` / `redis-naive` backends (no persistence).
    #[serde(default)]
    pub redis: Option<RedisServer>,
    /// `--redis-topology sentinel`: the primary's replica and three Sentinels; the nodes ask
    /// the Sentinels for the primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_sentinel: Option<RedisSentinelSet>,
    /// The private 3-server ZooKeeper ensemble of the `zk` backend.
    #[serde(default)]
    pub zk: Option<ZkEnsemble>,
    pub nodes: Vec<FleetNode>,
    /// `fleet up --netns`: the bridge and per-node namespaces (`crate::fleet::netns`).
    #[serde(default)]
    pub netns: Option<crate::fleet::netns::NetnsFleet>,
    /// The admin token `fleet up` generated for every node of this fleet (`POST /stepdown`).
    /// The file holding it is private to its owner (0600), like the node configs.
    #[serde(default)]
    pub admin_token: Option<String>,
}

/// What `baton fleet up` was asked for.
#[derive(Clone, Debug)]
pub struct FleetSpec {
    pub nodes: usize,
    pub backend: BackendKind,
    pub dir: PathBuf,
    /// Base node config (a `config/*.toml`); per-node fields are filled in.
    pub base_config: Option<PathBuf>,
    pub fencing: Fencing,
    pub lease_ttl_ms: Option<u64>,
    pub node_args: Vec<String>,
    /// K shards (`[shards] count`); with K > 1 every node's config lists the fleet as members.
    pub shards: u32,
    /// A streaming standby of the fenced resource's PostgreSQL (`--resource-standby`); the
    /// nodes' resource and pg-lease URLs name both servers and ask for the writable one.
    pub resource_standby: Option<StandbyMode>,
    /// The redis backends' servers (`--redis-topology`): one Redis, or a primary, a replica and
    /// three Sentinels that the nodes ask for the primary.
    pub redis_topology: RedisTopology,
}

/// How a redis fleet's Redis is laid out (`baton fleet up --redis-topology`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RedisTopology {
    /// One Redis at the nodes' `[redis] url`.
    #[default]
    Single,
    /// A primary, one replica and three Sentinels (`[redis] sentinels`, `master_name`); a
    /// failover promotes the replica (`baton chaos sentinel-failover`). Replication is
    /// asynchronous: the promoted replica may lack the last `INCR`s of the token counter.
    Sentinel,
}

/// How the fenced resource's standby replicates (`baton fleet up --resource-standby`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum StandbyMode {
    /// A commit is acknowledged before the standby has it: a promotion can lose acknowledged
    /// IDs and the fence's own `max_token` (FINDINGS §15).
    Async,
    /// `synchronous_standby_names = '*'`, `synchronous_commit = on`: a commit is on the
    /// standby's disk before its client hears of it.
    Sync,
}

impl FleetState {
    pub fn load(dir: &Path) -> anyhow::Result<FleetState> {
        let path = dir.join(STATE_FILE);
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "no fleet at {} (start one with `baton fleet up`)",
                path.display()
            )
        })?;
        let mut state: FleetState =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        forget_reused_pids(&mut state);
        Ok(state)
    }

    pub fn save(&self) -> anyhow::Result<()> {
        let path = self.dir.join(STATE_FILE);
        let tmp = path.with_extension("json.tmp");
        write_private(&tmp, &serde_json::to_vec_pretty(self)?)?;
        fs::rename(&tmp, &path)?;
        // Prometheus file-based discovery (config/prometheus.yml reads it).
        let targets = serde_json::json!([{
            "targets": self.nodes.iter().map(|n| n.http_addr.clone()).collect::<Vec<_>>(),
            "labels": { "backend": self.backend.as_str() },
        }]);
        fs::write(
            self.dir.join("prometheus-targets.json"),
            serde_json::to_vec_pretty(&targets)?,
        )?;
        Ok(())
    }

    /// A node client that authenticates to this fleet's admin routes.
    pub fn admin_client(&self, timeout: Duration) -> client::NodeClient {
        client::NodeClient::new(timeout).with_admin_token(self.admin_token.as_deref())
    }

    pub fn node(&self, id: &str) -> anyhow::Result<&FleetNode> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .with_context(|| format!("no node {id:?} in this fleet"))
    }

    /// Starts (or restarts) one node process from its config; keeps its state dir.
    pub fn start_node(&mut self, id: &str) -> anyhow::Result<u32> {
        self.start_node_env(id, &[])
    }

    /// [`FleetState::start_node`] with extra environment variables (e.g. libfaketime's
    /// `LD_PRELOAD` and `FAKETIME` for a clock-rate fault).
    pub fn start_node_env(&mut self, id: &str, env: &[(String, String)]) -> anyhow::Result<u32> {
        let exe = std::env::current_exe().context("locating the baton binary")?;
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.id == id)
            .with_context(|| format!("no node {id:?}"))?;
        if pid_alive(node.pid) {
            bail!("node {id} is already running as pid {}", node.pid);
        }
        let mut cmd = match self.netns.as_ref().and_then(|n| n.ns_of(id)) {
            Some(ns) => crate::fleet::netns::command_in(ns, &exe),
            None => Command::new(exe),
        };
        cmd.arg("node").arg("--config").arg(&node.config);
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        node.pid = spawn_detached(&mut cmd, &node.log)?;
        node.started_ticks = servers::spawned_ticks(node.pid);
        let pid = node.pid;
        self.save()?;
        Ok(pid)
    }

    /// Removes a stopped node's durable state (raft log and vote, anything else it keeps),
    /// keeping its config, its log and its actor trace: restarted, it is a brand-new member
    /// under an old id.
    pub fn wipe_node_state(&self, id: &str) -> anyhow::Result<Vec<String>> {
        let node = self.node(id)?;
        if pid_alive(node.pid) {
            bail!(
                "node {id} is running (pid {}): wipe only a stopped node",
                node.pid
            );
        }
        let dir = node
            .config
            .parent()
            .with_context(|| format!("{id}'s config has no directory"))?;
        const KEEP: &[&str] = &["config.toml", "node.log", "actor-trace.jsonl"];
        let mut removed = Vec::new();
        for e in fs::read_dir(dir)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if KEEP.contains(&name.as_str()) {
                continue;
            }
            let p = e.path();
            if p.is_dir() {
                fs::remove_dir_all(&p)?;
            } else {
                fs::remove_file(&p)?;
            }
            removed.push(name);
        }
        Ok(removed)
    }

    /// `kill -9` of one node.
    pub fn kill_node(&self, id: &str) -> anyhow::Result<()> {
        let node = self.node(id)?;
        if !node.pid_is_ours() {
            return Ok(()); // not running: nothing of ours to kill
        }
        // SAFETY: kill(2) on the pid we started, checked to be that process still.
        unsafe { libc::kill(node.pid as i32, libc::SIGKILL) };
        Ok(())
    }

    /// Stops one node gracefully: SIGTERM (it drains and demotes: checkpoint, stop, release),
    /// SIGKILL if it is still there after `bound`.
    pub fn stop_node(&self, id: &str, bound: Duration) -> anyhow::Result<()> {
        let node = self.node(id)?;
        if pid_alive(node.pid) && node.pid_is_ours() {
            stop_pid(node.pid, libc::SIGTERM, bound);
        }
        Ok(())
    }

    /// A rolling restart: each node in turn is stopped gracefully, started again, and given
    /// `settle` (to be probed live again and take its shards back) before the next one goes.
    pub async fn restart_rolling(&mut self, settle: Duration) -> anyhow::Result<()> {
        let ids: Vec<String> = self.nodes.iter().map(|n| n.id.clone()).collect();
        for id in ids {
            let state = self.clone();
            let stop_id = id.clone();
            tokio::task::spawn_blocking(move || state.stop_node(&stop_id, Duration::from_secs(15)))
                .await??;
            self.start_node(&id)?;
            let addr = self.node(&id)?.http_addr.clone();
            let client = client::NodeClient::new(Duration::from_secs(1));
            let until = tokio::time::Instant::now() + Duration::from_secs(30);
            while !client
                .get(&addr, "/healthz")
                .await
                .is_ok_and(|r| r.status == 200)
            {
                if tokio::time::Instant::now() > until {
                    bail!("node {id} did not answer /healthz within 30 s of its restart");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(settle).await;
        }
        Ok(())
    }

    /// Stops everything: nodes first (they demote and resign), then the servers.
    pub fn down(&self) {
        for n in &self.nodes {
            if pid_alive(n.pid) && n.pid_is_ours() {
                stop_pid(n.pid, libc::SIGTERM, Duration::from_secs(8));
            }
        }
        if let Some(etcd) = &self.etcd {
            etcd.stop();
        }
        if let Some(set) = &self.redis_sentinel {
            set.stop();
        }
        if let Some(redis) = &self.redis {
            redis.stop();
        }
        if let Some(zk) = &self.zk {
            zk.stop();
        }
        if let Some(standby) = &self.postgres_standby {
            standby.stop();
        }
        self.postgres.stop();
        if let Some(net) = &self.netns {
            let left = net.teardown();
            if left.is_empty() {
                let _ = fs::remove_file(self.dir.join(crate::fleet::netns::NETNS_FILE));
            } else {
                eprintln!("fleet down: could not remove {left:?}");
            }
        }
    }
}

/// A fresh admin token for a fleet: 32 random bytes, hex.
pub fn generate_admin_token() -> String {
    random_hex(32)
}

/// `n` random bytes from the OS, hex: every secret the lab generates.
pub fn random_hex(n: usize) -> String {
    use rand::RngCore;
    let mut bytes = vec![0u8; n];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Starts the servers the backend needs, migrates the resource, and starts the nodes.
pub async fn up(spec: &FleetSpec) -> anyhow::Result<FleetState> {
    up_opts(spec, false).await
}

/// [`up`] with each node in its own network namespace behind a bridge (`crate::fleet::netns`),
/// so `baton chaos partition-leader` can cut one node's paths. Needs root.
pub async fn up_netns(spec: &FleetSpec) -> anyhow::Result<FleetState> {
    up_opts(spec, true).await
}

async fn up_opts(spec: &FleetSpec, netns: bool) -> anyhow::Result<FleetState> {
    if spec.nodes == 0 {
        bail!("a fleet needs at least one node");
    }
    fs::create_dir_all(&spec.dir).with_context(|| format!("creating {}", spec.dir.display()))?;
    let dir = spec.dir.canonicalize()?;
    if dir.join(STATE_FILE).exists() {
        if let Ok(old) = FleetState::load(&dir) {
            if old.nodes.iter().any(|n| pid_alive(n.pid)) {
                bail!(
                    "a fleet is already running in {} (stop it with `baton fleet down --dir {}`)",
                    dir.display(),
                    dir.display()
                );
            }
        }
    }
    let started = start(spec, &dir, netns).await;
    if started.is_err() {
        // Whatever did start (and was recorded) must not outlive the failure.
        if let Ok(partial) = FleetState::load(&dir) {
            let _ = tokio::task::spawn_blocking(move || partial.down()).await;
        }
    }
    started
}

/// `config/<backend>.toml` when it exists (the committed per-backend defaults), else none.
pub fn default_base_config(backend: BackendKind) -> Option<PathBuf> {
    let p = crate::repo_path(format!("config/{}.toml", backend.as_str()));
    p.exists().then_some(p)
}

/// A lease of `ttl_ms` in place of the base config's, renewed every quarter of it (a retry at most
/// a third of that): a `--lease-ttl` or an experiment's TTL sweep keeps the watchdog's headroom
/// of three renewals whatever the lease (the backends' own 800 ms renewal fits only their 3 s).
pub fn override_lease_ttl(cfg: &mut NodeConfig, ttl_ms: u64) {
    cfg.lease_ttl_ms = ttl_ms;
    cfg.renew_interval_ms = (ttl_ms / 4).max(2);
    cfg.retry_interval_ms = cfg.retry_interval_ms.min(cfg.renew_interval_ms / 3).max(1);
}

/// [`default_base_config`] for a fleet of `shards` shards: sharded raft runs on
/// `config/raft-shards.toml` (shard leases of 3 s renewed every 800 ms, as on the lease
/// backends, so a raft leader change does not outlast them), everything else as without shards.
pub fn default_base_config_for(backend: BackendKind, shards: u32) -> Option<PathBuf> {
    if backend == BackendKind::Raft && shards > 1 {
        let p = crate::repo_path("config/raft-shards.toml");
        if p.exists() {
            return Some(p);
        }
    }
    default_base_config(backend)
}

/// Makes `dir` ready for a fresh fleet: absent or empty is fine; a stopped fleet's directory is
/// wiped (its servers stopped, should any have survived); a running fleet, or a directory that is
/// not a fleet's, is refused, so a scratch `--dir` typo never deletes someone's files.
pub fn prepare_scratch_dir(dir: &Path) -> anyhow::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let is_empty = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .next()
        .is_none();
    if is_empty {
        return Ok(());
    }
    let old = FleetState::load(dir).with_context(|| {
        format!(
            "{} exists and is not a stopped fleet's directory; pass another --dir",
            dir.display()
        )
    })?;
    if old.nodes.iter().any(|n| pid_alive(n.pid)) {
        bail!(
            "a fleet is running in {} (stop it with `baton fleet down --dir {}`)",
            dir.display(),
            dir.display()
        );
    }
    old.down();
    fs::remove_dir_all(dir).with_context(|| format!("wiping {}", dir.display()))
}

/// The resource's standby, when `spec` asks for one; warns when it is asynchronous (the
/// guarantees do not survive its promotion, FINDINGS §15).
async fn start_standby(
    spec: &FleetSpec,
    dir: &Path,
    primary: &PgServer,
) -> anyhow::Result<Option<PgServer>> {
    let Some(mode) = spec.resource_standby else {
        return Ok(None);
    };
    if mode == StandbyMode::Async {
        eprintln!(
            "warning: the fenced resource's standby is asynchronous: promoting it can lose acknowledged IDs and the fence's own max_token (README, \"What is guaranteed\"; FINDINGS §15); use --resource-standby sync for the guarantees to survive a failover of the resource"
        );
    }
    let (primary, root, port) = (
        primary.clone(),
        dir.join("postgres-standby"),
        free_ports(1)?[0],
    );
    let standby = tokio::task::spawn_blocking(move || {
        primary.start_standby(&root, port, mode == StandbyMode::Sync)
    })
    .await??;
    Ok(Some(standby))
}

/// The body of [`up`]: servers, then nodes, recording each in the fleet's state file.
async fn start(spec: &FleetSpec, dir: &Path, netns: bool) -> anyhow::Result<FleetState> {
    let dir = dir.to_path_buf();
    let base = match &spec.base_config {
        Some(p) => NodeConfig::from_file(p)?,
        None => NodeConfig::for_backend(spec.backend),
    };
    let mut base = base;
    base.backend = spec.backend;
    base.fencing = spec.fencing;
    if let Some(ttl) = spec.lease_ttl_ms {
        override_lease_ttl(&mut base, ttl);
    }
    // Checked as the nodes will run it: with its shard count (sharded raft's leases are
    // judged otherwise than one raft leader's), members filled in below.
    let mut check = base.clone();
    if spec.shards > 1 {
        check.shards.count = spec.shards;
        check.shards.members = vec![baton::config::MemberSpec {
            id: check.node_id.clone(),
            addr: check.http_listen.to_string(),
        }];
    }
    let swim = base.detector.kind == baton::config::DetectorKind::Swim;
    if swim {
        // Filled in per node below; a placeholder so the shared settings are checked now.
        check.detector.bind = Some("127.0.0.1:0".parse()?);
    }
    check.validate().context("fleet node config")?;
    // Removes the namespaces again unless disarmed (error, or Ctrl-C dropping this future).
    let mut net = crate::fleet::netns::NetnsGuard::new(
        &dir,
        if netns {
            Some(crate::fleet::netns::NetnsFleet::create(&dir, spec.nodes)?)
        } else {
            None
        },
    );

    let pg_port = free_ports(1)?[0];
    let pg_root = dir.join("postgres");
    let pg_listen = net.pg_listen();
    if netns && spec.resource_standby.is_some() {
        anyhow::bail!("--resource-standby is not offered with --netns yet");
    }
    if spec.redis_topology == RedisTopology::Sentinel {
        if !matches!(spec.backend, BackendKind::Redis | BackendKind::RedisNaive) {
            anyhow::bail!(
                "--redis-topology sentinel is for the redis and redis-naive backends, not {}",
                spec.backend
            );
        }
        if netns {
            anyhow::bail!("--redis-topology sentinel is not offered with --netns yet");
        }
    }
    let postgres =
        tokio::task::spawn_blocking(move || PgServer::start_on(&pg_root, pg_port, &pg_listen))
            .await??;
    let standby = match start_standby(spec, &dir, &postgres).await {
        Ok(s) => s,
        Err(e) => {
            postgres.stop();
            return Err(e);
        }
    };
    let stop_pg = || {
        standby.iter().for_each(PgServer::stop);
        postgres.stop();
    };
    // From here on, a failure stops what was already started.
    let servers = start_backend_servers(spec, &dir, &base, &postgres, net.election_ip()).await;
    let (etcd, redis, zk) = match servers {
        Ok(s) => s,
        Err(e) => {
            stop_pg();
            return Err(e);
        }
    };
    let redis_sentinel = match (&redis, spec.redis_topology) {
        (Some(primary), RedisTopology::Sentinel) => {
            let (root, primary) = (dir.clone(), primary.clone());
            let set = tokio::task::spawn_blocking(move || RedisSentinelSet::start(&root, &primary))
                .await?;
            match set {
                Ok(set) => Some(set),
                Err(e) => {
                    redis.iter().for_each(RedisServer::stop);
                    stop_pg();
                    return Err(e.into());
                }
            }
        }
        _ => None,
    };
    if let Err(e) = net.attach_servers(redis.as_ref(), zk.as_ref()) {
        redis.iter().for_each(RedisServer::stop);
        zk.iter().for_each(ZkEnsemble::stop);
        stop_pg();
        return Err(e);
    }
    // With a standby every URL names both servers and asks for the writable one.
    let pg_pair: Vec<&PgServer> = std::iter::once(&postgres).chain(&standby).collect();

    let ports = free_ports(spec.nodes)?;
    // Raft peer RPC has its own listener per node, never the client port.
    let peer_ports = if spec.backend == BackendKind::Raft {
        free_ports(spec.nodes)?
    } else {
        Vec::new()
    };
    // The SWIM detector's UDP sockets, one per node (the ports were free for TCP a moment ago;
    // a clash shows up as a node that does not start, with the bind error in its log).
    let detector_ports = if swim {
        free_ports(spec.nodes)?
    } else {
        Vec::new()
    };
    let cluster_secret = generate_cluster_secret();
    // One per fleet, kept in fleet.json for the fleet's own tools (stepdown, chaos, bench, exp).
    let admin_token = generate_admin_token();
    let mut nodes = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let id = format!("n{}", i + 1);
        let node_dir = dir.join("nodes").join(&id);
        fs::create_dir_all(&node_dir)?;
        let mut cfg = base.clone();
        cfg.node_id = id.clone();
        cfg.http_listen = format!("127.0.0.1:{port}").parse()?;
        cfg.advertise_addr = Some(format!("127.0.0.1:{port}"));
        cfg.state_dir = node_dir.clone();
        // Each node writes as its own database role, so the fence's holder is who logged in.
        cfg.resource.database_url = postgres.node_role_url(&id).await?;
        if standby.is_some() {
            let role = baton::work::fence::node_role(&id);
            cfg.resource.database_url = PgServer::multi_host_url(&pg_pair, &role)?;
        }
        cfg.admin_token = Some(admin_token.clone().into());
        if let Some(e) = &etcd {
            cfg.etcd.endpoints = e.endpoints();
        }
        if let Some(r) = &redis {
            cfg.redis.url = r.url();
        }
        if let Some(set) = &redis_sentinel {
            // The url keeps the scheme (and would keep the credentials); the Sentinels name
            // the server.
            cfg.redis.sentinels = set.addrs();
            cfg.redis.master_name = Some(set.master_name.clone());
        }
        if let Some(z) = &zk {
            cfg.zk.connect = z.connect_string();
        }
        if spec.backend == BackendKind::Raft {
            // Every member, this node included: the raft group is the fleet.
            cfg.raft.peers = ports
                .iter()
                .zip(&peer_ports)
                .enumerate()
                .map(|(j, (p, pp))| baton::config::PeerSpec {
                    id: format!("n{}", j + 1),
                    addr: format!("127.0.0.1:{p}"),
                    peer_addr: format!("127.0.0.1:{pp}"),
                })
                .collect();
            cfg.raft.peer_listen = Some(format!("127.0.0.1:{}", peer_ports[i]).parse()?);
            cfg.raft.cluster_secret = Some(cluster_secret.clone());
        }
        if swim {
            cfg.detector.bind = None;
            cfg.detector.peers = detector_ports
                .iter()
                .enumerate()
                .map(|(j, p)| baton::config::DetectorPeer {
                    id: format!("n{}", j + 1),
                    addr: format!("127.0.0.1:{p}"),
                })
                .collect();
            // The detector authenticates its datagrams with the cluster secret, whatever the
            // backend.
            if cfg.raft.cluster_secret.is_none() && cfg.raft.cluster_secret_file.is_none() {
                cfg.raft.cluster_secret = Some(cluster_secret.clone());
            }
        }
        if spec.shards > 1 {
            cfg.shards.count = spec.shards;
            cfg.shards.members = ports
                .iter()
                .enumerate()
                .map(|(j, p)| baton::config::MemberSpec {
                    id: format!("n{}", j + 1),
                    addr: format!("127.0.0.1:{p}"),
                })
                .collect();
        }
        if spec.backend == BackendKind::PgLease {
            // Its own role and schema: lease credentials cannot reach the fenced resource.
            cfg.pg_lease.database_url = if standby.is_some() {
                PgServer::multi_host_url(&pg_pair, baton::backends::pg_lease::LEASE_ROLE)?
            } else {
                postgres.lease_url()
            };
        }
        if let Some(n) = net.get() {
            let (e, r, z) = (etcd.as_ref(), redis.as_ref(), zk.as_ref());
            n.node_config(i, &mut cfg, &ports, &peer_ports, &postgres, e, r, z)?;
        }
        let config = node_dir.join("config.toml");
        write_private(&config, &toml::to_string(&cfg)?)?;
        let peer_addr = cfg
            .raft
            .peers
            .iter()
            .find(|p| p.id == id)
            .map(|p| p.peer_addr.clone());
        nodes.push(FleetNode {
            id,
            pid: 0,
            http_addr: cfg
                .advertise_addr
                .clone()
                .unwrap_or_else(|| format!("127.0.0.1:{port}")),
            peer_addr,
            config,
            log: node_dir.join("node.log"),
            started_ticks: None,
        });
    }
    let mut state = FleetState {
        dir: dir.clone(),
        backend: spec.backend,
        fencing: spec.fencing,
        postgres,
        postgres_standby: standby,
        etcd,
        redis,
        redis_sentinel,
        zk,
        nodes,
        netns: net.get().cloned(),
        admin_token: Some(admin_token),
    };
    state.save()?;
    let ids: Vec<String> = state.nodes.iter().map(|n| n.id.clone()).collect();
    for id in ids {
        state.start_node(&id)?;
    }
    let within = NODE_START_WAIT + Duration::from_secs(state.nodes.len() as u64);
    wait_until_serving(&state, within).await?;
    net.disarm();
    Ok(state)
}

/// How long `fleet up` waits for every node to answer, plus a second per node: a debug build on a
/// loaded 2-core machine takes about two seconds to reach its resource and backend, and a
/// 51-node fleet starts its nodes side by side on those two cores.
const NODE_START_WAIT: Duration = Duration::from_secs(30);

/// Returns once every node answers `GET /status` (any reply: a node serves HTTP only after it has
/// reached its resource and its backend). So `fleet up` hands back a fleet that is up, and a node
/// that exits while starting fails it in that node's own words (the end of its log) rather than
/// as a missing vote in whatever runs next.
async fn wait_until_serving(state: &FleetState, within: Duration) -> anyhow::Result<()> {
    let client = state.admin_client(Duration::from_secs(2));
    let until = tokio::time::Instant::now() + within;
    let mut waiting: Vec<&FleetNode> = state.nodes.iter().collect();
    loop {
        if let Some(gone) = waiting.iter().find(|n| !pid_alive(n.pid)) {
            bail!(
                "node {} exited while starting; the end of its log ({}):\n{}",
                gone.id,
                gone.log.display(),
                servers::log_tail(&gone.log, 20)
            );
        }
        let asks = waiting.iter().map(|n| client.get(&n.http_addr, "/status"));
        let replies = futures::future::join_all(asks).await;
        waiting = waiting
            .into_iter()
            .zip(replies)
            .filter_map(|(n, r)| r.is_err().then_some(n))
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() > until {
            let ids: Vec<&str> = waiting.iter().map(|n| n.id.as_str()).collect();
            bail!(
                "node(s) {} did not answer /status within {within:?}; the end of {}'s log:\n{}",
                ids.join(", "),
                waiting[0].id,
                servers::log_tail(&waiting[0].log, 20)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start_backend_servers(
    spec: &FleetSpec,
    dir: &Path,
    base: &NodeConfig,
    postgres: &PgServer,
    election_ip: Option<std::net::IpAddr>,
) -> anyhow::Result<(Option<EtcdCluster>, Option<RedisServer>, Option<ZkEnsemble>)> {
    baton::work::fence::migrate(&postgres.admin_url(), Some(spec.fencing == Fencing::On))
        .await
        .context("migrating the fenced resource")?;
    // Only per-node roles write to a fleet's resource (created with the nodes' configs).
    baton::work::fence::set_require_node_roles(&postgres.admin_url(), true)
        .await
        .context("requiring per-node roles")?;
    match spec.backend {
        BackendKind::Etcd => {
            let root = dir.join("etcd");
            // etcd's minimum lease TTL is 1.5 × its election timeout: shrink it for short leases.
            let (hb, el) = if base.lease_ttl_ms < 2000 {
                (50, 500)
            } else {
                (100, 1000)
            };
            Ok((
                Some(
                    tokio::task::spawn_blocking(move || {
                        EtcdCluster::start_on(&root, 3, hb, el, election_ip)
                    })
                    .await??,
                ),
                None,
                None,
            ))
        }
        BackendKind::RedisNaive | BackendKind::Redis => {
            let root = dir.join("redis");
            let port = free_ports(1)?[0];
            Ok((
                None,
                Some(tokio::task::spawn_blocking(move || RedisServer::start(&root, port)).await??),
                None,
            ))
        }
        // The lease row lives in the fleet's PostgreSQL, already running.
        BackendKind::PgLease => {
            baton::backends::pg_lease::provision(&postgres.admin_url())
                .await
                .context("provisioning the pg-lease role")?;
            Ok((None, None, None))
        }
        // Raft runs among the nodes themselves: no server to start.
        BackendKind::Raft => Ok((None, None, None)),
        BackendKind::Custom => anyhow::bail!(
            "a fleet cannot start the custom backend: a user's own Elector is given in code"
        ),
        BackendKind::Zk => {
            // tickTime = TTL / 10: the TTL sits inside ZooKeeper's [2, 20] × tickTime bounds.
            let root = dir.join("zk");
            let tick = ZkEnsemble::tick_for_ttl(base.lease_ttl());
            Ok((
                None,
                None,
                Some(
                    tokio::task::spawn_blocking(move || ZkEnsemble::start(&root, 3, tick))
                        .await??,
                ),
            ))
        }
    }
}

/// One row of `baton fleet status`.
#[derive(Debug, Serialize)]
pub struct NodeRow {
    pub id: String,
    pub pid: u32,
    pub alive: bool,
    pub http_addr: String,
    pub role: Option<String>,
    pub token: Option<i64>,
    pub leader: Option<String>,
    /// Sharded fleets: the shards this node leads, and its tokens, from `/status`'s `shards`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shards_led: Vec<(u32, i64)>,
}

/// The leader among status rows: a live node answering `role = leader`, the highest token if
/// two do (a deposed leader may not know yet).
pub fn leader_row(rows: &[NodeRow]) -> Option<&NodeRow> {
    rows.iter()
        .filter(|r| r.alive && r.role.as_deref() == Some("leader"))
        .max_by_key(|r| r.token.unwrap_or(i64::MIN))
}

pub async fn status(state: &FleetState) -> Vec<NodeRow> {
    let client = client::NodeClient::new(Duration::from_secs(2));
    // Asked all at once: a paused or cut-off node costs one timeout, not one per node.
    let asks = state.nodes.iter().map(|n| {
        let client = client.clone();
        async move {
            let alive = pid_alive(n.pid);
            let st = if alive {
                let reply = client.get(&n.http_addr, "/status").await;
                reply.ok().map(|r| r.json())
            } else {
                None
            };
            NodeRow {
                id: n.id.clone(),
                pid: n.pid,
                alive,
                http_addr: n.http_addr.clone(),
                role: st
                    .as_ref()
                    .and_then(|s| s["role"].as_str().map(str::to_owned)),
                token: st.as_ref().and_then(|s| s["fence_token"].as_i64()),
                leader: st
                    .as_ref()
                    .and_then(|s| s["leader"]["node_id"].as_str().map(str::to_owned)),
                shards_led: st.as_ref().map(shards_led).unwrap_or_default(),
            }
        }
    });
    futures::future::join_all(asks).await
}

/// The node that leads now ([`leader_row`] of [`status`]), asked every 50 ms until `within` has
/// passed; with its token.
pub async fn current_leader(
    state: &FleetState,
    within: Duration,
) -> anyhow::Result<(FleetNode, i64)> {
    let until = tokio::time::Instant::now() + within;
    loop {
        let rows = status(state).await;
        if let Some(l) = leader_row(&rows) {
            return Ok((state.node(&l.id)?.clone(), l.token.unwrap_or(0)));
        }
        if tokio::time::Instant::now() > until {
            bail!("no node reports itself leader (waited {within:?})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `(shard, token)` of every shard a `/status` body says this node leads.
pub fn shards_led(status: &serde_json::Value) -> Vec<(u32, i64)> {
    status["shards"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|s| s["role"] == "leader")
                .filter_map(|s| Some((s["shard"].as_u64()? as u32, s["token"].as_i64()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// The placement of a sharded fleet (node × shards led); prints nothing for an unsharded one.
pub fn print_placement(rows: &[NodeRow]) {
    if rows.iter().all(|r| r.shards_led.is_empty()) {
        return;
    }
    println!("{:<6} {:>6}  shards led", "node", "count");
    for r in rows {
        let list: Vec<String> = r.shards_led.iter().map(|(s, _)| s.to_string()).collect();
        println!("{:<6} {:>6}  {}", r.id, r.shards_led.len(), list.join(","));
    }
}

pub fn print_status(rows: &[NodeRow]) {
    println!(
        "{:<6} {:>8} {:<22} {:<10} {:>12} {:<8}",
        "node", "pid", "http", "role", "token", "leader"
    );
    for r in rows {
        println!(
            "{:<6} {:>8} {:<22} {:<10} {:>12} {:<8}",
            r.id,
            if r.alive {
                r.pid.to_string()
            } else {
                "dead".into()
            },
            r.http_addr,
            r.role.as_deref().unwrap_or("-"),
            r.token.map(|t| t.to_string()).unwrap_or_else(|| "-".into()),
            r.leader.as_deref().unwrap_or("-"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_with(pid: u32, started_ticks: Option<u64>) -> FleetNode {
        FleetNode {
            id: "n1".into(),
            pid,
            http_addr: "127.0.0.1:1".into(),
            peer_addr: None,
            config: PathBuf::from("/nonexistent/config.toml"),
            log: PathBuf::from("/nonexistent/node.log"),
            started_ticks,
        }
    }

    /// This test's own process stands in for a node: recorded with its real start time it is
    /// ours; recorded with any other start time its pid is taken for a reused one and forgotten,
    /// so nothing would signal it.
    #[test]
    fn a_pid_that_names_a_process_started_at_another_time_is_forgotten() {
        let me = std::process::id();
        let ticks = servers::start_ticks(me).expect("our own /proc entry");
        assert_eq!(servers::start_ticks(me), Some(ticks), "stable");
        let nodes = [
            node_with(me, Some(ticks)),
            node_with(me, Some(ticks + 1)),
            node_with(me, None),
        ];
        let pids: Vec<u32> = nodes
            .iter()
            .map(|n| servers::ours(n.pid, n.started_ticks))
            .collect();
        assert_eq!(pids, vec![me, 0, me]);
        assert!(nodes[0].pid_is_ours() && !nodes[1].pid_is_ours());
        assert_eq!(servers::start_ticks(0), None);
        assert!(!pid_alive(pids[1]));
    }
}
