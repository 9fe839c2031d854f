//! A private Redis server on a loopback port, started by us in a directory of ours (never the
//! machine's service). Deliberately **without persistence** (`--save '' --appendonly no`): a
//! restart loses every key, which is exactly the hazard the `redis` backend documents (its token
//! counter regresses). [`RedisServer::restart`] reproduces it on demand.
//!
//! **TLS.** A data server started with a certificate ([`RedisServer::start_tls`],
//! [`RedisServer::start_tls_with_password`]) speaks TLS only (`port 0`, `tls-port`) and replicates
//! over TLS (`tls-replication yes`): a replica of it inherits its certificate, and so do the
//! Sentinels of a [`RedisSentinelSet`] started beside it, which then listen on TLS only and reach
//! the data servers and each other over TLS. Our own probes (`PING`, `INFO`, `SENTINEL ...`)
//! speak TLS to such a server, verified against its CA.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::servers::{pid_alive, spawn_detached, stop_pid, ServerError, ServerTls};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RedisServer {
    pub port: u16,
    pub root: PathBuf,
    pub pid: u32,
    /// When `pid` started ([`super::servers::start_ticks`]).
    #[serde(default)]
    pub started_ticks: Option<u64>,
    /// Set when `port` speaks TLS only (see [`RedisServer::start_tls`]); a Sentinel's too, when
    /// it monitors TLS data servers (see [`RedisSentinelSet::start_with_password`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTls>,
    /// A replica: the port of the primary it replicates (`--replicaof 127.0.0.1 PORT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_of: Option<u16>,
    /// A Sentinel (`redis-server sentinel.conf --sentinel`), not a data server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sentinel: Option<SentinelOf>,
    /// The password this server asks its clients for (`requirepass`); a data server also uses
    /// it to reach its primary (`masterauth`: every data server of a set shares one). Our own
    /// probes (`ask`, PING) send `AUTH` first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// What a Sentinel monitors: the master name the fleet's nodes ask for, the primary it starts
/// from, and timings short enough for tests (a primary is down after `down_after_ms` without an
/// answer; a failover that has not finished within `failover_timeout_ms` is abandoned, and the
/// same master is not failed over again within twice that).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SentinelOf {
    pub master_name: String,
    pub primary_port: u16,
    pub quorum: u32,
    pub down_after_ms: u64,
    pub failover_timeout_ms: u64,
    /// The data servers' password (`sentinel auth-pass NAME ...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_pass: Option<String>,
}

/// `--redis-topology sentinel`: beside the fleet's primary ([`super::FleetState::redis`]), one
/// replica and three Sentinels, each its own process on a loopback port with its own directory.
/// After a failover (`baton chaos sentinel-failover`) the primary and the replica swap places.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RedisSentinelSet {
    pub master_name: String,
    pub replica: RedisServer,
    pub sentinels: Vec<RedisServer>,
}

/// The master name a fleet's Sentinels monitor.
pub const FLEET_MASTER_NAME: &str = "baton";

impl RedisSentinelSet {
    /// Starts a replica of `primary` and three Sentinels monitoring it (quorum 2), under
    /// `root`; returns once the replica is in sync and the Sentinels know each other and the
    /// replica (a failover needs both). Stops what it started on failure.
    pub fn start(root: &Path, primary: &RedisServer) -> Result<RedisSentinelSet, ServerError> {
        RedisSentinelSet::start_with_password(root, primary, None)
    }

