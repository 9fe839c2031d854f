//! Network-namespace fleets (`baton fleet up N --netns`): one namespace per node, each with a
//! veth into a bridge of ours in the root namespace, so a fault can cut one node's paths with
//! iptables rules *inside its namespace* and nothing else on the machine is touched.
//!
//! ```text
//!  root namespace                                   node namespaces (btn-<id>-n1, -n2, ...)
//!  ┌───────────────────────────────────────────┐    ┌───────────────────────────┐
//!  │ bridge btn-<id>                           │    │ eth0 10.213.K.11/24       │
//!  │   10.213.K.1  gateway: the fenced PG      │────│ baton node (HTTP + raft)  │
//!  │   10.213.K.2  election: etcd / redis /    │    │ iptables chain BATON-CHAOS│
//!  │               zk / the pg-lease PG        │    └───────────────────────────┘
//!  │ servers on 127.0.0.1 + those addresses    │    ... one per node (.12, .13, ...)
//!  └───────────────────────────────────────────┘
//! ```
//!
//! * **Addresses.** Each fleet takes one unused `10.213.K.0/24` (K picked under a host-wide lock
//!   so two fleets never share one); nothing else uses it. The namespaces have *no default
//!   route*: the only reachable addresses are the bridge's and the other nodes'. `ip_forward` is
//!   never touched, so nothing is routed anywhere else.
//! * **Two root-side addresses.** The fenced PostgreSQL is reached on the gateway `.1`, every
//!   election backend on the election address `.2`. A partition is then "DROP everything to and
//!   from `.2`" and leaves the resource path alone — including for `pg-lease`, whose lease lives in
//!   the *same* PostgreSQL server and port as the resource: iptables cannot tell two connections
//!   to one server port apart, but PostgreSQL listens on both addresses, the node's lease URL uses
//!   `.2` and its resource URL `.1`, so the cut is exact.
//! * **Servers.** PostgreSQL and etcd listen natively on 127.0.0.1 and the bridge addresses.
//!   Redis and ZooKeeper (whose launchers bind loopback only; ZooKeeper can bind just one client
//!   address) are reached through a small TCP relay (`baton chaos relay`, one detached process in
//!   the root namespace) from `.2:port` to `127.0.0.1:port`. The relay adds one userspace hop on
//!   the election path only.
//! * **Cleanup.** The plan is written to `<fleet dir>/netns.json` before anything is created;
//!   [`NetnsFleet::teardown`] (called by `fleet down`, by a failed `fleet up` through
//!   [`NetnsGuard`], and on Ctrl-C during `fleet up`) kills what still runs inside the namespaces
//!   (only our node processes can be there), deletes the namespaces (which deletes their veths,
//!   and every rule inside them), the bridge, and stops the relay.

use std::fs;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

use crate::fleet::redis_server::RedisServer;
use crate::fleet::servers::{pid_alive, spawn_detached, stop_pid, EtcdCluster, PgServer};
use crate::fleet::zk_server::ZkEnsemble;
use crate::fleet::{FleetSpec, FleetState};
use baton::config::NodeConfig;

/// The first two octets of every fleet subnet (`10.213.K.0/24`).
pub const SUBNET_BASE: [u8; 2] = [10, 213];
/// The iptables chain (inside a node namespace) that holds every fault rule.
pub const CHAIN: &str = "BATON-CHAOS";
/// The plan file in the fleet directory.
pub const NETNS_FILE: &str = "netns.json";
/// Host-wide lock while a subnet is picked and claimed.
const HOST_LOCK: &str = "/run/lock/baton-netns.lock";
/// First host octet of the node addresses (`n1` is `.11`).
const NODE_HOST_BASE: u8 = 10;

/// One node's namespace.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NsNode {
    pub id: String,
    /// `ip netns` name.
    pub ns: String,
    /// The root-namespace end of its veth (enslaved to the bridge).
    pub veth: String,
    pub ip: Ipv4Addr,
}

