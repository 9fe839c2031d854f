//! The faults: kill, partition and pause the leader; skew one node's clock. Each is *verified as
//! applied* before it counts and is *always undone* — by a guard whose `Drop` heals, so an error,
//! a panic or a cancelled future (Ctrl-C in the CLI) heals too.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

use crate::fleet::client::NodeClient;
use crate::fleet::netns::{probe_all, run, NetnsFleet, Probe, CHAIN};
use crate::fleet::servers::{pid_alive, stop_pid, PgServer};
use crate::fleet::{current_leader, FleetNode, FleetState};
use baton::backends::BackendKind;
use baton::clock::monotonic_ns;

/// What one fault did, on the machine's monotonic clock (`baton::clock::monotonic_ns`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FaultReport {
    /// `kill-leader`, `partition-leader`, `gc-pause-leader`, `skew`.
    pub fault: String,
    pub node: String,
    /// When the fault took effect (after the rule insert / signal returned).
    pub applied_at_mono_ns: u64,
    /// When it was undone (0 for faults that are not undone, e.g. kill).
    pub healed_at_mono_ns: u64,
    /// The fault was observed in effect, and observed undone.
    pub verified: bool,
    pub detail: String,
}

/// How long a probe waits for a TCP handshake; a DROP shows up as a timeout.
const PROBE_TIMEOUT: Duration = Duration::from_millis(400);
/// How long to wait for a leader to exist before a fault on "the leader".
const FIND_LEADER_WITHIN: Duration = Duration::from_secs(15);

/// `kill -9` of the current leader; returns its id once the process is gone.
pub async fn kill_leader(state: &FleetState) -> anyhow::Result<String> {
    Ok(kill_leader_report(state).await?.node)
}

/// [`kill_leader`] with a report (`healed_at_mono_ns` = 0: a kill is not undone).
pub async fn kill_leader_report(state: &FleetState) -> anyhow::Result<FaultReport> {
    let (leader, token) = current_leader(state, FIND_LEADER_WITHIN).await?;
    let pid = leader.pid;
    // SAFETY: kill(2) on the node pid the fleet started.
    if unsafe { libc::kill(pid as i32, libc::SIGKILL) } != 0 {
        bail!(
            "kill -9 {pid} ({}): {}",
            leader.id,
            std::io::Error::last_os_error()
        );
    }
    let applied = monotonic_ns();
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while pid_alive(pid) {
        if std::time::Instant::now() > until {
            bail!("{} (pid {pid}) still alive 5 s after SIGKILL", leader.id);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(FaultReport {
        fault: "kill-leader".into(),
        node: leader.id.clone(),
        applied_at_mono_ns: applied,
        healed_at_mono_ns: 0,
        verified: true,
        detail: format!("SIGKILL pid {pid} (token {token}); process gone"),
    })
}

// ---------------------------------------------------------------- pg-promote

/// What the resource's server held at one moment: the fence's highest accepted token, the
/// ledger's highest committed seq, and (pg-lease, whose lease store is the same server) the
/// highest lease epoch. Read on the primary just before its kill and on the standby once it
/// has replayed what it received, just before its promotion: a value that went back is what the
/// promotion lost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreMarks {
    pub max_token: i64,
    pub max_seq: i64,
    /// `None`: no lease table on this server (not pg-lease).
    pub epoch: Option<i64>,
}

impl std::fmt::Display for StoreMarks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "max_token {}, seq {}", self.max_token, self.max_seq)?;
        if let Some(e) = self.epoch {
            write!(f, ", epoch {e}")?;
        }
        Ok(())
    }
}

/// [`StoreMarks`] of `pg` (blocking: psql).
pub fn store_marks(pg: &PgServer, lease_store: bool) -> anyhow::Result<StoreMarks> {
    let row = pg.psql(
        "baton",
        "SELECT (SELECT coalesce(max(max_token), 0) FROM baton.fenced_resource) || ' ' || \
                (SELECT coalesce(max(seq_hi), 0) FROM baton.fence_log)",
    )?;
    let mut it = row.split_whitespace().map(|v| v.parse::<i64>());
    let (Some(Ok(max_token)), Some(Ok(max_seq))) = (it.next(), it.next()) else {
        bail!("fence marks: unexpected answer {row:?}");
    };
    let epoch = if lease_store {
        let e = pg.psql(
            "baton",
            "SELECT coalesce(max(epoch), 0) FROM baton_lease.leases",
        )?;
        Some(
            e.trim()
                .parse()
                .with_context(|| format!("lease epoch {e:?}"))?,
        )
    } else {
        None
    };
    Ok(StoreMarks {
        max_token,
        max_seq,
        epoch,
    })
}