    /// [`RedisSentinelSet::start`] with passwords: the replica asks for the primary's
    /// (`primary.password`, also its `masterauth`), the Sentinels reach both with it (`sentinel
    /// auth-pass`) and ask their own clients for `sentinel_password` (`requirepass`).
    ///
    /// A TLS `primary` ([`RedisServer::tls`]) makes the whole set TLS: the replica replicates
    /// over TLS with the primary's certificate, and the Sentinels serve TLS only with it and
    /// speak TLS to the data servers and to each other (`tls-replication yes`).
    pub fn start_with_password(
        root: &Path,
        primary: &RedisServer,
        sentinel_password: Option<&str>,
    ) -> Result<RedisSentinelSet, ServerError> {
        let ports =
            super::servers::free_ports(4).map_err(|e| ServerError::Io("free ports".into(), e))?;
        let replica = RedisServer::start_replica(&root.join("redis-replica"), ports[0], primary)?;
        let mut set = RedisSentinelSet {
            master_name: FLEET_MASTER_NAME.into(),
            replica,
            sentinels: Vec::new(),
        };
        let of = SentinelOf {
            master_name: FLEET_MASTER_NAME.into(),
            primary_port: primary.port,
            quorum: 2,
            down_after_ms: 1000,
            failover_timeout_ms: 2000,
            auth_pass: primary.password.clone(),
        };
        let started = (|| {
            set.replica.wait_replica_in_sync(Duration::from_secs(20))?;
            for (i, port) in ports[1..].iter().enumerate() {
                let dir = root.join(format!("redis-sentinel-{}", i + 1));
                set.sentinels.push(RedisServer::start_sentinel_with(
                    &dir,
                    *port,
                    of.clone(),
                    sentinel_password,
                    primary.tls.as_ref(),
                )?);
            }
            set.wait_ready(Duration::from_secs(30))
        })();
        match started {
            Ok(()) => Ok(set),
            Err(e) => {
                set.stop();
                Err(e)
            }
        }
    }