/// A fleet's namespaces, bridge and relay: recorded in `FleetState::netns`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NetnsFleet {
    /// Short random id shared by every name below.
    pub id: String,
    pub bridge: String,
    /// `10.213.K.0/24`.
    pub subnet: String,
    /// Root-namespace address on the bridge: the fenced PostgreSQL.
    pub gateway: Ipv4Addr,
    /// Second root-namespace address on the bridge: every election backend.
    pub election: Ipv4Addr,
    pub nodes: Vec<NsNode>,
    /// The relay process for servers that cannot listen on the bridge themselves.
    #[serde(default)]
    pub relay_pid: Option<u32>,
    /// When the relay started ([`crate::fleet::servers::start_ticks`]).
    #[serde(default)]
    pub relay_started_ticks: Option<u64>,
    /// Ports relayed from `election:port` to `127.0.0.1:port`.
    #[serde(default)]
    pub relayed_ports: Vec<u16>,
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs a command; its stdout, or an error with its stderr.
pub(crate) fn run(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("running {}", args[0]))?;
    if !out.status.success() {
        bail!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A `Command` that runs `program` inside namespace `ns` (`ip netns exec`: same pid afterwards).
pub fn command_in(ns: &str, program: &Path) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    c
}

/// Runs `f` on a fresh thread that has joined namespace `ns` (sockets it opens live there).
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || -> anyhow::Result<T> {
        let file = fs::File::open(&path).with_context(|| format!("opening {path}"))?;
        // SAFETY: setns on a namespace fd we hold; it changes only this (short-lived) thread.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            bail!("setns({path}): {}", std::io::Error::last_os_error());
        }
        Ok(f())
    })
    .join()
    .map_err(|_| anyhow!("namespace thread panicked"))?
}

/// The UDP datagrams namespace `ns` received and sent so far (`InDatagrams`, `OutDatagrams` of
/// `/proc/net/snmp` read inside it). In a node's namespace only its failure detector speaks
/// UDP, so these are the detector's packets; the counters outlive a restart of the node.
pub fn udp_datagrams(ns: &str) -> anyhow::Result<(u64, u64)> {
    let text = run(&["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"])?;
    parse_udp_snmp(&text).with_context(|| format!("no Udp counters in {ns}'s /proc/net/snmp"))
}

/// `(InDatagrams, OutDatagrams)` of the `Udp:` header and value lines of `/proc/net/snmp`.
pub fn parse_udp_snmp(text: &str) -> Option<(u64, u64)> {
    let mut lines = text.lines().filter(|l| l.starts_with("Udp: "));
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    let values: Vec<&str> = lines.next()?.split_whitespace().collect();
    let get = |name: &str| -> Option<u64> {
        let i = header.iter().position(|h| *h == name)?;
        values.get(i)?.parse().ok()
    };
    Some((get("InDatagrams")?, get("OutDatagrams")?))
}

/// What a TCP connect attempt saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Probe {
    Connected,
    Refused,
    /// No answer within the timeout: what a DROP rule looks like.
    TimedOut,
    Unreachable,
}

pub fn probe_here(addr: SocketAddr, timeout: Duration) -> Probe {
    match TcpStream::connect_timeout(&addr, timeout) {
        Ok(_) => Probe::Connected,
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Probe::Refused,
        Err(e) if e.kind() == ErrorKind::TimedOut || e.kind() == ErrorKind::WouldBlock => {
            Probe::TimedOut
        }
        Err(_) => Probe::Unreachable,
    }
}

/// A TCP connect to `addr` from inside `ns` (root namespace when `None`).
pub fn probe(ns: Option<&str>, addr: SocketAddr, timeout: Duration) -> anyhow::Result<Probe> {
    match ns {
        None => Ok(probe_here(addr, timeout)),
        Some(ns) => in_netns(ns, move || probe_here(addr, timeout)),
    }
}

/// Many probes at once (one thread each): `(ns, addr)` → result, in input order.
pub fn probe_all(
    probes: &[(Option<String>, SocketAddr)],
    timeout: Duration,
) -> Vec<anyhow::Result<Probe>> {
    let handles: Vec<_> = probes
        .iter()
        .cloned()
        .map(|(ns, addr)| std::thread::spawn(move || probe(ns.as_deref(), addr, timeout)))
        .collect();
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(anyhow!("probe thread panicked")))
        })
        .collect()
}