/// The standby's marks once it has replayed all the WAL it received (its primary is dead: no
/// more comes), read before its promotion: what the promoted server starts from. After the
/// promotion the nodes' first writes would already be in them.
fn replayed_marks(standby: &PgServer, lease_store: bool) -> anyhow::Result<StoreMarks> {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let done = standby.psql(
            "postgres",
            "SELECT pg_last_wal_receive_lsn() IS NULL \
                 OR pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()",
        )?;
        if done.trim() == "t" || std::time::Instant::now() > until {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    store_marks(standby, lease_store).context("the standby's marks before its promotion")
}

/// What [`pg_promote_lagging`] did, besides its report.
#[derive(Clone, Debug)]
pub struct PromoteOutcome {
    pub report: FaultReport,
    /// The primary's marks just before its kill, the standby's just before its promotion.
    pub before: StoreMarks,
    pub after: StoreMarks,
}

/// `kill -9` of the fenced resource's PostgreSQL primary, then `pg_ctl promote` of its standby
/// (`fleet up --resource-standby`). The old primary is not brought back: the promoted standby
/// becomes the fleet's `postgres` in its state file (so the fleet's tools and checkers read the
/// new primary), and the fleet has no standby until it is started again.
pub async fn pg_promote(state: &mut FleetState) -> anyhow::Result<FaultReport> {
    Ok(pg_promote_lagging(state, Duration::ZERO, false)
        .await?
        .report)
}

/// How long a hand-over during the lag may take to show a new leader.
const HANDOVER_WITHIN: Duration = Duration::from_secs(5);

/// [`pg_promote`], the standby made to lag first: the primary's WAL sender is stopped (SIGSTOP)
/// for `lag`, then the primary killed (its stopped sender with it) and the standby promoted. An
/// asynchronous standby's primary went on acknowledging commits it never sent (on loopback a
/// standby is otherwise never more than a few commits behind); a synchronous one's made them
/// wait. The sender, not the standby's receiver, is stopped: WAL already sent to a stopped
/// receiver waits in its socket, and the receiver would still write it after the kill (a first
/// version did that, and lost nothing).
///
/// With `handover`, halfway through the lag the leader is asked to step down (`POST
/// /stepdown`) and the lag lasts until a new leader (a higher token) serves, at most
/// [`HANDOVER_WITHIN`] more: a term change the standby never sees (on pg-lease, a lease epoch
/// and a fence claim only the dying primary has). Without a lag it does nothing.
///
/// The fence's and the lease store's marks are read on the primary just before the kill and on
/// the standby once it has replayed what it received, before `pg_ctl promote`.
pub async fn pg_promote_lagging(
    state: &mut FleetState,
    lag: Duration,
    handover: bool,
) -> anyhow::Result<PromoteOutcome> {
    let Some(standby) = state.postgres_standby.clone() else {
        bail!("pg-promote needs a fleet started with --resource-standby");
    };
    let primary = state.postgres.clone();
    let lease_store = state.backend == BackendKind::PgLease;
    let mut stopped = Vec::new();
    let mut lag_note = String::new();
    if !lag.is_zero() {
        let senders = primary.children_named("walsender");
        if senders.is_empty() {
            bail!("the primary has no WAL sender to stop (is the standby streaming?)");
        }
        // Continued however this ends before the kill (an error or a cancelled future).
        for &p in &senders {
            stopped.push(StoppedProcess::stop(p)?);
        }
        let stopped_at = std::time::Instant::now();
        if handover {
            tokio::time::sleep(lag / 2).await;
            let (leader, token) = current_leader(state, Duration::from_secs(5)).await?;
            // Bounded by the lag: on a synchronous standby the step-down's release waits for the
            // stopped sender like every commit, and the fault goes on without its answer.
            let client = state.admin_client(lag.max(Duration::from_millis(500)));
            let answer = match crate::fleet::client::post_stepdown(&client, &leader, None).await {
                Ok(r) => r.status.to_string(),
                Err(e) => format!("no answer: {e:#}"),
            };
            let until = std::time::Instant::now() + HANDOVER_WITHIN;
            let mut new = None;
            while std::time::Instant::now() < until {
                if let Ok((n, t)) = current_leader(state, Duration::from_millis(500)).await {
                    if t > token {
                        new = Some((n.id, t));
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            lag_note = match new {
                Some((id, t)) => format!(
                    "during the lag {} (token {token}) stepped down ({answer}), {id} leads with token {t}; ",
                    leader.id
                ),
                None => format!(
                    "during the lag {} (token {token}) stepped down ({answer}), no new leader within {HANDOVER_WITHIN:?}; ",
                    leader.id
                ),
            };
            let rest = lag.saturating_sub(stopped_at.elapsed());
            tokio::time::sleep(rest).await;
        } else {
            tokio::time::sleep(lag).await;
        }
        lag_note = format!(
            "the primary's WAL sender (pid {senders:?}) stopped {} ms before the kill; {lag_note}",
            stopped_at.elapsed().as_millis()
        );
    }
    let (killed, applied, promoted, before, after) = tokio::task::spawn_blocking(move || {
        let before =
            store_marks(&primary, lease_store).context("the primary's marks before its kill")?;
        let killed = primary.kill9()?;
        let applied = monotonic_ns();
        // Dead with the primary: nothing to continue.
        stopped.into_iter().for_each(std::mem::forget);
        let after = replayed_marks(&standby, lease_store)?;
        standby.promote()?;
        let promoted = monotonic_ns();
        anyhow::Ok((killed, applied, promoted, before, after))
    })
    .await??;
    let old_port = state.postgres.port;
    state.postgres = state.postgres_standby.take().expect("checked above");
    state.save()?;
    let report = FaultReport {
        fault: "pg-promote".into(),
        node: format!("postgres:{old_port}"),
        applied_at_mono_ns: applied,
        healed_at_mono_ns: promoted,
        verified: true,
        detail: format!(
            "{lag_note}SIGKILL of the primary on port {old_port} ({} processes); the standby on port {} promoted after {:.0} ms and is the fleet's postgres now; the primary before the kill: {before}; the standby before its promotion: {after}",
            killed.len(),
            state.postgres.port,
            (promoted - applied) as f64 / 1e6
        ),
    };
    Ok(PromoteOutcome {
        report,
        before,
        after,
    })
}

/// A process stopped with SIGSTOP, continued (SIGCONT) when dropped (on error, or when the
/// future holding it is dropped). `mem::forget` it for a process that died stopped.
struct StoppedProcess(u32);

impl StoppedProcess {
    fn stop(pid: u32) -> anyhow::Result<StoppedProcess> {
        // SAFETY: kill(2) on a process of a server the fleet started.
        if unsafe { libc::kill(pid as i32, libc::SIGSTOP) } != 0 {
            bail!("SIGSTOP {pid}: {}", std::io::Error::last_os_error());
        }
        Ok(StoppedProcess(pid))
    }

    /// Continues it now.
    fn cont(self) {
        drop(self);
    }
}

impl Drop for StoppedProcess {
    fn drop(&mut self) {
        // SAFETY: as above; continuing a process we stopped.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

// ---------------------------------------------------------------- sentinel-failover

/// How long the Sentinels get to name a new primary (down-after 1 s, then the vote and the
/// promotion; a failover of the same master within twice the failover timeout waits that out).
const SENTINEL_NAMES_WITHIN: Duration = Duration::from_secs(30);

/// `kill -9` of the fleet's Redis primary (`fleet up --redis-topology sentinel`); returns when
/// the Sentinels name the replica as the new primary. The old primary is then started again,
/// empty, as the new primary's replica, and the two swap places in the state file, so the fault
/// can be repeated. The replica is whatever it had received: replication is asynchronous, so
/// the last writes (the token counter's `INCR`s among them) may be lost.
pub async fn sentinel_failover(state: &mut FleetState) -> anyhow::Result<FaultReport> {
    let (Some(mut set), Some(mut primary)) = (state.redis_sentinel.clone(), state.redis.clone())
    else {
        bail!("sentinel-failover needs a fleet started with --redis-topology sentinel");
    };
    // The Sentinels may have failed over on their own since the state file was written (a
    // primary that did not answer them within down-after: 1 s, which a loaded 2-core machine
    // can miss). Their word is what the nodes follow: the state takes it first, and the report
    // says so.
    let named = {
        let set = set.clone();
        tokio::task::spawn_blocking(move || set.named_primary()).await?
    };
    let mut before = String::new();
    if named == Some(set.replica.port) {
        before = format!(
            "the Sentinels had already failed over on their own ({} -> {}); ",
            primary.port, set.replica.port
        );
        std::mem::swap(&mut primary, &mut set.replica);
        primary.replica_of = None;
        set.replica.replica_of = Some(primary.port);
        state.redis = Some(primary.clone());
        state.redis_sentinel = Some(set.clone());
        state.save()?;
    } else if named != Some(primary.port) {
        bail!(
            "the Sentinels name {named:?} as the primary, the fleet's state file says {} (replica {}): run `baton fleet status` and look at the Redis logs under the fleet's directory",
            primary.port,
            set.replica.port
        );
    }
    let (named, applied, named_at, mut old, new, in_sync) =
        tokio::task::spawn_blocking(move || {
            let named = Some(primary.port);
            stop_pid(primary.pid, libc::SIGKILL, Duration::from_secs(5));
            if pid_alive(primary.pid) {
                bail!("the Redis primary (pid {}) survived SIGKILL", primary.pid);
            }
            let applied = monotonic_ns();
            let until = std::time::Instant::now() + SENTINEL_NAMES_WITHIN;
            while set.named_primary() != Some(set.replica.port) {
                if std::time::Instant::now() > until {
                    bail!(
                        "the Sentinels did not name the replica (port {}) within {SENTINEL_NAMES_WITHIN:?} of the primary's kill; the first Sentinel's log: {}",
                        set.replica.port,
                        set.sentinels[0].log().display()
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let named_at = monotonic_ns();
            // Until every Sentinel names it (they converge through each other's hellos): the
            // next fault, or a node's next lookup, then hears the same answer from any of them.
            let agreed_by = std::time::Instant::now() + Duration::from_secs(10);
            while !set.all_name(set.replica.port) && std::time::Instant::now() < agreed_by {
                std::thread::sleep(Duration::from_millis(50));
            }
            let mut new = set.replica.clone();
            new.replica_of = None;
            let mut old = primary;
            old.restart_as_replica_of(new.port)?;
            // Ready for the next failover (a replica that never synced could not take over).
            let in_sync = old.wait_replica_in_sync(Duration::from_secs(15)).is_ok();
            anyhow::Ok((named, applied, named_at, old, new, in_sync))
        })
        .await??;
    let (old_port, new_port) = (old.port, new.port);
    old.replica_of = Some(new_port);
    state.redis = Some(new);
    if let Some(set) = &mut state.redis_sentinel {
        set.replica = old;
    }
    state.save()?;
    Ok(FaultReport {
        fault: "sentinel-failover".into(),
        node: format!("redis:{}", named.unwrap_or(old_port)),
        applied_at_mono_ns: applied,
        healed_at_mono_ns: named_at,
        verified: true,
        detail: format!(
            "{before}SIGKILL of the Redis primary on port {old_port}; the Sentinels named the replica on port {new_port} after {:.0} ms; the old primary runs again as its replica ({})",
            (named_at - applied) as f64 / 1e6,
            if in_sync { "in sync" } else { "not yet in sync after 15 s" }
        ),
    })
}

// ---------------------------------------------------------------- partition

/// One DROP target: a host, or only one TCP port of it (PostgreSQL shares the gateway address
/// with the clients' path into the namespace, so the resource is cut by port).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CutHost {
    pub ip: Ipv4Addr,
    pub tcp_port: Option<u16>,
}

impl std::fmt::Display for CutHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.tcp_port {
            Some(p) => write!(f, "{}:{p}/tcp", self.ip),
            None => write!(f, "{}", self.ip),
        }
    }
}

/// What a partition cuts the node from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum CutTarget {
    /// Its election backend (raft: its peers); the resource stays reachable.
    Backend,
    /// The fenced PostgreSQL only; the election backend stays reachable.
    Resource,
    /// Both.
    Both,
}

/// Inserts the fault rules in `ns`: DROP every packet to or from `hosts`.
fn apply_rules(ns: &str, hosts: &[CutHost]) -> anyhow::Result<()> {
    let ipt = |args: &[&str]| {
        let mut full = vec!["ip", "netns", "exec", ns, "iptables", "-w"];
        full.extend_from_slice(args);
        run(&full)
    };
    // A leftover chain from an interrupted run is reused, flushed.
    if ipt(&["-N", CHAIN]).is_err() {
        ipt(&["-F", CHAIN])?;
    }
    for h in hosts {
        let ip = h.ip.to_string();
        match h.tcp_port {
            Some(port) => {
                let port = port.to_string();
                ipt(&[
                    "-A", CHAIN, "-p", "tcp", "-d", &ip, "--dport", &port, "-j", "DROP",
                ])?;
                ipt(&[
                    "-A", CHAIN, "-p", "tcp", "-s", &ip, "--sport", &port, "-j", "DROP",
                ])?;
            }
            None => {
                ipt(&["-A", CHAIN, "-d", &ip, "-j", "DROP"])?;
                ipt(&["-A", CHAIN, "-s", &ip, "-j", "DROP"])?;
            }
        }
    }
    for hook in ["INPUT", "OUTPUT"] {
        if ipt(&["-C", hook, "-j", CHAIN]).is_err() {
            ipt(&["-I", hook, "1", "-j", CHAIN])?;
        }
    }
    Ok(())
}

/// Removes every baton rule from `ns`; true when none is left.
pub fn remove_rules(ns: &str) -> bool {
    let ipt = |args: &[&str]| {
        let mut full = vec!["ip", "netns", "exec", ns, "iptables", "-w"];
        full.extend_from_slice(args);
        run(&full)
    };
    for hook in ["INPUT", "OUTPUT"] {
        let mut guard = 0;
        while ipt(&["-D", hook, "-j", CHAIN]).is_ok() && guard < 16 {
            guard += 1;
        }
    }
    let _ = ipt(&["-F", CHAIN]);
    let _ = ipt(&["-X", CHAIN]);
    !has_rules(ns)
}

/// Whether `ns` holds any baton rule.
pub fn has_rules(ns: &str) -> bool {
    run(&["ip", "netns", "exec", ns, "iptables", "-w", "-S"])
        .map(|s| s.contains(CHAIN))
        .unwrap_or(false)
}

/// Heals on drop unless already healed.
struct RulesGuard {
    ns: String,
    active: bool,
}

impl RulesGuard {
    fn heal(&mut self) -> bool {
        self.active = false;
        remove_rules(&self.ns)
    }
}

impl Drop for RulesGuard {
    fn drop(&mut self) {
        if self.active && !remove_rules(&self.ns) {
            eprintln!(
                "baton chaos: could not remove the rules in {}; run `baton chaos heal`",
                self.ns
            );
        }
    }
}

/// What a partition of `node` cuts: the hosts to DROP, the TCP endpoints that must become
/// unreachable from inside its namespace (and, for raft, from the peers' namespaces), and the
/// fenced PostgreSQL that must stay reachable.
struct CutPlan {
    hosts: Vec<CutHost>,
    /// `(from namespace, to)`: must time out while cut, connect when healed.
    cut: Vec<(Option<String>, SocketAddr)>,
    /// `(from namespace, to)`: must connect throughout (resource, clients).
    kept: Vec<(Option<String>, SocketAddr)>,
    what: String,
}

/// A raft node's peer listener address (fleets from before it existed used the client port).
fn peer_listener(node: &FleetNode) -> anyhow::Result<SocketAddr> {
    let addr = node.peer_addr.as_deref().unwrap_or(&node.http_addr);
    addr.parse()
        .with_context(|| format!("{}'s peer address {addr}", node.id))
}

fn cut_plan(
    state: &FleetState,
    net: &NetnsFleet,
    node: &FleetNode,
    target: CutTarget,
) -> anyhow::Result<CutPlan> {
    let backend = backend_cut_plan(state, net, node)?;
    let me = net.node(&node.id)?;
    let pg = SocketAddr::from((net.gateway, state.postgres.port));
    let resource = CutHost {
        ip: net.gateway,
        tcp_port: Some(state.postgres.port),
    };
    let ns = Some(me.ns.clone());
    Ok(match target {
        CutTarget::Backend => backend,
        CutTarget::Resource => CutPlan {
            hosts: vec![resource],
            cut: vec![(ns, pg)],
            // Clients still reach it; the backend is not probed (it stays reachable by design).
            kept: backend.kept.into_iter().filter(|k| k.1 != pg).collect(),
            what: format!("the fenced PostgreSQL ({pg})"),
        },
        CutTarget::Both => CutPlan {
            hosts: backend.hosts.into_iter().chain([resource]).collect(),
            cut: backend.cut.into_iter().chain([(ns, pg)]).collect(),
            kept: backend.kept.into_iter().filter(|k| k.1 != pg).collect(),
            what: format!("{} and the fenced PostgreSQL ({pg})", backend.what),
        },
    })
}

/// The backend partition: election backend (raft: peers) cut, resource and clients kept.
fn backend_cut_plan(
    state: &FleetState,
    net: &NetnsFleet,
    node: &FleetNode,
) -> anyhow::Result<CutPlan> {
    let me = net.node(&node.id)?;
    let ns = Some(me.ns.clone());
    let el = net.election;
    let pg = SocketAddr::from((net.gateway, state.postgres.port));
    let my_http: SocketAddr = node
        .http_addr
        .parse()
        .with_context(|| format!("{}'s address {}", node.id, node.http_addr))?;
    let mut kept = vec![(ns.clone(), pg), (None, my_http)];
    let (hosts, cut, what) = match state.backend {
        BackendKind::Raft => {
            let mut cut = Vec::new();
            let mut hosts = Vec::new();
            for peer in state.nodes.iter().filter(|n| n.id != node.id) {
                let p = net.node(&peer.id)?;
                hosts.push(p.ip);
                if pid_alive(peer.pid) {
                    // Raft traffic goes between the peer listeners, not the client ports.
                    let theirs: SocketAddr = peer_listener(peer)?;
                    let mine: SocketAddr = peer_listener(node)?;
                    cut.push((ns.clone(), theirs));
                    cut.push((Some(p.ns.clone()), mine));
                }
            }
            (hosts, cut, "its raft peers".to_string())
        }
        BackendKind::Etcd => {
            let e = state.etcd.as_ref().context("etcd fleet without etcd")?;
            let cut = e
                .members
                .iter()
                .map(|m| (ns.clone(), SocketAddr::from((el, m.client_port))))
                .collect();
            (vec![el], cut, format!("etcd ({el})"))
        }
        BackendKind::Redis | BackendKind::RedisNaive => {
            let r = state.redis.as_ref().context("redis fleet without redis")?;
            let addr = SocketAddr::from((el, r.port));
            (
                vec![el],
                vec![(ns.clone(), addr)],
                format!("redis ({addr})"),
            )
        }
        BackendKind::Zk => {
            let z = state.zk.as_ref().context("zk fleet without ZooKeeper")?;
            let cut = z
                .members
                .iter()
                .map(|m| (ns.clone(), SocketAddr::from((el, m.client_port))))
                .collect();
            (vec![el], cut, format!("ZooKeeper ({el})"))
        }
        BackendKind::PgLease => {
            let addr = SocketAddr::from((el, state.postgres.port));
            (
                vec![el],
                vec![(ns.clone(), addr)],
                format!("the lease connection to PostgreSQL ({addr}; the resource stays on {pg})"),
            )
        }
        BackendKind::Custom => anyhow::bail!("no partition plan for a custom backend"),
    };
    // Clients from the root namespace keep reaching the node (that is the point).
    kept.dedup();
    Ok(CutPlan {
        hosts: hosts
            .into_iter()
            .map(|ip| CutHost { ip, tcp_port: None })
            .collect(),
        cut,
        kept,
        what,
    })
}

fn describe(probes: &[(Option<String>, SocketAddr)], results: &[anyhow::Result<Probe>]) -> String {
    probes
        .iter()
        .zip(results)
        .map(|((ns, addr), r)| {
            format!(
                "{}->{addr}:{}",
                ns.as_deref().unwrap_or("root"),
                match r {
                    Ok(p) => format!("{p:?}"),
                    Err(e) => format!("error({e})"),
                }
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs the probes until `cut` all time out (or all connect, when `want_cut` is false) and
/// `kept` all connect, for up to `within`. Returns the last observation and whether it held.
async fn verify(plan: &CutPlan, want_cut: bool, within: Duration) -> (bool, String) {
    let until = tokio::time::Instant::now() + within;
    loop {
        let all: Vec<_> = plan.cut.iter().chain(plan.kept.iter()).cloned().collect();
        let all2 = all.clone();
        let results = tokio::task::spawn_blocking(move || probe_all(&all2, PROBE_TIMEOUT))
            .await
            .unwrap_or_else(|_| vec![]);
        let n_cut = plan.cut.len();
        let ok = results.len() == all.len()
            && results.iter().enumerate().all(|(i, r)| {
                let want = if i < n_cut && want_cut {
                    Probe::TimedOut
                } else {
                    Probe::Connected
                };
                matches!(r, Ok(p) if *p == want)
            });
        let text = describe(&all, &results);
        if ok || tokio::time::Instant::now() > until {
            return (ok, text);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn require_netns<'a>(state: &'a FleetState, fault: &str) -> anyhow::Result<&'a NetnsFleet> {
    state.netns.as_ref().ok_or_else(|| {
        anyhow!(
            "{fault} needs a fleet started in network namespaces (`baton fleet up N --netns`); \
             the fleet in {} was started without --netns",
            state.dir.display()
        )
    })
}

/// Cuts the current leader from its election backend (etcd, Redis, ZooKeeper, the pg-lease
/// connection) — or, on raft, from its peers — with DROP rules inside its namespace, while it
/// keeps serving clients and reaching the fenced PostgreSQL. Verifies the cut (connects from its
/// namespace to the backend time out, to PostgreSQL succeed, clients reach it), holds it for
/// `hold` from when it took effect, heals, and verifies the heal. Healing also happens on error
/// and when the future is dropped. Needs a `--netns` fleet.
pub async fn partition_leader(state: &FleetState, hold: Duration) -> anyhow::Result<FaultReport> {
    partition_leader_from(state, CutTarget::Backend, hold).await
}

/// [`partition_leader`] from its backend, from the fenced PostgreSQL, or from both.
pub async fn partition_leader_from(
    state: &FleetState,
    target: CutTarget,
    hold: Duration,
) -> anyhow::Result<FaultReport> {
    let net = require_netns(state, "partition-leader")?;
    let (leader, token) = current_leader(state, FIND_LEADER_WITHIN).await?;
    partition_node_inner(state, net, &leader, token, hold, "partition-leader", target).await
}

/// [`partition_leader`] for a named node (leader or not).
pub async fn partition_node(
    state: &FleetState,
    node: &str,
    hold: Duration,
) -> anyhow::Result<FaultReport> {
    let net = require_netns(state, "partition")?;
    let n = state.node(node)?.clone();
    partition_node_inner(state, net, &n, 0, hold, "partition", CutTarget::Backend).await
}

async fn partition_node_inner(
    state: &FleetState,
    net: &NetnsFleet,
    node: &FleetNode,
    token: i64,
    hold: Duration,
    fault: &str,
    target: CutTarget,
) -> anyhow::Result<FaultReport> {
    let me = net.node(&node.id)?.clone();
    let plan = cut_plan(state, net, node, target)?;
    let mut guard = RulesGuard {
        ns: me.ns.clone(),
        active: true,
    };
    let (ns, hosts) = (me.ns.clone(), plan.hosts.clone());
    tokio::task::spawn_blocking(move || apply_rules(&ns, &hosts))
        .await
        .map_err(|e| anyhow!("{e}"))?
        .with_context(|| format!("inserting the DROP rules in {}", me.ns))?;
    let applied = monotonic_ns();
    let (ok, seen) = verify(&plan, true, Duration::from_secs(2)).await;
    if !ok {
        let healed = tokio::task::spawn_blocking(move || guard.heal())
            .await
            .unwrap_or(false);
        bail!(
            "the partition of {} did not take effect as expected (rules removed again{}): {seen}",
            node.id,
            if healed { "" } else { ", NOT cleanly" }
        );
    }
    let applied_seen = seen;
    let end = applied + hold.as_nanos() as u64;
    let now = monotonic_ns();
    if end > now {
        tokio::time::sleep(Duration::from_nanos(end - now)).await;
    }
    let healed_clean = tokio::task::spawn_blocking(move || guard.heal())
        .await
        .unwrap_or(false);
    let healed = monotonic_ns();
    let (ok, seen) = verify(&plan, false, Duration::from_secs(5)).await;
    if !healed_clean || !ok {
        bail!(
            "healing the partition of {} did not verify (rules gone: {healed_clean}): {seen}",
            node.id
        );
    }
    Ok(FaultReport {
        fault: fault.into(),
        node: node.id.clone(),
        applied_at_mono_ns: applied,
        healed_at_mono_ns: healed,
        verified: true,
        detail: format!(
            "cut {} (token {token}) from {} for {:.3} s: DROP to/from {} in netns {}; applied: {applied_seen}; healed: {seen}",
            node.id,
            plan.what,
            (healed - applied) as f64 / 1e9,
            plan.hosts
                .iter()
                .map(|h| h.to_string())
                .collect::<Vec<_>>()
                .join(","),
            me.ns
        ),
    })
}

// ---------------------------------------------------------------- pause

/// The scheduler state letter of `pid` (`R`, `S`, `T` stopped, ...), from `/proc/<pid>/stat`.
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// A stop-the-world pause of the current leader: SIGSTOP, verify it is stopped (`T` in
/// `/proc/<pid>/stat`), hold `pause`, SIGCONT (also on error or when the future is dropped),
/// verify it runs again.
pub async fn pause_leader(state: &FleetState, pause: Duration) -> anyhow::Result<FaultReport> {
    let (leader, token) = current_leader(state, FIND_LEADER_WITHIN).await?;
    let mut r = pause_node(state, &leader.id, pause).await?;
    r.fault = "gc-pause-leader".into();
    r.detail = format!("{} (token {token})", r.detail);
    Ok(r)
}

/// [`pause_leader`] for a named node.
pub async fn pause_node(
    state: &FleetState,
    node: &str,
    pause: Duration,
) -> anyhow::Result<FaultReport> {
    let n = state.node(node)?;
    let pid = n.pid;
    if !pid_alive(pid) {
        bail!("{node} (pid {pid}) is not running");
    }
    let guard = StoppedProcess::stop(pid)?;
    let applied = monotonic_ns();
    let until = std::time::Instant::now() + Duration::from_secs(1);
    while proc_state(pid) != Some('T') {
        if std::time::Instant::now() > until {
            guard.cont();
            bail!(
                "{node} (pid {pid}) did not stop after SIGSTOP (state {:?})",
                proc_state(pid)
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let stopped_after_us = (monotonic_ns() - applied) / 1000;
    let end = applied + pause.as_nanos() as u64;
    let now = monotonic_ns();
    if end > now {
        tokio::time::sleep(Duration::from_nanos(end - now)).await;
    }
    guard.cont();
    let healed = monotonic_ns();
    let until = std::time::Instant::now() + Duration::from_secs(1);
    while proc_state(pid) == Some('T') {
        if std::time::Instant::now() > until {
            bail!("{node} (pid {pid}) still stopped 1 s after SIGCONT");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(FaultReport {
        fault: "pause".into(),
        node: node.into(),
        applied_at_mono_ns: applied,
        healed_at_mono_ns: healed,
        verified: true,
        detail: format!(
            "SIGSTOP pid {pid}: state T after {stopped_after_us} us; SIGCONT after {:.3} s; running again (state {})",
            (healed - applied) as f64 / 1e9,
            proc_state(pid).unwrap_or('?')
        ),
    })
}

// ---------------------------------------------------------------- clock skew

/// Sets one node's clock skew (ms, wall-clock offset) and drift (rate error, e.g. 0.01 = 1 %
/// fast) in its `config.toml`, restarts it (SIGTERM — it demotes and resigns if it led — then
/// `FleetState::start_node`), and waits until its `/status` answers again.
pub async fn skew_node(
    state: &mut FleetState,
    node: &str,
    skew_ms: i64,
    drift: f64,
) -> anyhow::Result<()> {
    skew_node_report(state, node, skew_ms, drift)
        .await
        .map(drop)
}

/// [`skew_node`] with a report (applied = the restarted node answers `/status`).
pub async fn skew_node_report(
    state: &mut FleetState,
    node: &str,
    skew_ms: i64,
    drift: f64,
) -> anyhow::Result<FaultReport> {
    if !(drift.is_finite() && drift.abs() < 0.5) {
        bail!("clock drift must be in (-0.5, 0.5), got {drift}");
    }
    let n = state.node(node)?.clone();
    let text = std::fs::read_to_string(&n.config)
        .with_context(|| format!("reading {}", n.config.display()))?;
    let mut table: toml::Table = text
        .parse()
        .with_context(|| format!("parsing {}", n.config.display()))?;
    let before = (
        table
            .get("clock_skew_ms")
            .and_then(|v| v.as_integer())
            .unwrap_or(0),
        table
            .get("clock_drift")
            .and_then(|v| v.as_float())
            .unwrap_or(0.0),
    );
    table.insert("clock_skew_ms".into(), toml::Value::Integer(skew_ms));
    table.insert("clock_drift".into(), toml::Value::Float(drift));
    let new_text = toml::to_string(&table)?;
    let tmp = n.config.with_extension("toml.tmp");
    // The config carries the cluster secret: keep it owner-only through the rewrite.
    crate::fleet::write_private(&tmp, &new_text)?;
    let checked = baton::config::NodeConfig::from_file(&tmp)
        .map_err(anyhow::Error::from)
        .and_then(|c| c.validate().map_err(anyhow::Error::from));
    if let Err(e) = checked {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!("the new config of {node}")));
    }
    std::fs::rename(&tmp, &n.config)?;
    let pid = n.pid;
    tokio::task::spawn_blocking(move || stop_pid(pid, libc::SIGTERM, Duration::from_secs(8)))
        .await?;
    let new_pid = state.start_node(node)?;
    let client = NodeClient::new(Duration::from_secs(1));
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = client.get(&n.http_addr, "/status").await {
            if r.status == 200 && r.json()["node_id"].as_str() == Some(node) {
                break;
            }
        }
        if !pid_alive(new_pid) || tokio::time::Instant::now() > until {
            bail!(
                "{node} did not come back after the restart (pid {new_pid}); see {}",
                n.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let applied = monotonic_ns();
    Ok(FaultReport {
        fault: "skew".into(),
        node: node.into(),
        applied_at_mono_ns: applied,
        healed_at_mono_ns: 0,
        verified: true,
        detail: format!(
            "clock_skew_ms {} -> {skew_ms}, clock_drift {} -> {drift}; restarted as pid {new_pid}, /status answers",
            before.0, before.1
        ),
    })
}

// ---------------------------------------------------------------- heal

/// Undoes every fault this module can leave behind in a fleet: removes the baton iptables
/// rules from every node namespace and continues any stopped node. Returns what it did.
pub fn heal_all(state: &FleetState) -> Vec<String> {
    let mut did = Vec::new();
    if let Some(net) = &state.netns {
        let existing = crate::fleet::netns::namespaces();
        for n in net.nodes.iter().filter(|n| existing.contains(&n.ns)) {
            if has_rules(&n.ns) {
                if remove_rules(&n.ns) {
                    did.push(format!("removed the {CHAIN} rules in {} ({})", n.ns, n.id));
                } else {
                    did.push(format!("FAILED to remove the {CHAIN} rules in {}", n.ns));
                }
            }
        }
    }
    for n in &state.nodes {
        if pid_alive(n.pid) && proc_state(n.pid) == Some('T') {
            // SAFETY: kill(2) on the node pid the fleet started.
            unsafe { libc::kill(n.pid as i32, libc::SIGCONT) };
            did.push(format!("SIGCONT {} (pid {})", n.id, n.pid));
        }
    }
    did
}
