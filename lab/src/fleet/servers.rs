//! Private backend servers, started by us on loopback ports inside a state directory: never the
//! machine's shared services. PostgreSQL runs as the `postgres` OS user (initdb refuses root).

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{what} not found ({hint})")]
    Missing { what: String, hint: &'static str },
    #[error("{0}: {1}")]
    Io(String, io::Error),
    #[error("{what} failed: {detail}")]
    Failed { what: String, detail: String },
    #[error("{0} did not become ready in time; see its log in {1}")]
    NotReady(String, PathBuf),
}

const INSTALL_HINT: &str = "run scripts/ensure-deps.sh to install the Debian packages";

/// Picks `n` distinct free loopback ports (all bound at once, then released together), at
/// random from below the kernel's ephemeral range. A port is only known free until it is
/// released, and a port from the ephemeral range (what binding port 0 gives) can be taken
/// meanwhile as the *local* port of any outgoing connection on the machine: a node then failed
/// to bind its raft listener ("Address already in use", `exp_short` in CI). Ports below the
/// range are never handed to outgoing connections.
pub fn free_ports(n: usize) -> io::Result<Vec<u16>> {
    use rand::Rng;
    let (lo, hi) = listen_port_range();
    let mut rng = rand::thread_rng();
    let mut listeners: Vec<std::net::TcpListener> = Vec::with_capacity(n);
    let mut ports: Vec<u16> = Vec::with_capacity(n);
    let mut tries = 0;
    while ports.len() < n {
        tries += 1;
        if tries > 100 * n + 1000 {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("no {n} free loopback ports in {lo}..={hi}"),
            ));
        }
        let port = rng.gen_range(lo..=hi);
        if ports.contains(&port) {
            continue;
        }
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            listeners.push(l);
            ports.push(port);
        }
    }
    Ok(ports)
}

/// The ports [`free_ports`] picks from: the 10,000 below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`, 32768 by default), not below 1024.
fn listen_port_range() -> (u16, u16) {
    let ephemeral_start = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let hi = ephemeral_start.saturating_sub(1).max(11_024);
    (hi.saturating_sub(10_000).max(1024), hi)
}

/// The last `lines` lines of the file at `path` (empty if unreadable): a server's or a node's
/// log, for an error message that outlives the temp dir it was in.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Starts `cmd` in its own session (so a terminal's Ctrl-C reaches only us, and we stop it by pid),
/// output appended to `log`. Returns the pid.
pub fn spawn_detached(cmd: &mut Command, log: &Path) -> Result<u32, ServerError> {
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| ServerError::Io(log.display().to_string(), e))?;
    let err = out
        .try_clone()
        .map_err(|e| ServerError::Io(log.display().to_string(), e))?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| ServerError::Io(format!("{:?}", cmd.get_program()), e))?;
    Ok(child.id())
}

pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false; // kill(0, ..) would address our own process group
    }
    // Reap it if it is our own exited child.
    let mut status = 0;
    // SAFETY: WNOHANG never blocks; a pid that is not our child just returns -1.
    unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
    // A zombie (killed, not yet reaped by its parent) is not alive: read its state from /proc.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// When process `pid` started, in clock ticks since boot (`/proc/<pid>/stat` field 22); `None`
/// when there is no such process. With the pid it names one process for good: this machine's
/// `pid_max` is 32,768, so a pid recorded by a fleet that stopped long ago may belong to an
/// unrelated process by now.
pub fn start_ticks(pid: u32) -> Option<u64> {
    if pid == 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces and parentheses) start at field 3.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// The start time to record for `pid`, just spawned by us. Our own child keeps its /proc entry
/// until we reap it, so this fails only for a spawn that never happened; 0 then never matches.
pub fn spawned_ticks(pid: u32) -> Option<u64> {
    Some(start_ticks(pid).unwrap_or(0))
}

/// `pid`, if it still names the process that started at `started_ticks` (or no start time was
/// recorded, as in state files written before there were any); else 0, which every caller reads
/// as "not running".
pub fn ours(pid: u32, started_ticks: Option<u64>) -> u32 {
    match started_ticks {
        Some(t) if start_ticks(pid) != Some(t) => 0,
        _ => pid,
    }
}

/// Sends `sig`, then waits up to `grace` for the process to go, then SIGKILLs it.
pub fn stop_pid(pid: u32, sig: i32, grace: Duration) {
    if !pid_alive(pid) {
        return;
    }
    // SAFETY: plain kill(2) on a pid we started.
    unsafe { libc::kill(pid as i32, sig) };
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if !pid_alive(pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until && pid_alive(pid) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The direct children of `pid` (from `/proc/*/stat`).
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|st| {
                    let rest = st.rsplit_once(')')?.1.to_owned();
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|f| f.is_file())
    })
}