/// Exclusive host-wide lock (flock), released on drop.
struct HostLock(fs::File);

impl HostLock {
    fn acquire() -> anyhow::Result<HostLock> {
        let _ = fs::create_dir_all("/run/lock");
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(HOST_LOCK)
            .with_context(|| format!("opening {HOST_LOCK}"))?;
        // SAFETY: flock on an fd we own; blocks until the other `fleet up --netns` is done.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!("flock {HOST_LOCK}: {}", std::io::Error::last_os_error());
        }
        Ok(HostLock(f))
    }
}

impl Drop for HostLock {
    fn drop(&mut self) {
        // SAFETY: unlocking our own fd.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// The `10.213.K` prefixes already on some interface of the root namespace.
fn subnets_in_use() -> anyhow::Result<Vec<u8>> {
    let out = run(&["ip", "-o", "-4", "addr", "show"])?;
    let routes = run(&["ip", "-4", "route", "show"]).unwrap_or_default();
    let prefix = format!("{}.{}.", SUBNET_BASE[0], SUBNET_BASE[1]);
    let mut used = Vec::new();
    for text in [out, routes] {
        for word in text.split_whitespace() {
            if let Some(rest) = word.strip_prefix(&prefix) {
                if let Some(k) = rest.split('.').next().and_then(|k| k.parse::<u8>().ok()) {
                    used.push(k);
                }
            }
        }
    }
    Ok(used)
}

fn link_exists(name: &str) -> bool {
    Command::new("ip")
        .args(["link", "show", "dev", name])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Namespace names that exist now.
pub fn namespaces() -> Vec<String> {
    run(&["ip", "netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

impl NetnsFleet {
    /// Claims a subnet and creates the bridge and one namespace per node (`n1`..`nN`). On any
    /// failure, removes what it created.
    pub fn create(dir: &Path, nodes: usize) -> anyhow::Result<NetnsFleet> {
        if !is_root() {
            bail!("--netns needs root (ip netns, veth pairs, a bridge and iptables)");
        }
        if nodes == 0 || nodes > 200 {
            bail!("--netns supports 1..=200 nodes");
        }
        for bin in ["ip", "iptables"] {
            if run(&["which", bin]).is_err() {
                bail!("--netns needs `{bin}` (Debian packages iproute2, iptables)");
            }
        }
        let _lock = HostLock::acquire()?;
        let used = subnets_in_use()?;
        let k = (0..=255u8)
            .find(|k| !used.contains(k))
            .context("no free 10.213.K.0/24 subnet")?;
        let existing = namespaces();
        let id = loop {
            let seed = baton::clock::monotonic_ns() ^ ((std::process::id() as u64) << 20);
            let id = format!("{:06x}", (seed ^ (seed >> 24)) & 0xff_ffff);
            let bridge = format!("btn-{id}");
            if !link_exists(&bridge) && !existing.iter().any(|n| n.starts_with(&bridge)) {
                break id;
            }
        };
        let [a, b] = SUBNET_BASE;
        let plan = NetnsFleet {
            bridge: format!("btn-{id}"),
            subnet: format!("{a}.{b}.{k}.0/24"),
            gateway: Ipv4Addr::new(a, b, k, 1),
            election: Ipv4Addr::new(a, b, k, 2),
            nodes: (1..=nodes)
                .map(|i| NsNode {
                    id: format!("n{i}"),
                    ns: format!("btn-{id}-n{i}"),
                    veth: format!("btv{id}{i}"),
                    ip: Ipv4Addr::new(a, b, k, NODE_HOST_BASE + i as u8),
                })
                .collect(),
            id,
            relay_pid: None,
            relay_started_ticks: None,
            relayed_ports: Vec::new(),
        };
        plan.save_marker(dir)?;
        if let Err(e) = plan.build() {
            plan.teardown();
            let _ = fs::remove_file(dir.join(NETNS_FILE));
            return Err(e.context("creating the fleet's network namespaces"));
        }
        Ok(plan)
    }

    fn save_marker(&self, dir: &Path) -> anyhow::Result<()> {
        fs::write(dir.join(NETNS_FILE), serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", dir.join(NETNS_FILE).display()))
    }

    fn build(&self) -> anyhow::Result<()> {
        let br = self.bridge.as_str();
        run(&["ip", "link", "add", br, "type", "bridge"])?;
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", self.gateway),
            "dev",
            br,
        ])?;
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", self.election),
            "dev",
            br,
        ])?;
        run(&["ip", "link", "set", br, "up"])?;
        for n in &self.nodes {
            run(&["ip", "netns", "add", &n.ns])?;
            run(&[
                "ip", "link", "add", &n.veth, "type", "veth", "peer", "name", "eth0", "netns",
                &n.ns,
            ])?;
            run(&["ip", "link", "set", &n.veth, "master", br])?;
            run(&["ip", "link", "set", &n.veth, "up"])?;
            run(&["ip", "-n", &n.ns, "link", "set", "lo", "up"])?;
            run(&[
                "ip",
                "-n",
                &n.ns,
                "addr",
                "add",
                &format!("{}/24", n.ip),
                "dev",
                "eth0",
            ])?;
            run(&["ip", "-n", &n.ns, "link", "set", "eth0", "up"])?;
        }
        Ok(())
    }

    /// Removes everything [`NetnsFleet::create`] and [`NetnsFleet::attach_servers`] made.
    /// Idempotent; returns what could not be removed (empty when clean).
    pub fn teardown(&self) -> Vec<String> {
        if let Some(pid) = self.relay_pid {
            stop_pid(pid, libc::SIGTERM, Duration::from_secs(2));
        }
        let existing = namespaces();
        for n in &self.nodes {
            if existing.contains(&n.ns) {
                // Only our node processes can be inside; a stopped one needs SIGCONT to die fast.
                let pids = run(&["ip", "netns", "pids", &n.ns]).unwrap_or_default();
                for pid in pids
                    .split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok())
                {
                    // SAFETY: kill(2) on a process inside a namespace we created.
                    unsafe {
                        libc::kill(pid as i32, libc::SIGCONT);
                    }
                    stop_pid(pid, libc::SIGKILL, Duration::from_secs(2));
                }
                let _ = run(&["ip", "netns", "del", &n.ns]);
            }
            if link_exists(&n.veth) {
                let _ = run(&["ip", "link", "del", &n.veth]);
            }
        }
        if link_exists(&self.bridge) {
            let _ = run(&["ip", "link", "del", &self.bridge]);
        }
        self.leftovers()
    }

    /// Namespaces and links of this fleet that still exist.
    pub fn leftovers(&self) -> Vec<String> {
        let existing = namespaces();
        let mut left = Vec::new();
        for n in &self.nodes {
            if existing.contains(&n.ns) {
                left.push(format!("netns {}", n.ns));
            }
            if link_exists(&n.veth) {
                left.push(format!("link {}", n.veth));
            }
        }
        if link_exists(&self.bridge) {
            left.push(format!("link {}", self.bridge));
        }
        if self.relay_pid.is_some_and(pid_alive) {
            left.push(format!("relay pid {}", self.relay_pid.unwrap_or(0)));
        }
        left
    }

    pub fn node(&self, id: &str) -> anyhow::Result<&NsNode> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .with_context(|| format!("node {id:?} has no namespace"))
    }

    pub fn ns_of(&self, id: &str) -> Option<&str> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .map(|n| n.ns.as_str())
    }