    /// Every Sentinel's `host:port`, for the nodes' `[redis] sentinels`.
    pub fn addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect()
    }

    /// The primary's port as the first Sentinel that answers names it.
    pub fn named_primary(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| self.named_by(s))
    }

    /// Whether every Sentinel names `port` as the primary.
    pub fn all_name(&self, port: u16) -> bool {
        self.sentinels
            .iter()
            .all(|s| self.named_by(s) == Some(port))
    }

    /// The primary's port as Sentinel `s` names it.
    fn named_by(&self, s: &RedisServer) -> Option<u16> {
        let reply = s.ask(
            &format!("SENTINEL get-master-addr-by-name {}", self.master_name),
            |r| r.lines().count() >= 4 || r.starts_with('-') || r.starts_with("*-1"),
        )?;
        reply.lines().nth(4)?.trim().parse().ok()
    }

    /// Until every Sentinel reaches quorum and failover authorization (`SENTINEL ckquorum`:
    /// they found each other) and knows the replica.
    fn wait_ready(&self, within: Duration) -> Result<(), ServerError> {
        let until = Instant::now() + within;
        let replica_port = self.replica.port.to_string();
        loop {
            let ready = self.sentinels.iter().all(|s| {
                let quorum = s
                    .ask(&format!("SENTINEL ckquorum {}", self.master_name), |r| {
                        r.ends_with("\r\n")
                    })
                    .is_some_and(|r| {
                        r.starts_with(&format!("+OK {} usable", self.sentinels.len()))
                    });
                quorum
                    && s.ask(&format!("SENTINEL replicas {}", self.master_name), |r| {
                        r.contains(&replica_port)
                    })
                    .is_some_and(|r| r.contains(&replica_port))
            });
            if ready {
                return Ok(());
            }
            if Instant::now() > until {
                return Err(ServerError::NotReady(
                    format!(
                        "Sentinels {:?} (quorum and the replica on {replica_port})",
                        self.addrs()
                    ),
                    self.sentinels[0].log(),
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn stop(&self) {
        for s in &self.sentinels {
            s.stop();
        }
        self.replica.stop();
    }
}

fn redis_binary() -> Result<PathBuf, ServerError> {
    let from_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("redis-server"))
            .find(|f| f.is_file())
    });
    from_path
        .or_else(|| {
            let p = PathBuf::from("/usr/bin/redis-server");
            p.is_file().then_some(p)
        })
        .ok_or(ServerError::Missing {
            what: "redis-server (Debian package redis-server)".into(),
            hint: "run scripts/ensure-deps.sh to install the Debian packages",
        })
}

impl RedisServer {
    /// `redis://`, or `rediss://` for a TLS server.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    pub fn log(&self) -> PathBuf {
        self.root.join("redis.log")
    }

    /// Starts `redis-server` on `127.0.0.1:port` with no persistence; waits until it answers PING.
    pub fn start(root: &Path, port: u16) -> Result<RedisServer, ServerError> {
        fs::create_dir_all(root).map_err(|e| ServerError::Io(root.display().to_string(), e))?;
        RedisServer::start_with(root, port, None, None)
    }

    /// [`RedisServer::start`] speaking TLS only on `port`, with `tls`'s certificate; clients
    /// are not asked for certificates (`--tls-auth-clients no`).
    pub fn start_tls(root: &Path, port: u16, tls: &ServerTls) -> Result<RedisServer, ServerError> {
        RedisServer::start_with(root, port, Some(tls.clone()), None)
    }

    /// [`RedisServer::start`] asking its clients for `password` (`requirepass`, and
    /// `masterauth` should it become a replica).
    pub fn start_with_password(
        root: &Path,
        port: u16,
        password: &str,
    ) -> Result<RedisServer, ServerError> {
        RedisServer::start_with(root, port, None, Some(password.to_owned()))
    }

    /// [`RedisServer::start_tls`] asking its clients for `password` (as
    /// [`RedisServer::start_with_password`]).
    pub fn start_tls_with_password(
        root: &Path,
        port: u16,
        tls: &ServerTls,
        password: &str,
    ) -> Result<RedisServer, ServerError> {
        RedisServer::start_with(root, port, Some(tls.clone()), Some(password.to_owned()))
    }

    fn start_with(
        root: &Path,
        port: u16,
        tls: Option<ServerTls>,
        password: Option<String>,
    ) -> Result<RedisServer, ServerError> {
        fs::create_dir_all(root).map_err(|e| ServerError::Io(root.display().to_string(), e))?;
        let mut server = RedisServer {
            port,
            root: root.to_owned(),
            pid: 0,
            started_ticks: None,
            tls,
            replica_of: None,
            sentinel: None,
            password,
        };
        server.spawn()?;
        Ok(server)
    }

    /// A replica of `primary` on `port` (no persistence, and TLS with its certificate, like the
    /// primary).
    pub fn start_replica(
        root: &Path,
        port: u16,
        primary: &RedisServer,
    ) -> Result<RedisServer, ServerError> {
        fs::create_dir_all(root).map_err(|e| ServerError::Io(root.display().to_string(), e))?;
        let mut server = RedisServer {
            port,
            root: root.to_owned(),
            pid: 0,
            started_ticks: None,
            tls: primary.tls.clone(),
            replica_of: Some(primary.port),
            sentinel: None,
            password: primary.password.clone(),
        };
        server.spawn()?;
        Ok(server)
    }

    /// A Sentinel on `port` monitoring `of`.
    pub fn start_sentinel(
        root: &Path,
        port: u16,
        of: SentinelOf,
    ) -> Result<RedisServer, ServerError> {
        RedisServer::start_sentinel_with_password(root, port, of, None)
    }

    /// [`RedisServer::start_sentinel`] asking its clients for `password` (`requirepass`).
    pub fn start_sentinel_with_password(
        root: &Path,
        port: u16,
        of: SentinelOf,
        password: Option<&str>,
    ) -> Result<RedisServer, ServerError> {
        RedisServer::start_sentinel_with(root, port, of, password, None)
    }

    /// [`RedisServer::start_sentinel_with_password`], over TLS with `tls`'s certificate when
    /// given: it listens on TLS only, and reaches the data servers it monitors (which must then
    /// speak TLS, with a certificate from the same CA) and the other Sentinels over TLS.
    pub fn start_sentinel_with(
        root: &Path,
        port: u16,
        of: SentinelOf,
        password: Option<&str>,
        tls: Option<&ServerTls>,
    ) -> Result<RedisServer, ServerError> {
        fs::create_dir_all(root).map_err(|e| ServerError::Io(root.display().to_string(), e))?;
        let mut server = RedisServer {
            port,
            root: root.to_owned(),
            pid: 0,
            started_ticks: None,
            tls: tls.cloned(),
            replica_of: None,
            sentinel: Some(of),
            password: password.map(str::to_owned),
        };
        server.spawn()?;
        Ok(server)
    }

    /// Until this replica reports its link to the primary up (the initial sync done).
    pub fn wait_replica_in_sync(&self, within: Duration) -> Result<(), ServerError> {
        let until = Instant::now() + within;
        while !self.replica_link_up() {
            if !pid_alive(self.pid) || Instant::now() > until {
                return Err(ServerError::NotReady(
                    format!(
                        "redis replica on port {} (link to its primary not up)",
                        self.port
                    ),
                    self.log(),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Whether `INFO replication` says `master_link_status:up`.
    pub fn replica_link_up(&self) -> bool {
        self.ask("INFO replication", |r| r.contains("master_link_status:"))
            .is_some_and(|r| r.contains("master_link_status:up"))
    }

    fn spawn(&mut self) -> Result<(), ServerError> {
        if let Some(of) = &self.sentinel {
            return self.spawn_sentinel(of.clone());
        }
        let mut cmd = Command::new(redis_binary()?);
        if let Some(pw) = &self.password {
            // In a private file (a config file must be the first argument), not on the command
            // line, where any user's `ps` would show it.
            let conf = self.root.join("auth.conf");
            super::write_private(&conf, format!("requirepass {pw}\nmasterauth {pw}\n"))
                .map_err(|e| ServerError::Io(conf.display().to_string(), e))?;
            cmd.arg(&conf);
        }
        if let Some(primary) = self.replica_of {
            cmd.args(["--replicaof", "127.0.0.1"])
                .arg(primary.to_string());
        }
        // A replica's first sync starts at once (the default waits 5 s for more replicas).
        cmd.args(["--repl-diskless-sync-delay", "0"]);
        match &self.tls {
            None => {
                cmd.arg("--port").arg(self.port.to_string());
            }
            Some(tls) => {
                cmd.args(["--port", "0", "--tls-port"])
                    .arg(self.port.to_string())
                    .arg("--tls-cert-file")
                    .arg(&tls.cert_file)
                    .arg("--tls-key-file")
                    .arg(&tls.key_file)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca_file)
                    .args(["--tls-auth-clients", "no"])
                    // A replica connects to its primary over TLS (the primary has no plain
                    // port); a primary uses it once a Sentinel makes it a replica.
                    .args(["--tls-replication", "yes"]);
            }
        }
        cmd.args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(&self.root)
            .args(["--logfile", ""])
            .args(["--loglevel", "warning"]);
        self.pid = spawn_detached(&mut cmd, &self.log())?;
        self.started_ticks = super::servers::spawned_ticks(self.pid);
        self.wait_ready(Duration::from_secs(10))
    }

    /// A Sentinel reads, and rewrites, its own config file: written here, in its directory.
    /// With TLS it listens on `tls-port` only (`port 0`), and `tls-replication yes` makes its
    /// own connections, to the data servers and to the other Sentinels, TLS too (Sentinel then
    /// announces its TLS port in its hellos).
    fn spawn_sentinel(&mut self, of: SentinelOf) -> Result<(), ServerError> {
        let conf = self.root.join("sentinel.conf");
        let listen = match &self.tls {
            None => format!("port {}\n", self.port),
            Some(tls) => format!(
                "port 0\ntls-port {}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
                 tls-auth-clients no\ntls-replication yes\n",
                self.port,
                tls.cert_file.display(),
                tls.key_file.display(),
                tls.ca_file.display()
            ),
        };
        let text = format!(
            "{listen}bind 127.0.0.1\ndir {dir}\nlogfile \"\"\nloglevel notice\n\
             sentinel monitor {name} 127.0.0.1 {primary} {quorum}\n\
             sentinel down-after-milliseconds {name} {down}\n\
             sentinel failover-timeout {name} {failover}\n\
             sentinel parallel-syncs {name} 1\n{auth}",
            dir = self.root.display(),
            name = of.master_name,
            primary = of.primary_port,
            quorum = of.quorum,
            down = of.down_after_ms,
            failover = of.failover_timeout_ms,
            auth = [
                of.auth_pass
                    .as_ref()
                    .map(|p| format!("sentinel auth-pass {} {p}\n", of.master_name)),
                self.password.as_ref().map(|p| format!("requirepass {p}\n")),
            ]
            .into_iter()
            .flatten()
            .collect::<String>(),
        );
        super::write_private(&conf, text)
            .map_err(|e| ServerError::Io(conf.display().to_string(), e))?;
        let mut cmd = Command::new(redis_binary()?);
        cmd.arg(&conf).arg("--sentinel");
        self.pid = spawn_detached(&mut cmd, &self.log())?;
        self.started_ticks = super::servers::spawned_ticks(self.pid);
        self.wait_ready(Duration::from_secs(10))
    }

    /// Sends one inline command and reads the reply until `complete` says it is whole (or 2 s
    /// pass, or the server closes): the raw RESP text, `None` when nothing came back.
    pub fn ask(&self, cmd: &str, complete: impl Fn(&str) -> bool) -> Option<String> {
        let mut s = self.connect().ok()?;
        self.authenticate(&mut s)?;
        let until = Instant::now() + Duration::from_secs(2);
        // Written before the short read timeout: a TLS handshake (on the first write when there
        // was no AUTH) waits up to the connection's 2 s.
        s.write_all(format!("{cmd}\r\n").as_bytes()).ok()?;
        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
        let mut reply = Vec::new();
        let mut buf = [0u8; 4096];
        while Instant::now() < until && reply.len() < 1 << 16 {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    reply.extend_from_slice(&buf[..n]);
                    if complete(&String::from_utf8_lossy(&reply)) {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                Err(_) => break,
            }
        }
        (!reply.is_empty()).then(|| String::from_utf8_lossy(&reply).into_owned())
    }

    /// A connection for our probes: plain TCP, or TLS verified against [`RedisServer::tls`]'s CA
    /// (the server's name: 127.0.0.1, which its certificate must carry). The TLS handshake
    /// happens on the first read or write.
    pub fn connect(&self) -> std::io::Result<Probe> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let tcp = TcpStream::connect_timeout(&addr, Duration::from_millis(300))?;
        let Some(tls) = &self.tls else {
            return Ok(Probe::Plain(tcp));
        };
        // The handshake's reads wait at most this long (the callers set their own after).
        tcp.set_read_timeout(Some(Duration::from_secs(2)))?;
        tcp.set_write_timeout(Some(Duration::from_secs(2)))?;
        let config = baton::tls::client_config(&tls.ca_file).map_err(std::io::Error::other)?;
        let name =
            rustls::pki_types::ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
        let conn =
            rustls::ClientConnection::new(Arc::new(config), name).map_err(std::io::Error::other)?;
        Ok(Probe::Tls(Box::new(rustls::StreamOwned::new(conn, tcp))))
    }

    /// `AUTH` with [`RedisServer::password`] on a fresh connection, when there is one; `None` when
    /// the server did not answer `+OK`.
    fn authenticate(&self, s: &mut Probe) -> Option<()> {
        let Some(pw) = &self.password else {
            return Some(());
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        s.write_all(format!("AUTH {pw}\r\n").as_bytes()).ok()?;
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        while !reply.ends_with(b"\r\n") && reply.len() < 512 {
            match s.read(&mut byte) {
                Ok(1) => reply.push(byte[0]),
                _ => return None,
            }
        }
        reply.starts_with(b"+OK").then_some(())
    }

    /// True when the server answers `PING` with `+PONG`.
    pub fn ping(&self) -> bool {
        self.command(b"PING\r\n", b"+PONG")
    }

    /// Answers PING (over TLS for a TLS server).
    fn ready(&self) -> bool {
        self.ping()
    }

    fn wait_ready(&self, within: Duration) -> Result<(), ServerError> {
        let until = Instant::now() + within;
        loop {
            if self.ready() {
                return Ok(());
            }
            if !pid_alive(self.pid) || Instant::now() > until {
                return Err(ServerError::NotReady(
                    format!("redis-server on port {}", self.port),
                    self.log(),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn is_running(&self) -> bool {
        pid_alive(self.pid)
    }

    /// SIGTERM (no persistence, so it exits at once), SIGKILL after a grace period.
    pub fn stop(&self) {
        stop_pid(self.pid, libc::SIGTERM, Duration::from_secs(5));
    }

    /// `kill -9`, `down` later start again on the same port. With `persist`, a `SAVE` first writes the
    /// keys to `dump.rdb` in its directory, which redis-server loads at start (the restart
    /// keeps the data as of that snapshot); without, the snapshot is removed and every key is
    /// lost. Returns whether the process was observed dead before the restart.
    pub fn kill_restart(&mut self, persist: bool, down: Duration) -> Result<bool, ServerError> {
        let dump = self.root.join("dump.rdb");
        if persist {
            self.command(b"SAVE\r\n", b"+OK")
                .then_some(())
                .ok_or_else(|| ServerError::Failed {
                    what: "redis SAVE".into(),
                    detail: format!("no +OK from port {}", self.port),
                })?;
        } else {
            let _ = fs::remove_file(&dump);
        }
        stop_pid(self.pid, libc::SIGKILL, Duration::from_secs(5));
        let dead = !pid_alive(self.pid);
        std::thread::sleep(down);
        self.spawn()?;
        Ok(dead)
    }

    /// Sends one inline command; true when the answer starts with `want`.
    fn command(&self, cmd: &[u8], want: &[u8]) -> bool {
        let Ok(mut s) = self.connect() else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        if self.authenticate(&mut s).is_none() || s.write_all(cmd).is_err() {
            return false;
        }
        let mut buf = [0u8; 64];
        matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(want))
    }

    /// Starts this (stopped or killed) data server again as a replica of `primary_port`, from
    /// nothing (its old snapshot removed: the primary's full sync replaces it anyway).
    pub fn restart_as_replica_of(&mut self, primary_port: u16) -> Result<(), ServerError> {
        stop_pid(self.pid, libc::SIGKILL, Duration::from_secs(5));
        let _ = fs::remove_file(self.root.join("dump.rdb"));
        self.replica_of = Some(primary_port);
        self.spawn()
    }

    /// Stop and start again on the same port. Without persistence every key is gone afterwards:
    /// the lock, and the `redis` backend's token counter.
    pub fn restart(&mut self) -> Result<(), ServerError> {
        self.stop();
        self.spawn()
    }
}

/// One probe connection ([`RedisServer::connect`]): plain TCP, or TLS over it.
pub enum Probe {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Probe {
    fn tcp(&self) -> &TcpStream {
        match self {
            Probe::Plain(s) => s,
            Probe::Tls(s) => &s.sock,
        }
    }

    /// The socket's read timeout (a TLS read that times out keeps its state: read again).
    pub fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        self.tcp().set_read_timeout(d)
    }
}

impl Read for Probe {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Probe::Plain(s) => s.read(buf),
            Probe::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Probe {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Probe::Plain(s) => s.write(buf),
            Probe::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Probe::Plain(s) => s.flush(),
            Probe::Tls(s) => s.flush(),
        }
    }
}