fn is_root() -> bool {
    // SAFETY: geteuid has no failure mode.
    unsafe { libc::geteuid() == 0 }
}

fn chown_to_postgres(path: &Path) -> Result<(), ServerError> {
    if !is_root() {
        return Ok(());
    }
    let st = Command::new("chown")
        .arg("-R")
        .arg("postgres:postgres")
        .arg(path)
        .status()
        .map_err(|e| ServerError::Io("chown".into(), e))?;
    if !st.success() {
        return Err(ServerError::Failed {
            what: "chown".into(),
            detail: format!("{st}"),
        });
    }
    Ok(())
}

/// Makes `dir` (and its parents up to the first one we did not create) traversable, so the
/// `postgres` user can reach its data dir inside a 0700 temp dir.
fn open_up(dir: &Path) -> Result<(), ServerError> {
    let mut cur = Some(dir);
    while let Some(d) = cur {
        if d == Path::new("/") || d.as_os_str().is_empty() {
            break;
        }
        let meta = fs::metadata(d).map_err(|e| ServerError::Io(d.display().to_string(), e))?;
        let mode = meta.permissions().mode();
        if mode & 0o011 != 0o011 {
            let _ = fs::set_permissions(d, fs::Permissions::from_mode(mode | 0o711));
        }
        cur = d.parent();
    }
    Ok(())
}

/// The newest PostgreSQL server binaries on the machine.
pub fn pg_bin_dir() -> Result<PathBuf, ServerError> {
    let mut dirs: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|v| v.parse::<u32>().ok())
                        .map(|v| (v, e.path().join("bin")))
                })
                .filter(|(_, p)| p.join("postgres").is_file())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs.pop().map(|(_, p)| p).ok_or(ServerError::Missing {
        what: "PostgreSQL server (/usr/lib/postgresql/*/bin/postgres)".into(),
        hint: INSTALL_HINT,
    })
}

/// The private server's superuser.
const SUPERUSER: &str = "postgres";
/// What nodes connect as (created by the migrations too; here it gets its password).
const APP_ROLE: &str = "baton_app";

/// A server certificate and key (PEM files) for a private server to serve TLS with, and the CA
/// that issued it (what our own readiness probes trust).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServerTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub ca_file: PathBuf,
}

/// The pg_hba.conf head of a TLS server: the superuser may still connect in plain text from
/// loopback (our admin tooling: psql, migrations, role provisioning), every other role only
/// over TLS. First match wins, so these go before initdb's lines.
const HBA_TLS_HEAD: &str = "# baton: TLS required for every role but the superuser
host    all postgres 127.0.0.1/32 scram-sha-256
hostssl all all      127.0.0.1/32 scram-sha-256
host    all all      127.0.0.1/32 reject
";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PgServer {
    pub port: u16,
    pub root: PathBuf,
    pub bin_dir: PathBuf,
}