    /// The addresses PostgreSQL listens on besides 127.0.0.1: the gateway (resource) and the
    /// election address (the `pg-lease` lease connection).
    pub fn pg_listen(&self) -> Vec<IpAddr> {
        vec![IpAddr::V4(self.gateway), IpAddr::V4(self.election)]
    }

    /// Starts the relay for servers that listen on loopback only (Redis, ZooKeeper clients).
    pub fn attach_servers(
        &mut self,
        dir: &Path,
        redis: Option<&RedisServer>,
        zk: Option<&ZkEnsemble>,
    ) -> anyhow::Result<()> {
        let mut ports: Vec<u16> = redis.iter().map(|r| r.port).collect();
        if let Some(z) = zk {
            ports.extend(z.members.iter().map(|m| m.client_port));
        }
        if ports.is_empty() {
            return Ok(());
        }
        let exe = std::env::current_exe().context("locating the baton binary")?;
        let mut cmd = Command::new(exe);
        cmd.args(["chaos", "relay"]);
        for p in &ports {
            cmd.arg("--pair")
                .arg(format!("{}:{p}={}:{p}", self.election, Ipv4Addr::LOCALHOST));
        }
        let log = dir.join("netns-relay.log");
        let pid = spawn_detached(&mut cmd, &log)?;
        self.relay_pid = Some(pid);
        self.relay_started_ticks = crate::fleet::servers::spawned_ticks(pid);
        self.relayed_ports = ports.clone();
        self.save_marker(dir)?;
        let until = Instant::now() + Duration::from_secs(10);
        for p in ports {
            let addr = SocketAddr::from((self.election, p));
            while probe_here(addr, Duration::from_millis(300)) != Probe::Connected {
                if !pid_alive(pid) || Instant::now() > until {
                    bail!("the relay did not come up on {addr}; see {}", log.display());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// `addr` (a loopback `host:port` the fleet wrote for node `id`) as node `id`'s namespace
    /// address, same port.
    fn addr_in_namespace(&self, id: &str, addr: &str) -> anyhow::Result<String> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.id == id)
            .with_context(|| format!("member {id} has no namespace"))?;
        let port: u16 = addr
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .with_context(|| format!("member {id}: no port in {addr:?}"))?;
        Ok(format!("{}:{port}", node.ip))
    }

    /// Rewrites node `index`'s (0-based) config so it listens on its namespace address and
    /// reaches every server through the bridge.
    #[allow(clippy::too_many_arguments)]
    pub fn node_config(
        &self,
        index: usize,
        cfg: &mut NodeConfig,
        http_ports: &[u16],
        peer_ports: &[u16],
        postgres: &PgServer,
        etcd: Option<&EtcdCluster>,
        redis: Option<&RedisServer>,
        zk: Option<&ZkEnsemble>,
    ) -> anyhow::Result<()> {
        let me = self
            .nodes
            .get(index)
            .context("more nodes than namespaces")?;
        let port = http_ports[index];
        cfg.http_listen = SocketAddr::from((me.ip, port));
        cfg.advertise_addr = Some(format!("{}:{port}", me.ip));
        cfg.resource.database_url =
            postgres.url_as(&baton::work::fence::node_role(&cfg.node_id), self.gateway);
        if let Some(e) = etcd {
            cfg.etcd.endpoints = e
                .members
                .iter()
                .map(|m| format!("http://{}:{}", self.election, m.client_port))
                .collect();
        }
        if let Some(r) = redis {
            cfg.redis.url = format!("redis://{}:{}/", self.election, r.port);
        }
        if let Some(z) = zk {
            cfg.zk.connect = z
                .members
                .iter()
                .map(|m| format!("{}:{}", self.election, m.client_port))
                .collect::<Vec<_>>()
                .join(",");
        }
        for peer in cfg.raft.peers.iter_mut() {
            let i = self
                .nodes
                .iter()
                .position(|n| n.id == peer.id)
                .with_context(|| format!("raft peer {} has no namespace", peer.id))?;
            peer.addr = format!("{}:{}", self.nodes[i].ip, http_ports[i]);
            if let Some(pp) = peer_ports.get(i) {
                peer.peer_addr = format!("{}:{pp}", self.nodes[i].ip);
            }
        }
        if let Some(pp) = peer_ports.get(index) {
            cfg.raft.peer_listen = Some(SocketAddr::from((me.ip, *pp)));
        }
        // Every other list of fleet addresses must name the namespaces too: inside a namespace
        // 127.0.0.1 is the node itself (and not even its listener, which is on `me.ip`), so a
        // member list left on loopback makes each node see the fleet as dead and seek every
        // shard alone; a detector peer list left on loopback probes nobody.
        for member in cfg.shards.members.iter_mut() {
            member.addr = self.addr_in_namespace(&member.id, &member.addr)?;
        }
        for peer in cfg.detector.peers.iter_mut() {
            peer.addr = self.addr_in_namespace(&peer.id, &peer.addr)?;
        }
        if cfg.backend == baton::backends::BackendKind::PgLease {
            cfg.pg_lease.database_url =
                postgres.url_as(baton::backends::pg_lease::LEASE_ROLE, self.election);
        }
        Ok(())
    }
}

/// Tears the namespaces down on drop unless disarmed: a failed or interrupted `fleet up`.
pub struct NetnsGuard {
    fleet: Option<NetnsFleet>,
    dir: PathBuf,
    armed: bool,
}

impl NetnsGuard {
    pub fn new(dir: &Path, fleet: Option<NetnsFleet>) -> NetnsGuard {
        NetnsGuard {
            fleet,
            dir: dir.to_owned(),
            armed: true,
        }
    }
    pub fn get(&self) -> Option<&NetnsFleet> {
        self.fleet.as_ref()
    }
    pub fn get_mut(&mut self) -> Option<&mut NetnsFleet> {
        self.fleet.as_mut()
    }
    /// PostgreSQL's extra listen addresses (none without namespaces).
    pub fn pg_listen(&self) -> Vec<IpAddr> {
        self.fleet
            .as_ref()
            .map(NetnsFleet::pg_listen)
            .unwrap_or_default()
    }
    /// The election address servers listen on (none without namespaces).
    pub fn election_ip(&self) -> Option<IpAddr> {
        self.fleet.as_ref().map(|f| IpAddr::V4(f.election))
    }
    pub fn attach_servers(
        &mut self,
        redis: Option<&RedisServer>,
        zk: Option<&ZkEnsemble>,
    ) -> anyhow::Result<()> {
        let dir = self.dir.clone();
        match self.fleet.as_mut() {
            Some(f) => f.attach_servers(&dir, redis, zk),
            None => Ok(()),
        }
    }
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if self.armed {
            if let Some(f) = &self.fleet {
                let left = f.teardown();
                if left.is_empty() {
                    let _ = fs::remove_file(self.dir.join(NETNS_FILE));
                } else {
                    eprintln!("baton: could not remove {left:?} (see `ip netns list`, `ip link`)");
                }
            }
        }
    }
}

/// Removes the namespaces recorded in a fleet directory (`netns.json`), e.g. after a crash
/// during `fleet up`. Returns what is left.
pub fn cleanup_dir(dir: &Path) -> anyhow::Result<Vec<String>> {
    let path = dir.join(NETNS_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let f: NetnsFleet =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let left = f.teardown();
    if left.is_empty() {
        let _ = fs::remove_file(&path);
    }
    Ok(left)
}

/// `fleet up --netns` for the CLI. On Ctrl-C it lets the start-up finish (so every server it
/// started is recorded), then stops the whole fleet and removes its namespaces. (A library caller
/// that drops the `up` future still gets the namespaces removed, by [`NetnsGuard`].)
pub async fn up_interruptible(spec: &FleetSpec) -> anyhow::Result<FleetState> {
    let up = crate::fleet::up_netns(spec);
    tokio::pin!(up);
    tokio::select! {
        r = &mut up => r,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("interrupted: finishing start-up, then stopping everything it started...");
            let started = up.await;
            let dir = spec.dir.clone();
            let left = tokio::task::spawn_blocking(move || {
                if let Ok(state) = started {
                    state.down();
                }
                cleanup_dir(&dir)
            })
            .await??;
            if !left.is_empty() {
                bail!("interrupted; could not remove {left:?}");
            }
            bail!("interrupted: the fleet was stopped and its namespaces removed")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_udp_snmp;

    #[test]
    fn udp_counters_come_from_the_udp_lines_not_udplite() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
            Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
            Udp: 75075 2995 0 78092 0 0\n\
            UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
            UdpLite: 1 2 3 4 5 6\n";
        assert_eq!(parse_udp_snmp(text), Some((75075, 78092)));
        assert_eq!(parse_udp_snmp("Udp: InDatagrams\nUdp: 3\n"), None);
        assert_eq!(parse_udp_snmp(""), None);
    }
}
