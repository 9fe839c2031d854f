//! A private 3-server ZooKeeper ensemble on loopback ports, started by us in a directory of ours
//! (never the machine's service), from the Debian `zookeeper` package's jar:
//! `java -cp /usr/share/java/zookeeper.jar:... org.apache.zookeeper.server.quorum.QuorumPeerMain
//! zoo.cfg`, one JVM per server, each with its own `zoo.cfg`, data dir and `myid`.
//!
//! **tickTime bounds the session timeout**: a ZooKeeper server negotiates every session timeout
//! into `[2 × tickTime, 20 × tickTime]`. [`ZkEnsemble::tick_for_ttl`] picks `tickTime = TTL / 10`
//! (clamped to 50..=2000 ms), so a lease TTL is always inside the bounds and the server's expiry
//! granularity (it rounds expiry times up to whole ticks) stays a tenth of the TTL.
//!
//! Readiness is the four-letter word `srvr`: a server that answers with a `Mode:` line (leader or
//! follower) is serving; one still electing answers "not currently serving requests".

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::servers::{free_ports, pid_alive, spawn_detached, stop_pid, ServerError};

/// `maxClientCnxns`: ZooKeeper's default (60 per client IP) is meant for one client host, but
/// every node of a private fleet connects from 127.0.0.1: 9 nodes with 256 shards, reconnecting
/// under load, hit it and were refused ("Too many connections from /127.0.0.1 - max is 60"),
/// which lost their sessions and never let the fleet settle.
const MAX_CLIENT_CONNECTIONS: u32 = 1024;

const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";
/// A logging backend for ZooKeeper's slf4j (without one it logs nothing at all).
const SLF4J_SIMPLE: &str = "/usr/share/java/slf4j-simple.jar";
const MAIN_CLASS: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ZkMember {
    /// The server id (`myid`, 1-based).
    pub id: u32,
    pub client_port: u16,
    pub quorum_port: u16,
    pub election_port: u16,
    pub pid: u32,
    /// When `pid` started ([`super::servers::start_ticks`]).
    #[serde(default)]
    pub started_ticks: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ZkEnsemble {
    pub root: PathBuf,
    pub tick_ms: u64,
    pub members: Vec<ZkMember>,
}

fn java() -> Result<PathBuf, ServerError> {
    let from_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("java"))
            .find(|f| f.is_file())
    });
    from_path
        .or_else(|| {
            let p = PathBuf::from("/usr/bin/java");
            p.is_file().then_some(p)
        })
        .ok_or(ServerError::Missing {
            what: "java (Debian package default-jre-headless, pulled in by zookeeper)".into(),
            hint: "run scripts/ensure-deps.sh to install the Debian packages",
        })
}