impl PgServer {
    pub fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }
    /// Superuser URL. Every TCP client authenticates with a password (scram-sha-256), also on
    /// loopback: another OS user of the machine must not walk in as the superuser and switch
    /// fencing off.
    pub fn admin_url(&self) -> String {
        self.url_as(SUPERUSER, "127.0.0.1")
    }
    /// The application role's URL: it may only call the fenced functions.
    pub fn app_url(&self) -> String {
        self.url_as(APP_ROLE, "127.0.0.1")
    }
    /// The pg-lease backend's role: its own schema, no reach into the fenced resource.
    pub fn lease_url(&self) -> String {
        self.url_as(baton::backends::pg_lease::LEASE_ROLE, "127.0.0.1")
    }
    /// `role`'s URL with its password, for a client that reaches this server at `host`.
    pub fn url_as(&self, role: &str, host: impl std::fmt::Display) -> String {
        let password = self.password(role).unwrap_or_default();
        format!("postgres://{role}:{password}@{host}:{}/baton", self.port)
    }
    /// `role`'s password, generated when this server was first initialised (`secrets/`, 0600).
    pub fn password(&self, role: &str) -> Result<String, ServerError> {
        let path = self.root.join("secrets").join(role);
        fs::read_to_string(&path)
            .map(|s| s.trim().to_owned())
            .map_err(|e| ServerError::Io(path.display().to_string(), e))
    }

    /// Writes a random password for each role we use, once; kept across restarts.
    fn make_passwords(&self) -> Result<(), ServerError> {
        for role in [SUPERUSER, APP_ROLE, baton::backends::pg_lease::LEASE_ROLE] {
            self.make_password(role)?;
        }
        Ok(())
    }

    /// `role`'s password: generated (24 random bytes, hex, 0600 under `secrets/`) the first
    /// time, then the same one. The role itself is created elsewhere.
    pub fn make_password(&self, role: &str) -> Result<String, ServerError> {
        let dir = self.root.join("secrets");
        fs::create_dir_all(&dir).map_err(|e| ServerError::Io("secrets dir".into(), e))?;
        let path = dir.join(role);
        if !path.exists() {
            fs::write(&path, super::random_hex(24))
                .map_err(|e| ServerError::Io(path.display().to_string(), e))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
                .map_err(|e| ServerError::Io(path.display().to_string(), e))?;
        }
        self.password(role)
    }

    /// Creates `node_id`'s own role (it writes only as that holder) and returns its URL.
    pub async fn node_role_url(&self, node_id: &str) -> anyhow::Result<String> {
        let role = baton::work::fence::node_role(node_id);
        let password = self.make_password(&role)?;
        baton::work::fence::provision_node_role(&self.admin_url(), node_id, &password).await?;
        Ok(self.url_as(&role, "127.0.0.1"))
    }

    /// The application and lease roles, with their passwords (the migrations then find them).
    fn make_login_roles(&self) -> Result<(), ServerError> {
        for role in [APP_ROLE, baton::backends::pg_lease::LEASE_ROLE] {
            let password = self.password(role)?.replace('\'', "''");
            self.psql(
                "postgres",
                &format!(
                    "DO $$ BEGIN
                       IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
                         CREATE ROLE {role} LOGIN;
                       END IF;
                     END $$;
                     ALTER ROLE {role} LOGIN PASSWORD '{password}';"
                ),
            )?;
        }
        Ok(())
    }

    /// `pg_ctl start`, waiting until the server accepts connections, logging to
    /// `root/postgres.log`. On failure the log says why (a port taken, a lock file, memory); the
    /// caller's temp dir may be gone by the time anyone reads it, so its tail goes into the error.
    fn pg_ctl_start(&self, root: &Path, what: &str) -> Result<(), ServerError> {
        let log = root.join("postgres.log");
        let out = self
            .as_postgres("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60", "start"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| ServerError::Io(what.into(), e))?;
        if out.status.success() {
            return Ok(());
        }
        Err(ServerError::Failed {
            what: what.into(),
            detail: format!(
                "{}{} (log: {}, last lines:\n{})",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                log.display(),
                log_tail(&log, 12)
            ),
        })
    }

    fn as_postgres(&self, bin: &str) -> Command {
        let exe = self.bin_dir.join(bin);
        if is_root() {
            let mut c = Command::new("runuser");
            c.arg("-u").arg("postgres").arg("--").arg(exe);
            c
        } else {
            Command::new(exe)
        }
    }

    /// initdb (first time only) and start, then create the `baton` database.
    pub fn start(root: &Path, port: u16) -> Result<PgServer, ServerError> {
        PgServer::start_on(root, port, &[])
    }

    /// [`PgServer::start`] on a free loopback port. A port picked free can be taken again before
    /// the server binds it (by any client's outgoing connection, from the same ephemeral range),
    /// so a start that failed on "Address already in use" is tried again on another port.
    pub fn start_on_free_port(root: &Path) -> Result<PgServer, ServerError> {
        let mut tries = 0;
        loop {
            let port = free_ports(1).map_err(|e| ServerError::Io("free port".into(), e))?[0];
            match PgServer::start(root, port) {
                Err(ServerError::Failed { what, detail })
                    if detail.contains("Address already in use") && tries < 3 =>
                {
                    tries += 1;
                    tracing::warn!(
                        port,
                        "{what}: port taken before PostgreSQL bound it; another port"
                    );
                }
                other => return other,
            }
        }
    }

    /// [`PgServer::start`], also listening on `extra_listen` (a `--netns` fleet's bridge
    /// addresses), with trust auth for clients on each one's /24 (our namespaces).
    pub fn start_on(
        root: &Path,
        port: u16,
        extra_listen: &[std::net::IpAddr],
    ) -> Result<PgServer, ServerError> {
        PgServer::start_inner(root, port, extra_listen, None)
    }

    /// [`PgServer::start`] with `ssl = on`, serving `tls`'s certificate; every role but the
    /// superuser must then connect over TLS (`hostssl`, see [`HBA_TLS_HEAD`]).
    pub fn start_tls(root: &Path, port: u16, tls: &ServerTls) -> Result<PgServer, ServerError> {
        PgServer::start_inner(root, port, &[], Some(tls))
    }

    fn start_inner(
        root: &Path,
        port: u16,
        extra_listen: &[std::net::IpAddr],
        tls: Option<&ServerTls>,
    ) -> Result<PgServer, ServerError> {
        let pg = PgServer {
            port,
            root: root.to_owned(),
            bin_dir: pg_bin_dir()?,
        };
        let io = |what: &str| {
            let what = what.to_owned();
            move |e| ServerError::Io(what, e)
        };
        fs::create_dir_all(root.join("sock")).map_err(io("pg dir"))?;
        open_up(root)?;
        if !pg.data_dir().join("PG_VERSION").exists() {
            fs::create_dir_all(pg.data_dir()).map_err(io("pg data dir"))?;
            chown_to_postgres(root)?;
            pg.make_passwords()?;
            // The superuser's password goes in through a file only initdb reads, then is removed.
            let pwfile = root.join("initdb.pw");
            fs::write(&pwfile, pg.password(SUPERUSER)?).map_err(io("initdb pwfile"))?;
            chown_to_postgres(&pwfile)?;
            let out = pg
                .as_postgres("initdb")
                .args([
                    // Unix socket: only the postgres OS user, as itself (peer). TCP: passwords.
                    "--auth-local=peer",
                    "--auth-host=scram-sha-256",
                    "--pwfile",
                ])
                .arg(&pwfile)
                .args(["-U", "postgres", "-E", "UTF8", "--no-sync", "-D"])
                .arg(pg.data_dir())
                .output()
                .map_err(io("initdb"))?;
            let _ = fs::remove_file(&pwfile);
            if !out.status.success() {
                return Err(ServerError::Failed {
                    what: "initdb".into(),
                    detail: String::from_utf8_lossy(&out.stderr).into_owned(),
                });
            }
        }
        let listen: Vec<String> = std::iter::once("127.0.0.1".to_string())
            .chain(extra_listen.iter().map(|a| a.to_string()))
            .collect();
        let hba = pg.data_dir().join("pg_hba.conf");
        for a in extra_listen {
            let line = match a {
                std::net::IpAddr::V4(v4) => {
                    let o = v4.octets();
                    format!("host all all {}.{}.{}.0/24 scram-sha-256", o[0], o[1], o[2])
                }
                std::net::IpAddr::V6(v6) => format!("host all all {v6}/128 scram-sha-256"),
            };
            let cur = fs::read_to_string(&hba).map_err(io("pg_hba.conf"))?;
            if !cur.lines().any(|l| l.trim() == line) {
                fs::write(&hba, format!("{cur}\n{line}\n")).map_err(io("pg_hba.conf"))?;
            }
        }
        // max_connections: every led shard's sequencer commits on a connection of its own
        // (issue 28), so a 9-node fleet at K = 256 under load holds ~256 sequencer connections
        // plus each node's pools; 200 turned such fleets' terms away at their first commit.
        let mut conf = format!(
            "listen_addresses = '{}'\nport = {port}\nunix_socket_directories = '{}'\nmax_connections = 1000\nshared_buffers = '256MB'\nfsync = on\nsynchronous_commit = on\nlog_min_messages = warning\n",
            listen.join(","),
            root.join("sock").display()
        );
        if let Some(tls) = tls {
            conf.push_str(&pg.install_tls(tls)?);
        }
        fs::write(pg.data_dir().join("postgresql.auto.conf"), conf)
            .map_err(io("postgresql.auto.conf"))?;
        chown_to_postgres(root)?;
        pg.pg_ctl_start(root, "pg_ctl start")?;
        pg.psql(
            "postgres",
            "SELECT 1 FROM pg_database WHERE datname = 'baton'",
        )
        .and_then(|found| {
            if found.trim().is_empty() {
                pg.psql("postgres", "CREATE DATABASE baton").map(drop)
            } else {
                Ok(())
            }
        })?;
        pg.make_login_roles()?;
        Ok(pg)
    }

    /// Copies `tls`'s files into the server's root (the server reads them as the postgres OS
    /// user, and refuses a key readable by others: 0600), puts [`HBA_TLS_HEAD`] at the head of
    /// pg_hba.conf once, and returns the postgresql.conf lines that turn TLS on.
    fn install_tls(&self, tls: &ServerTls) -> Result<String, ServerError> {
        let dir = self.root.join("tls");
        let io = |what: String| move |e| ServerError::Io(what, e);
        fs::create_dir_all(&dir).map_err(io(dir.display().to_string()))?;
        let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
        fs::copy(&tls.cert_file, &cert).map_err(io(tls.cert_file.display().to_string()))?;
        fs::copy(&tls.key_file, &key).map_err(io(tls.key_file.display().to_string()))?;
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600))
            .map_err(io(key.display().to_string()))?;
        // Owned by postgres with the rest of the root (chown -R before the server starts).
        let hba = self.data_dir().join("pg_hba.conf");
        let cur = fs::read_to_string(&hba).map_err(io("pg_hba.conf".into()))?;
        if !cur.starts_with(HBA_TLS_HEAD) {
            fs::write(&hba, format!("{HBA_TLS_HEAD}{cur}")).map_err(io("pg_hba.conf".into()))?;
        }
        Ok(format!(
            "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
            cert.display(),
            key.display()
        ))
    }

    /// Runs SQL with psql as the superuser; returns its unaligned output. The SQL goes in on
    /// stdin and the password in the environment, so neither shows in the process list.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, ServerError> {
        use std::io::Write;
        let mut child = Command::new(self.bin_dir.join("psql"))
            .env("PGPASSWORD", self.password(SUPERUSER)?)
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-p",
            ])
            .arg(self.port.to_string())
            .arg("-d")
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| ServerError::Io("psql".into(), e))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(sql.as_bytes())
                .map_err(|e| ServerError::Io("psql stdin".into(), e))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| ServerError::Io("psql".into(), e))?;
        if !out.status.success() {
            return Err(ServerError::Failed {
                what: format!("psql {sql:?}"),
                detail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn postmaster_pid(&self) -> Option<u32> {
        fs::read_to_string(self.data_dir().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// `kill -9` of the postmaster and every process it forked (a crash: no shutdown
    /// checkpoint; the restart runs crash recovery). Returns the pids killed, once all are gone.
    pub fn kill9(&self) -> Result<Vec<u32>, ServerError> {
        let Some(pm) = self.postmaster_pid().filter(|p| pid_alive(*p)) else {
            return Err(ServerError::Failed {
                what: "kill -9 PostgreSQL".into(),
                detail: "no running postmaster".into(),
            });
        };
        let mut pids = children_of(pm);
        pids.insert(0, pm);
        for &p in &pids {
            // SAFETY: kill(2) on the server we started and its own children.
            unsafe { libc::kill(p as i32, libc::SIGKILL) };
        }
        let until = Instant::now() + Duration::from_secs(10);
        while pids.iter().any(|p| pid_alive(*p)) {
            if Instant::now() > until {
                return Err(ServerError::Failed {
                    what: "kill -9 PostgreSQL".into(),
                    detail: format!("processes {pids:?} survived SIGKILL"),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // The postmaster was double-forked away from us: its zombie waits for whoever reaps
        // orphans here, and while it exists PostgreSQL's lock checks (kill(pid, 0)) take it for
        // a running server and refuse to start. Every process of the server is dead, so its
        // lock files (data dir and socket) are stale: remove them.
        if self.postmaster_pid() == Some(pm) {
            let _ = fs::remove_file(self.data_dir().join("postmaster.pid"));
        }
        let sock = self.root.join("sock");
        let _ = fs::remove_file(sock.join(format!(".s.PGSQL.{}.lock", self.port)));
        let _ = fs::remove_file(sock.join(format!(".s.PGSQL.{}", self.port)));
        Ok(pids)
    }

    /// Fast shutdown (SIGINT to the postmaster), SIGKILL after a grace period.
    pub fn stop(&self) {
        if let Some(pid) = self.postmaster_pid() {
            stop_pid(pid, libc::SIGINT, Duration::from_secs(10));
        }
    }

    /// A streaming standby of this (running) server in `root`, listening on `port`: a base
    /// backup taken over the primary's Unix socket (the postgres OS user, peer auth), started in
    /// recovery, streaming from the primary. With `sync`, the primary then waits for it on every
    /// commit (`synchronous_standby_names = '*'`, `synchronous_commit = on`: the commit is on
    /// the standby's disk before the client hears of it). Returns once the primary reports the
    /// standby streaming (and, with `sync`, as the synchronous one).
    pub fn start_standby(
        &self,
        root: &Path,
        port: u16,
        sync: bool,
    ) -> Result<PgServer, ServerError> {
        let io = |what: &str| {
            let what = what.to_owned();
            move |e| ServerError::Io(what, e)
        };
        let standby = PgServer {
            port,
            root: root.to_owned(),
            bin_dir: self.bin_dir.clone(),
        };
        fs::create_dir_all(root.join("sock")).map_err(io("standby dir"))?;
        open_up(root)?;
        // The same roles and passwords: the standby is a copy of the primary.
        let secrets = root.join("secrets");
        fs::create_dir_all(&secrets).map_err(io("standby secrets"))?;
        for entry in fs::read_dir(self.root.join("secrets")).map_err(io("primary secrets"))? {
            let entry = entry.map_err(io("primary secrets"))?;
            fs::copy(entry.path(), secrets.join(entry.file_name())).map_err(io("copy secret"))?;
        }
        chown_to_postgres(root)?;
        let out = self
            .as_postgres("pg_basebackup")
            .arg("-h")
            .arg(self.root.join("sock"))
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-X",
                "stream",
                "-R",
            ])
            // A fast checkpoint: the default spreads it over minutes.
            .args(["--checkpoint=fast", "-D"])
            .arg(standby.data_dir())
            .stdin(Stdio::null())
            .output()
            .map_err(io("pg_basebackup"))?;
        if !out.status.success() {
            return Err(ServerError::Failed {
                what: "pg_basebackup".into(),
                detail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        // The copied settings name the primary's port and socket: the standby's own instead,
        // keeping the primary_conninfo that -R appended.
        let auto = standby.data_dir().join("postgresql.auto.conf");
        let conf = fs::read_to_string(&auto).map_err(io("standby postgresql.auto.conf"))?;
        let own: String = conf
            .lines()
            .map(|l| {
                if l.starts_with("port =") {
                    format!("port = {port}")
                } else if l.starts_with("unix_socket_directories =") {
                    format!(
                        "unix_socket_directories = '{}'",
                        root.join("sock").display()
                    )
                } else {
                    l.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        fs::write(&auto, own + "\n").map_err(io("standby postgresql.auto.conf"))?;
        chown_to_postgres(root)?;
        standby.pg_ctl_start(root, "pg_ctl start (standby)")?;
        if sync {
            self.psql(
                "postgres",
                "ALTER SYSTEM SET synchronous_standby_names = '*'; \
                 ALTER SYSTEM SET synchronous_commit = 'on'; SELECT pg_reload_conf();",
            )?;
        }
        let wanted = if sync { "sync" } else { "async" };
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let state = self.psql(
                "postgres",
                "SELECT state || ' ' || sync_state FROM pg_stat_replication",
            )?;
            if state.trim() == format!("streaming {wanted}") {
                return Ok(standby);
            }
            if Instant::now() > until {
                return Err(ServerError::Failed {
                    what: "standby".into(),
                    detail: format!("not streaming ({wanted}) within 30 s: {state:?}"),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// This server's children whose command line (the process title PostgreSQL sets) contains
    /// `what`: `walsender` on a primary, `walreceiver` on a standby.
    pub fn children_named(&self, what: &str) -> Vec<u32> {
        let Some(pm) = self.postmaster_pid() else {
            return Vec::new();
        };
        children_of(pm)
            .into_iter()
            .filter(|p| {
                fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(what))
            })
            .collect()
    }

    /// Promotes this standby to primary (`pg_ctl promote`, waiting until it accepts writes).
    pub fn promote(&self) -> Result<(), ServerError> {
        let out = self
            .as_postgres("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-w", "-t", "60", "promote"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| ServerError::Io("pg_ctl promote".into(), e))?;
        if !out.status.success() {
            return Err(ServerError::Failed {
                what: "pg_ctl promote".into(),
                detail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(())
    }

    /// A URL for `role` that names every server in `servers` (`host1:p1,host2:p2`) and asks for
    /// the one that accepts writes (`target_session_attrs=read-write`): clients find a promoted
    /// standby by themselves.
    pub fn multi_host_url(servers: &[&PgServer], role: &str) -> Result<String, ServerError> {
        let first = servers.first().ok_or(ServerError::Failed {
            what: "multi-host URL".into(),
            detail: "no server".into(),
        })?;
        let hosts: Vec<String> = servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        Ok(format!(
            "postgres://{role}:{}@{}/baton?target_session_attrs=read-write",
            first.password(role)?,
            hosts.join(",")
        ))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EtcdMember {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub pid: u32,
    /// When `pid` started ([`start_ticks`]).
    #[serde(default)]
    pub started_ticks: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EtcdCluster {
    pub root: PathBuf,
    pub members: Vec<EtcdMember>,
    pub heartbeat_ms: u64,
    pub election_ms: u64,
    /// `--initial-cluster-token` (a restarted member needs the same flags).
    #[serde(default)]
    pub cluster_token: String,
    /// A `--netns` fleet's election address the client ports also listen on.
    #[serde(default)]
    pub extra_listen: Option<std::net::IpAddr>,
    /// Set when the client ports speak TLS only (peers stay plain, on loopback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTls>,
}

impl EtcdCluster {
    /// The members' client URLs (`https://` for a TLS cluster).
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("{}://127.0.0.1:{}", self.client_scheme(), m.client_port))
            .collect()
    }

    fn client_scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// [`EtcdCluster::start`] with the client ports serving TLS only, with `tls`'s certificate.
    pub fn start_tls(
        root: &Path,
        n: usize,
        heartbeat_ms: u64,
        election_ms: u64,
        tls: &ServerTls,
    ) -> Result<EtcdCluster, ServerError> {
        EtcdCluster::start_inner(root, n, heartbeat_ms, election_ms, None, Some(tls))
    }

    /// Starts an `n`-member cluster. etcd's minimum lease TTL is 1.5 × its election timeout, so
    /// short-TTL experiments pass smaller `heartbeat_ms`/`election_ms`.
    pub fn start(
        root: &Path,
        n: usize,
        heartbeat_ms: u64,
        election_ms: u64,
    ) -> Result<EtcdCluster, ServerError> {
        EtcdCluster::start_on(root, n, heartbeat_ms, election_ms, None)
    }

    /// [`EtcdCluster::start`] with the client ports also listening on `extra_listen` (a
    /// `--netns` fleet's election address); peers and advertised URLs stay on loopback.
    pub fn start_on(
        root: &Path,
        n: usize,
        heartbeat_ms: u64,
        election_ms: u64,
        extra_listen: Option<std::net::IpAddr>,
    ) -> Result<EtcdCluster, ServerError> {
        EtcdCluster::start_inner(root, n, heartbeat_ms, election_ms, extra_listen, None)
    }

    fn start_inner(
        root: &Path,
        n: usize,
        heartbeat_ms: u64,
        election_ms: u64,
        extra_listen: Option<std::net::IpAddr>,
        tls: Option<&ServerTls>,
    ) -> Result<EtcdCluster, ServerError> {
        let etcd = which("etcd").ok_or(ServerError::Missing {
            what: "etcd (Debian package etcd-server)".into(),
            hint: INSTALL_HINT,
        })?;
        let ports = free_ports(2 * n).map_err(|e| ServerError::Io("free ports".into(), e))?;
        fs::create_dir_all(root).map_err(|e| ServerError::Io(root.display().to_string(), e))?;
        let names: Vec<String> = (0..n).map(|i| format!("e{i}")).collect();
        let token = format!(
            "baton-{}-{}",
            std::process::id(),
            baton::clock::monotonic_ns()
        );
        let mut cluster = EtcdCluster {
            root: root.to_owned(),
            members: names
                .iter()
                .enumerate()
                .map(|(i, name)| EtcdMember {
                    name: name.clone(),
                    client_port: ports[2 * i],
                    peer_port: ports[2 * i + 1],
                    pid: 0,
                    started_ticks: None,
                })
                .collect(),
            heartbeat_ms,
            election_ms,
            cluster_token: token,
            extra_listen,
            tls: tls.cloned(),
        };
        for i in 0..n {
            cluster.spawn_member(&etcd, i)?;
        }
        cluster.wait_healthy(Duration::from_secs(30))?;
        Ok(cluster)
    }

    fn wait_healthy(&self, within: Duration) -> Result<(), ServerError> {
        let etcdctl = which("etcdctl").ok_or(ServerError::Missing {
            what: "etcdctl (Debian package etcd-client)".into(),
            hint: INSTALL_HINT,
        })?;
        let until = Instant::now() + within;
        loop {
            let mut probe = Command::new(&etcdctl);
            if let Some(tls) = &self.tls {
                probe.arg("--cacert").arg(&tls.ca_file);
            }
            let ok = probe
                .env("ETCDCTL_API", "3")
                .arg("--endpoints")
                .arg(self.endpoints().join(","))
                .args(["--command-timeout=2s", "endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return Ok(());
            }
            if Instant::now() > until {
                return Err(ServerError::NotReady(
                    "etcd cluster".into(),
                    self.root.clone(),
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts member `i` with its data dir (a restart reuses it: the initial-cluster flags are
    /// then ignored by etcd, but must still be well-formed).
    fn spawn_member(&mut self, etcd: &Path, i: usize) -> Result<(), ServerError> {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let m = &self.members[i];
        let (cp, pp) = (m.client_port, m.peer_port);
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut cmd = Command::new(etcd);
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(self.root.join(&m.name))
            .arg("--listen-client-urls")
            .arg(match self.extra_listen {
                Some(ip) => format!("{scheme}://127.0.0.1:{cp},{scheme}://{ip}:{cp}"),
                None => format!("{scheme}://127.0.0.1:{cp}"),
            })
            .arg("--advertise-client-urls")
            .arg(format!("{scheme}://127.0.0.1:{cp}"))
            .arg("--listen-peer-urls")
            .arg(format!("http://127.0.0.1:{pp}"))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://127.0.0.1:{pp}"))
            .arg("--initial-cluster")
            .arg(initial.join(","))
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            .arg(&self.cluster_token)
            .arg("--heartbeat-interval")
            .arg(self.heartbeat_ms.to_string())
            .arg("--election-timeout")
            .arg(self.election_ms.to_string())
            .arg("--log-level")
            .arg("warn")
            .arg("--logger")
            .arg("zap");
        if let Some(tls) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&tls.cert_file)
                .arg("--key-file")
                .arg(&tls.key_file);
        }
        let log = self.root.join(format!("{}.log", m.name));
        self.members[i].pid = spawn_detached(&mut cmd, &log)?;
        self.members[i].started_ticks = spawned_ticks(self.members[i].pid);
        Ok(())
    }

    /// `kill -9` of member `i`; true once its process is gone.
    pub fn kill_member(&self, i: usize) -> bool {
        let pid = self.members[i].pid;
        stop_pid(pid, libc::SIGKILL, Duration::from_secs(5));
        !pid_alive(pid)
    }

    /// Starts a killed member again with its data; waits until the cluster is healthy.
    pub fn restart_member(&mut self, i: usize) -> Result<(), ServerError> {
        if pid_alive(self.members[i].pid) {
            self.kill_member(i);
        }
        let etcd = which("etcd").ok_or(ServerError::Missing {
            what: "etcd (Debian package etcd-server)".into(),
            hint: INSTALL_HINT,
        })?;
        self.spawn_member(&etcd, i)?;
        self.wait_healthy(Duration::from_secs(30))
    }

    /// The member that is etcd's raft leader now (asked with `etcdctl endpoint status`).
    pub fn leader_index(&self) -> Option<usize> {
        let etcdctl = which("etcdctl")?;
        let out = Command::new(etcdctl)
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(self.endpoints().join(","))
            .args(["--command-timeout=1s", "endpoint", "status", "-w", "json"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let rows = v.as_array()?;
        let leader = rows.iter().find_map(|r| r["Status"]["leader"].as_u64())?;
        let ep = rows
            .iter()
            .find(|r| r["Status"]["header"]["member_id"].as_u64() == Some(leader))?["Endpoint"]
            .as_str()?
            .to_owned();
        self.endpoints().iter().position(|e| *e == ep)
    }

    pub fn stop(&self) {
        for m in &self.members {
            stop_pid(m.pid, libc::SIGTERM, Duration::from_secs(5));
        }
    }
}

/// A private PostgreSQL in its own temp dir, with the fence migrated (fencing on) and the
/// pg-lease role provisioned: what a test of the library starts. Stopped, and its dir removed,
/// on drop.
pub struct ScratchPg {
    /// The running server.
    pub server: PgServer,
    /// Its temp dir (the server lives in `pg/`; tests put node state beside it).
    pub dir: tempfile::TempDir,
}

impl ScratchPg {
    /// Starts, migrates and provisions it.
    pub async fn start() -> anyhow::Result<ScratchPg> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("pg");
        let server =
            tokio::task::spawn_blocking(move || PgServer::start_on_free_port(&root)).await??;
        let pg = ScratchPg { server, dir };
        baton::work::fence::migrate(&pg.server.admin_url(), Some(true)).await?;
        baton::backends::pg_lease::provision(&pg.server.admin_url()).await?;
        Ok(pg)
    }
}

impl Drop for ScratchPg {
    fn drop(&mut self) {
        self.server.stop();
    }
}

#[cfg(test)]
mod port_tests {
    use super::*;

    /// Distinct, below the ephemeral range (so no outgoing connection can hold one), and free.
    #[test]
    fn free_ports_are_distinct_free_and_below_the_ephemeral_range() {
        let (lo, hi) = listen_port_range();
        let ports = free_ports(50).unwrap();
        let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), 50, "{ports:?}");
        for p in &ports {
            assert!((lo..=hi).contains(p), "{p} outside {lo}..={hi}");
            std::net::TcpListener::bind(("127.0.0.1", *p)).expect("a picked port is free");
        }
        let ephemeral_start: u16 = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            hi < ephemeral_start,
            "{hi} is inside the ephemeral range from {ephemeral_start}"
        );
    }
}
