//! A private Redis server on a loopback port, started by us in a directory of ours (never the
//! machine's service). Deliberately **without persistence** (`--save '' --appendonly no`): a
//! restart loses every key, which is exactly the hazard the `redis` backend documents (its token
//! counter regresses). [`RedisServer::restart`] reproduces it on demand.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
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
    /// Set when `port` speaks TLS only (see [`RedisServer::start_tls`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTls>,
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
        RedisServer::start_with(root, port, None)
    }

    /// [`RedisServer::start`] speaking TLS only on `port`, with `tls`'s certificate; clients
    /// are not asked for certificates (`--tls-auth-clients no`).
    pub fn start_tls(root: &Path, port: u16, tls: &ServerTls) -> Result<RedisServer, ServerError> {
        RedisServer::start_with(root, port, Some(tls.clone()))
    }

    fn start_with(
        root: &Path,
        port: u16,
        tls: Option<ServerTls>,
    ) -> Result<RedisServer, ServerError> {
        fs::create_dir_all(root).map_err(|e| ServerError::Io(root.display().to_string(), e))?;
        let mut server = RedisServer {
            port,
            root: root.to_owned(),
            pid: 0,
            started_ticks: None,
            tls,
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> Result<(), ServerError> {
        let mut cmd = Command::new(redis_binary()?);
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
                    .args(["--tls-auth-clients", "no"]);
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

    /// True when the server answers `PING` with `+PONG`.
    pub fn ping(&self) -> bool {
        self.command(b"PING\r\n", b"+PONG")
    }

    /// Plain servers: answers PING. TLS servers: accepts TCP (our PING would need a TLS client).
    fn ready(&self) -> bool {
        if self.tls.is_none() {
            return self.ping();
        }
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
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
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        if s.write_all(cmd).is_err() {
            return false;
        }
        let mut buf = [0u8; 64];
        matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(want))
    }

    /// Stop and start again on the same port. Without persistence every key is gone afterwards:
    /// the lock, and the `redis` backend's token counter.
    pub fn restart(&mut self) -> Result<(), ServerError> {
        self.stop();
        self.spawn()
    }
}