/// Sends a four-letter word and returns the whole answer (the server closes after answering).
pub fn four_letter(port: u16, word: &str, timeout: Duration) -> Option<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.write_all(word.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

impl ZkEnsemble {
    /// `tickTime` for a lease TTL: TTL / 10, clamped to 50..=2000 ms, so `2 × tick <= TTL <= 20 ×
    /// tick` (ZooKeeper's session-timeout bounds) for every TTL from 100 ms to 40 s.
    pub fn tick_for_ttl(ttl: Duration) -> u64 {
        (ttl.as_millis() as u64 / 10).clamp(50, 2000)
    }

    /// The client connect string: every member.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn member_dir(&self, id: u32) -> PathBuf {
        self.root.join(format!("zk{id}"))
    }

    pub fn log(&self, id: u32) -> PathBuf {
        self.root.join(format!("zk{id}.log"))
    }

    /// Writes the configs and starts `n` servers (3 for a real quorum); waits until all serve.
    pub fn start(root: &Path, n: usize, tick_ms: u64) -> Result<ZkEnsemble, ServerError> {
        if !Path::new(ZK_JAR).is_file() {
            return Err(ServerError::Missing {
                what: format!("ZooKeeper ({ZK_JAR}, Debian package zookeeper)"),
                hint: "run scripts/ensure-deps.sh to install the Debian packages",
            });
        }
        fs::create_dir_all(root).map_err(|e| ServerError::Io(root.display().to_string(), e))?;
        let ports = free_ports(3 * n).map_err(|e| ServerError::Io("free ports".into(), e))?;
        let members: Vec<ZkMember> = (0..n)
            .map(|i| ZkMember {
                id: i as u32 + 1,
                client_port: ports[3 * i],
                quorum_port: ports[3 * i + 1],
                election_port: ports[3 * i + 2],
                pid: 0,
                started_ticks: None,
            })
            .collect();
        let mut ens = ZkEnsemble {
            root: root.to_owned(),
            tick_ms,
            members,
        };
        for i in 0..n {
            ens.write_config(i)?;
        }
        for i in 0..n {
            if let Err(e) = ens.spawn(i) {
                ens.stop();
                return Err(e);
            }
        }
        if let Err(e) = ens.wait_serving(Duration::from_secs(60)) {
            ens.stop();
            return Err(e);
        }
        Ok(ens)
    }

    fn write_config(&self, i: usize) -> Result<(), ServerError> {
        let m = &self.members[i];
        let dir = self.member_dir(m.id);
        let data = dir.join("data");
        let io = |what: String| move |e| ServerError::Io(what, e);
        fs::create_dir_all(&data).map_err(io(data.display().to_string()))?;
        fs::write(data.join("myid"), format!("{}\n", m.id)).map_err(io("myid".into()))?;
        let mut cfg = format!(
            "tickTime={tick}\n\
             initLimit=10\n\
             syncLimit=5\n\
             minSessionTimeout={min}\n\
             maxSessionTimeout={max}\n\
             dataDir={data}\n\
             clientPort={cp}\n\
             clientPortAddress=127.0.0.1\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=ruok,srvr,mntr,stat,cons\n\
             standaloneEnabled=false\n\
             reconfigEnabled=false\n\
             quorumListenOnAllIPs=false\n\
             autopurge.purgeInterval=0\n\
             maxClientCnxns={max_cnxns}\n\
             forceSync=no\n",
            tick = self.tick_ms,
            max_cnxns = MAX_CLIENT_CONNECTIONS,
            min = 2 * self.tick_ms,
            max = 20 * self.tick_ms,
            data = data.display(),
            cp = m.client_port,
        );
        for o in &self.members {
            cfg.push_str(&format!(
                "server.{}=127.0.0.1:{}:{}\n",
                o.id, o.quorum_port, o.election_port
            ));
        }
        fs::write(dir.join("zoo.cfg"), cfg).map_err(io("zoo.cfg".into()))
    }

    fn spawn(&mut self, i: usize) -> Result<(), ServerError> {
        let id = self.members[i].id;
        let dir = self.member_dir(id);
        let mut cp = ZK_JAR.to_owned();
        if Path::new(SLF4J_SIMPLE).is_file() {
            cp.push(':');
            cp.push_str(SLF4J_SIMPLE);
        }
        let mut cmd = Command::new(java()?);
        cmd.current_dir(&dir)
            // Small and quiet: three of these share two cores with the nodes under test.
            .args([
                "-Xms32m",
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
            ])
            .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
            .arg("-Dorg.slf4j.simpleLogger.showDateTime=true")
            .arg("-Dzookeeper.jmx.log4j.disable=true")
            // Leader election after the whole ensemble was paused (chaos, the conformance suite's
            // SIGSTOP test): ZooKeeper doubles the wait between election rounds up to 60 s and
            // gives each election connection 5 s, so a quorum that stalled once can sit silent
            // for most of a minute. These ensembles are three servers on loopback; bound both.
            .arg("-Dzookeeper.fastleader.maxNotificationInterval=2000")
            .arg("-Dzookeeper.cnxTimeout=2000")
            .arg(format!("-Dzookeeper.log.dir={}", dir.display()))
            .arg("-cp")
            .arg(cp)
            .arg(MAIN_CLASS)
            .arg(dir.join("zoo.cfg"));
        self.members[i].pid = spawn_detached(&mut cmd, &self.log(id))?;
        self.members[i].started_ticks = super::servers::spawned_ticks(self.members[i].pid);
        Ok(())
    }

    /// True when the member answers `srvr` with a mode (it is part of a serving quorum).
    pub fn serving(&self, i: usize) -> bool {
        four_letter(
            self.members[i].client_port,
            "srvr",
            Duration::from_millis(500),
        )
        .is_some_and(|out| out.contains("Mode: "))
    }

    /// The member that is the quorum's leader now, if any answers so.
    pub fn leader_index(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| {
            four_letter(
                self.members[i].client_port,
                "srvr",
                Duration::from_millis(500),
            )
            .is_some_and(|out| out.contains("Mode: leader"))
        })
    }

    fn wait_serving(&self, within: Duration) -> Result<(), ServerError> {
        let until = Instant::now() + within;
        loop {
            let running: Vec<usize> = (0..self.members.len())
                .filter(|&i| pid_alive(self.members[i].pid))
                .collect();
            if running.len() < self.members.len() {
                let dead = self
                    .members
                    .iter()
                    .find(|m| !pid_alive(m.pid))
                    .expect("one is dead");
                return Err(ServerError::NotReady(
                    format!("ZooKeeper server {} (exited)", dead.id),
                    self.log(dead.id),
                ));
            }
            if running.iter().all(|&i| self.serving(i)) {
                return Ok(());
            }
            if Instant::now() > until {
                return Err(ServerError::NotReady(
                    "ZooKeeper ensemble".into(),
                    self.root.clone(),
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops one member (SIGTERM, SIGKILL after a grace period); its data dir stays.
    pub fn stop_member(&self, i: usize) {
        stop_pid(self.members[i].pid, libc::SIGTERM, Duration::from_secs(5));
    }

    /// `kill -9` of member `i`; true once its process is gone.
    pub fn kill_member(&self, i: usize) -> bool {
        let pid = self.members[i].pid;
        stop_pid(pid, libc::SIGKILL, Duration::from_secs(5));
        !pid_alive(pid)
    }

    /// Starts a stopped member again with its data; waits until it serves.
    pub fn restart_member(&mut self, i: usize) -> Result<(), ServerError> {
        self.stop_member(i);
        self.spawn(i)?;
        let until = Instant::now() + Duration::from_secs(60);
        while !self.serving(i) {
            if !pid_alive(self.members[i].pid) || Instant::now() > until {
                return Err(ServerError::NotReady(
                    format!("ZooKeeper server {}", self.members[i].id),
                    self.log(self.members[i].id),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Stops every member and starts them all again with their data (a quorum forms only
    /// with enough of them up); waits until all serve.
    pub fn restart_all(&mut self) -> Result<(), ServerError> {
        self.stop();
        for i in 0..self.members.len() {
            self.spawn(i)?;
        }
        self.wait_serving(Duration::from_secs(60))
    }

    pub fn stop(&self) {
        for i in 0..self.members.len() {
            self.stop_member(i);
        }
    }
}
