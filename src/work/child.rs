//! An external program, in any language, as leader work: it runs while (and only while) this
//! node leads, and its stop is a barrier the lease release waits for.
//!
//! ```no_run
//! # async fn demo(cfg: baton::config::NodeConfig) -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use baton::work::child::{ChildSpec, ChildWork};
//!
//! let spec = ChildSpec {
//!     command: vec!["python3".into(), "job.py".into()],
//!     stop_timeout: Duration::from_secs(2),
//!     database_url: Some(cfg.resource.database_url.clone()),
//! };
//! let node = baton::node::NodeBuilder::new(cfg) // work_stop_timeout_ms >= 3000 (2 s + the kill)
//!     .with_work(Arc::new(ChildWork::new(spec)?))
//!     .start()
//!     .await?;
//! # node.shutdown().await }
//! ```
//!
//! What the program gets, and what it can rely on:
//! - It starts only with a token: env `BATON_TOKEN`, `BATON_HOLDER` (the holder the fence records),
//!   `BATON_NODE_ID`, `BATON_SHARD` with `BATON_RESOURCE_SUFFIX` (`""` on shard 0, `#S` on shard
//!   S of a sharded fleet: append it to every fenced resource name), and `BATON_DATABASE_URL`
//!   (the protected resource, application role). It
//!   fences its own writes with `baton.fence_assert(resource, $BATON_TOKEN, $BATON_HOLDER)` inside
//!   each transaction (see `examples/fenced_child.py`). Its stdin is `/dev/null`; stdout and
//!   stderr are the node's.
//! - It runs in its own process group. On demotion (lease lost, watchdog deadline, step-down,
//!   shutdown) the whole group gets SIGTERM; after [`ChildSpec::stop_timeout`] it gets SIGKILL;
//!   then the node waits until no process of the group is left (polling `kill(-pgid, 0)` until
//!   ESRCH, reaping what it can, and counting zombies as gone) and only then releases the lease.
//!   This is the checkpoint step of checkpoint → stop → release, so the supervisor's bound
//!   (`work_stop_timeout_ms`) must cover it: [`LeaderWork::stop_bound`] makes the node refuse to
//!   start otherwise. With `work_stop_margin_ms` > `stop_timeout` + the kill, the watchdog demotes
//!   early enough that the group is gone before the lease could expire.
//! - If this node's process dies (kill -9), the kernel SIGKILLs the program itself
//!   (`PR_SET_PDEATHSIG`), and a one-line sentinel shell, blocked reading a pipe only this process
//!   holds, sees EOF and SIGKILLs the rest of the group (grandchildren). What is not covered: a
//!   process that leaves the group (`setsid`, a daemonizing fork), and the whole machine dying
//!   mid-write. For those, and for a paused machine, the fence is what makes a stale write harmless.
//! - If it exits on its own, what is left of its group is stopped the same way, the exit status is
//!   logged and traced, and the work's [`SupervisionPolicy`](super::SupervisionPolicy) decides:
//!   restart in the same term (same token) or demote.
//!
//! Every step is in the actor trace (`child-started`, `child-term-sent`, `child-kill-sent`,
//! `child-exited`, `child-gone`) with the pid and the token, so "old program gone → new program
//! started" can be audited across nodes. `child-started` and `child-gone` also carry the time
//! left before the watchdog's deadline (`before_watchdog_deadline_ms`) and, given
//! [`ChildWork::with_lease_expiry_after_deadline`] (as `baton run` does), before the lease's own
//! expiry (`before_lease_expiry_ms`): the promise is that the latter is positive at
//! `child-gone` on every path but a paused node.

use std::ffi::OsString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef};
use tokio::sync::watch;

use super::{LeaderWork, RunningWork, WorkContext, WorkError};
use crate::clock::monotonic_ns;
use crate::elector::FenceToken;
use crate::leadership::Leadership;
use crate::metrics as m;
use crate::tasks::AbortOnDrop;
use crate::trace::ActorTrace;

/// Time given to SIGKILL to take effect and to the group to be reaped, on top of the stop timeout.
pub const KILL_GRACE: Duration = Duration::from_secs(1);
/// How often a running program is checked for having exited on its own.
const EXIT_POLL: Duration = Duration::from_millis(20);
/// How often a stopping group is checked for being gone.
const GONE_POLL: Duration = Duration::from_millis(5);
/// The work's name in the trace and in metrics.
const NAME: &str = "child";
/// Environment variables of the node that the program must not inherit (secrets).
const SECRET_ENV: &[&str] = &["BATON_ADMIN_TOKEN"];

/// What to run and how long it may take to stop.
#[derive(Clone, Debug)]
pub struct ChildSpec {
    /// The program and its arguments (`command[0]` is looked up in `PATH`).
    pub command: Vec<OsString>,
    /// How long the group has between SIGTERM and SIGKILL.
    pub stop_timeout: Duration,
    /// Passed as `BATON_DATABASE_URL`: the protected resource, as the application role.
    pub database_url: Option<String>,
}

/// Why a [`ChildWork`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// `command` was empty.
    #[error("no command to run")]
    NoCommand,
    /// A zero stop timeout would SIGKILL the program without giving it a chance to drain.
    #[error("stop timeout must be greater than 0")]
    ZeroStopTimeout,
}

/// An external program as a [`LeaderWork`] (see the module docs).
pub struct ChildWork {
    spec: ChildSpec,
    /// See [`ChildWork::with_lease_expiry_after_deadline`].
    lease_expiry_after_deadline: Option<Duration>,
}

impl ChildWork {
    /// Checks `spec` and wraps it.
    pub fn new(spec: ChildSpec) -> Result<ChildWork, ChildError> {
        if spec.command.is_empty() {
            return Err(ChildError::NoCommand);
        }
        if spec.stop_timeout.is_zero() {
            return Err(ChildError::ZeroStopTimeout);
        }
        Ok(ChildWork {
            spec,
            lease_expiry_after_deadline: None,
        })
    }

    /// How long after the watchdog's deadline the lease itself can expire
    /// ([`NodeConfig::lease_expiry_after_watchdog_deadline`](crate::config::NodeConfig::lease_expiry_after_watchdog_deadline)
    /// of the node's config). With it, `child-started` and `child-gone` also report the time
    /// left before the lease's expiry (`before_lease_expiry_ms`), the bound the stop promises
    /// to beat; without it only the watchdog's deadline is known.
    pub fn with_lease_expiry_after_deadline(mut self, after: Duration) -> ChildWork {
        self.lease_expiry_after_deadline = Some(after);
        self
    }

    fn command(&self, ctx: &WorkContext) -> Command {
        let mut cmd = Command::new(&self.spec.command[0]);
        cmd.args(&self.spec.command[1..])
            .env("BATON_TOKEN", ctx.token.0.to_string())
            .env("BATON_HOLDER", &ctx.node_id)
            .env("BATON_NODE_ID", &ctx.node_id)
            // Sharded fleets: which shard this term is of, and the suffix its fenced resource
            // names carry (`fence_assert('orders' || $BATON_RESOURCE_SUFFIX, ...)`).
            .env("BATON_SHARD", ctx.shard.0.to_string())
            .env("BATON_RESOURCE_SUFFIX", ctx.shard.resource(""))
            .stdin(Stdio::null());
        for k in SECRET_ENV {
            cmd.env_remove(k);
        }
        if let Some(url) = &self.spec.database_url {
            cmd.env("BATON_DATABASE_URL", url);
        }
        cmd
    }
}

#[async_trait]
impl LeaderWork for ChildWork {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn start(&self, ctx: WorkContext) -> Result<Box<dyn RunningWork>, WorkError> {
        let start_err = |e: io::Error| WorkError::Start {
            work: NAME,
            reason: format!("{:?}: {e}", self.spec.command[0]),
        };
        let group = spawn_group(self.command(&ctx)).map_err(start_err)?;
        let pid = group.pgid;
        metrics::gauge!(m::CHILD_PID, "shard" => ctx.shard.0.to_string()).set(f64::from(pid));
        let deadline =
            deadline_detail(&ctx.leadership, ctx.token, self.lease_expiry_after_deadline);
        ctx.trace.step(
            NAME,
            "child-started",
            Some(ctx.token),
            &format!("pid={pid}{deadline}"),
        );
        tracing::info!(pid, token = ctx.token.0, "started the leader program");
        let (stop_tx, stop_rx) = watch::channel(false);
        let (gone_tx, gone_rx) = watch::channel(false);
        let keeper = Keeper {
            group,
            token: ctx.token,
            trace: ctx.trace.clone(),
            leadership: ctx.leadership.clone(),
            shard: ctx.shard,
            stop_timeout: self.spec.stop_timeout,
            lease_expiry_after_deadline: self.lease_expiry_after_deadline,
        };
        let args = ChildArgs {
            keeper: Some(keeper),
            stop_rx,
            gone_tx,
            stop_tx: stop_tx.clone(),
            gone_rx: gone_rx.clone(),
            stop_timeout: self.spec.stop_timeout,
        };
        // On failure the args (and the keeper's group) are dropped: the group is SIGKILLed.
        let (actor, _) = Actor::spawn_linked(None, ChildActor, args, ctx.supervisor)
            .await
            .map_err(|e| WorkError::Start {
                work: NAME,
                reason: e.to_string(),
            })?;
        Ok(Box::new(RunningChild {
            cell: actor.get_cell(),
            stop_tx,
            gone_rx,
        }))
    }

    fn stop_bound(&self) -> Option<Duration> {
        Some(self.spec.stop_timeout + KILL_GRACE)
    }
}

/// Makes this process a child subreaper (`PR_SET_CHILD_SUBREAPER`): orphaned grandchildren of
/// the program are reparented here instead of to PID 1, so [`ChildWork`] reaps them. Worth
/// calling in a process whose PID 1 does not reap (many containers); the barrier is correct
/// without it (zombies count as gone), they only linger. Process-wide: call it once, early.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

struct RunningChild {
    cell: ActorCell,
    stop_tx: watch::Sender<bool>,
    gone_rx: watch::Receiver<bool>,
}

#[async_trait]
impl RunningWork for RunningChild {
    fn name(&self) -> &'static str {
        NAME
    }

    fn cell(&self) -> ActorCell {
        self.cell.clone()
    }

    /// The stop barrier: SIGTERM to the group, SIGKILL after the stop timeout, and return only
    /// once every process of the group is gone. The supervisor bounds this wait by
    /// `work_stop_timeout_ms`, which the node checked covers [`ChildWork::stop_bound`].
    async fn checkpoint(&self) -> Result<(), WorkError> {
        let _ = self.stop_tx.send(true);
        let mut gone = self.gone_rx.clone();
        let _ = gone.wait_for(|g| *g).await;
        Ok(())
    }
}

/// A running program's process group, and the sentinel that kills it if this process dies.
struct Group {
    /// The program's pid, which is also its process group id.
    pgid: i32,
    /// The program's wait status once reaped.
    status: Option<i32>,
    _sentinel: Option<Sentinel>,
}

impl Group {
    /// Reaps every exited member of the group that is our child (the program; its orphans too
    /// when this process is a subreaper), remembering the program's own status.
    fn reap(&mut self) {
        loop {
            let mut status = 0;
            // SAFETY: waitpid on our own process group, non-blocking, into a local.
            let pid = unsafe { libc::waitpid(-self.pgid, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            if pid == self.pgid {
                self.status = Some(status);
            }
        }
    }

    /// Whether any process of the group is still running (zombies are gone: they run nothing).
    fn alive(&mut self) -> bool {
        self.reap();
        // SAFETY: signal 0 only checks for existence.
        if unsafe { libc::kill(-self.pgid, 0) } != 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        {
            return false;
        }
        // The program itself, unreaped, is running (a zombie program would have been reaped).
        self.status.is_none() || live_member(self.pgid)
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on the process group we created.
        unsafe { libc::kill(-self.pgid, sig) };
    }

    /// Polls until the group is gone or `within` has passed; whether it is gone.
    async fn wait_gone(&mut self, within: Option<Duration>) -> bool {
        let until = within.map(|d| Instant::now() + d);
        loop {
            if !self.alive() {
                return true;
            }
            if until.is_some_and(|u| Instant::now() >= u) {
                return false;
            }
            tokio::time::sleep(GONE_POLL).await;
        }
    }
}

impl Drop for Group {
    /// The last resort (the keeper was aborted, or the actor failed to spawn): SIGKILL whatever
    /// is left. Normally the group is long gone by now.
    fn drop(&mut self) {
        self.reap();
        if self.status.is_none() || live_member(self.pgid) {
            self.signal(libc::SIGKILL);
        }
    }
}

/// Whether `/proc` shows a process of group `pgid` that is not a zombie: what "the group is
/// gone" means for the stop barrier (a zombie runs nothing; it only waits to be reaped).
pub fn live_member(pgid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true; // cannot tell: assume it runs (the safe answer for a barrier)
    };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .any(|stat| stat_is_live_in(&stat, pgid))
}

/// Parses a `/proc/PID/stat` line: `pid (comm) STATE ppid pgrp ...` (comm may hold spaces and
/// parentheses, so fields are counted from the last `)`).
fn stat_is_live_in(stat: &str, pgid: i32) -> bool {
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next().unwrap_or("Z");
    let pgrp = fields.nth(1).and_then(|f| f.parse::<i32>().ok());
    pgrp == Some(pgid) && state != "Z" && state != "X"
}

/// Starts `cmd` as the leader of a new process group, with `PR_SET_PDEATHSIG = SIGKILL`, and a
/// sentinel that kills the group if this process dies.
fn spawn_group(mut cmd: Command) -> io::Result<Group> {
    // SAFETY: getpid is always safe.
    let parent = unsafe { libc::getpid() };
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0
                || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent died before the death signal was armed: never run orphaned.
            if libc::getppid() != parent {
                return Err(io::Error::other("baton exited while starting the program"));
            }
            Ok(())
        });
    }
    let child = on_spawner_thread(cmd)?;
    let pgid = i32::try_from(child.id()).map_err(io::Error::other)?;
    let sentinel = Sentinel::start(pgid)
        .inspect_err(
            |e| tracing::warn!(%e, "no sentinel: grandchildren survive a kill -9 of baton"),
        )
        .ok();
    Ok(Group {
        pgid,
        status: None,
        _sentinel: sentinel,
    })
}

/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process, and
/// tokio's blocking threads come and go: every program is forked from this one thread, which
/// lives as long as the process.
fn on_spawner_thread(cmd: Command) -> io::Result<std::process::Child> {
    type Job = (Command, mpsc::Sender<io::Result<std::process::Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let _ = std::thread::Builder::new()
            .name("baton-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            });
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .lock()
        .map_err(|_| io::Error::other("spawner lock poisoned"))?
        .send((cmd, reply_tx))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("the spawner thread is gone"))?
}

/// A shell in its own process group, blocked reading a pipe whose only writer is this process.
/// When this process dies, however it dies, the kernel closes the write end; `read` sees EOF and
/// the shell SIGKILLs the program's group (`PR_SET_PDEATHSIG` reaches only the program itself).
struct Sentinel {
    pid: i32,
    _write_end: OwnedFd,
}

impl Sentinel {
    fn start(pgid: i32) -> io::Result<Sentinel> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two fds we own; O_CLOEXEC keeps the write end out of every
        // program we start (a program holding it would keep the sentinel from ever seeing EOF).
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both fds were just created and are owned here only.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let mut cmd = Command::new("/bin/sh");
        cmd.args([
            "-c",
            r#"read -r _; kill -s KILL -- "-$1" 2>/dev/null"#,
            "baton-sentinel",
        ])
        .arg(pgid.to_string())
        .stdin(Stdio::from(read_end))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        // Its own group: a terminal's Ctrl-C (or a kill of the node's group) must not take the
        // sentinel down before the node has stopped the program.
        // SAFETY: setpgid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setpgid(0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        Ok(Sentinel {
            pid: i32::try_from(child.id()).map_err(io::Error::other)?,
            _write_end: write_end,
        })
    }
}

impl Drop for Sentinel {
    /// Kills the sentinel before its pipe closes, so it never fires at a group id that a new,
    /// unrelated process group may have taken after ours was gone.
    fn drop(&mut self) {
        // SAFETY: kill and waitpid on the sentinel we started; SIGKILL makes the wait short.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// Owns a running program's group for one start: watches for it to exit, and stops it.
struct Keeper {
    group: Group,
    token: FenceToken,
    trace: ActorTrace,
    leadership: Arc<Leadership>,
    /// The shard whose term this program serves (the `shard` label of its pid gauge).
    shard: crate::shard::ShardId,
    stop_timeout: Duration,
    lease_expiry_after_deadline: Option<Duration>,
}

/// How a program's run ended.
enum Ended {
    /// Demotion stopped it.
    Stopped,
    /// It exited on its own: its wait status.
    Exited(i32),
}

impl Keeper {
    /// Runs until the program exits or a stop is asked for, then stops the whole group.
    async fn run(mut self, mut stop_rx: watch::Receiver<bool>) -> Ended {
        let ended = loop {
            tokio::select! {
                _ = stop_rx.wait_for(|s| *s) => break Ended::Stopped,
                _ = tokio::time::sleep(EXIT_POLL) => {
                    self.group.reap();
                    if let Some(status) = self.group.status {
                        break Ended::Exited(status);
                    }
                }
            }
        };
        if let Ended::Exited(status) = ended {
            self.on_exit(status);
        }
        self.stop_group().await;
        ended
    }

    fn on_exit(&self, status: i32) {
        let (pid, how) = (self.group.pgid, describe_status(status));
        if status == 0 {
            tracing::info!(pid, %how, "the leader program exited");
        } else {
            tracing::warn!(pid, %how, "the leader program exited");
        }
        self.trace.step(
            NAME,
            "child-exited",
            Some(self.token),
            &format!("pid={pid} {how}"),
        );
    }

    /// SIGTERM, up to the stop timeout, SIGKILL, then wait until nothing of the group is left.
    async fn stop_group(&mut self) {
        let pid = self.group.pgid;
        let mut how = "exited";
        if self.group.alive() {
            self.group.signal(libc::SIGTERM);
            self.step("child-term-sent", &format!("pid={pid}"));
            how = "term";
            if !self.group.wait_gone(Some(self.stop_timeout)).await {
                self.group.signal(libc::SIGKILL);
                self.step(
                    "child-kill-sent",
                    &format!(
                        "pid={pid} stop_timeout_ms={}",
                        self.stop_timeout.as_millis()
                    ),
                );
                how = "kill";
                self.group.wait_gone(None).await;
            }
        }
        metrics::gauge!(m::CHILD_PID, "shard" => self.shard.0.to_string()).set(0.0);
        let status = self.group.status.map(describe_status).unwrap_or_default();
        let deadline = deadline_detail(
            &self.leadership,
            self.token,
            self.lease_expiry_after_deadline,
        );
        self.step(
            "child-gone",
            &format!("pid={pid} stopped_by={how} {status}{deadline}"),
        );
    }

    fn step(&self, event: &str, detail: &str) {
        self.trace.step(NAME, event, Some(self.token), detail);
    }
}

/// The time left, as of now, before the term's last watchdog deadline and (when known) before
/// the lease's own expiry: ` watchdog_deadline_mono_ns=D before_watchdog_deadline_ms=X` and
/// ` lease_expiry_mono_ns=E before_lease_expiry_ms=Y`. A negative figure: the step came after
/// it. The watchdog's deadline is the lease's expiry moved earlier by the node's margins
/// (`--child-stop-margin` among them), so X < 0 with Y > 0 is the margin doing its job; Y < 0
/// means the program outlived the lease (a paused node, where only the fence protects).
/// Nothing when the term never had a deadline.
fn deadline_detail(
    leadership: &Leadership,
    token: FenceToken,
    lease_expiry_after_deadline: Option<Duration>,
) -> String {
    let Some(deadline) = leadership.last_deadline(token) else {
        return String::new();
    };
    let (now, now_ns) = (Instant::now(), monotonic_ns() as i128);
    let ahead_ns = |at: Instant| match at.checked_duration_since(now) {
        Some(d) => d.as_nanos() as i128,
        None => -(now.duration_since(at).as_nanos() as i128),
    };
    let mut detail = String::new();
    let mut add = |name: &str, at: Instant| {
        let ns = ahead_ns(at);
        detail.push_str(&format!(
            " {name}_mono_ns={} before_{name}_ms={:.1}",
            now_ns + ns,
            ns as f64 / 1e6
        ));
    };
    add("watchdog_deadline", deadline);
    if let Some(after) = lease_expiry_after_deadline {
        add("lease_expiry", deadline + after);
    }
    detail
}

/// `exit=N` or `signal=N` for a wait status.
fn describe_status(status: i32) -> String {
    if libc::WIFEXITED(status) {
        format!("exit={}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("signal={}", libc::WTERMSIG(status))
    } else {
        format!("status={status}")
    }
}

struct ChildArgs {
    keeper: Option<Keeper>,
    stop_rx: watch::Receiver<bool>,
    gone_tx: watch::Sender<bool>,
    stop_tx: watch::Sender<bool>,
    gone_rx: watch::Receiver<bool>,
    stop_timeout: Duration,
}

enum ChildMsg {
    /// The program exited on its own (its group is stopped): its wait status.
    Exited(i32),
}

struct ChildState {
    /// Aborted with the actor (also when it is killed after the stop bound): the group is then
    /// SIGKILLed by its `Drop`.
    _keeper: AbortOnDrop,
    stop_tx: watch::Sender<bool>,
    gone_rx: watch::Receiver<bool>,
    stop_timeout: Duration,
}

struct ChildActor;

#[async_trait]
impl Actor for ChildActor {
    type Msg = ChildMsg;
    type State = ChildState;
    type Arguments = ChildArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ChildMsg>,
        mut args: ChildArgs,
    ) -> Result<ChildState, ActorProcessingErr> {
        let keeper = args.keeper.take().ok_or("a keeper per start")?;
        let (stop_rx, gone_tx) = (args.stop_rx, args.gone_tx);
        let task = tokio::spawn(async move {
            let ended = keeper.run(stop_rx).await;
            let _ = gone_tx.send(true);
            if let Ended::Exited(status) = ended {
                let _ = myself.cast(ChildMsg::Exited(status));
            }
        });
        Ok(ChildState {
            _keeper: AbortOnDrop(task),
            stop_tx: args.stop_tx,
            gone_rx: args.gone_rx,
            stop_timeout: args.stop_timeout,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<ChildMsg>,
        msg: ChildMsg,
        _state: &mut ChildState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ChildMsg::Exited(0) => myself.stop(Some("the program exited (exit=0)".into())),
            // Failing the actor tells the supervisor why; its policy decides what follows.
            ChildMsg::Exited(status) => {
                return Err(format!("the program exited ({})", describe_status(status)).into())
            }
        }
        Ok(())
    }

    /// A stop that did not come through [`RunningWork::checkpoint`] (a term that failed to
    /// start): run the same barrier, bounded, before the actor counts as stopped.
    async fn post_stop(
        &self,
        _myself: ActorRef<ChildMsg>,
        state: &mut ChildState,
    ) -> Result<(), ActorProcessingErr> {
        let _ = state.stop_tx.send(true);
        let mut gone = state.gone_rx.clone();
        let _ = tokio::time::timeout(state.stop_timeout + KILL_GRACE, gone.wait_for(|g| *g)).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_parsed_from_the_last_parenthesis() {
        assert!(stat_is_live_in("12 (sleep) S 1 40 40 0", 40));
        assert!(!stat_is_live_in("12 (sleep) Z 1 40 40 0", 40));
        assert!(!stat_is_live_in("12 (sleep) S 1 41 41 0", 40));
        assert!(stat_is_live_in("12 (a) b (c)) R 1 40 40 0", 40));
        assert!(!stat_is_live_in("garbage", 40));
    }

    #[test]
    fn specs_without_a_command_or_a_stop_timeout_are_refused() {
        let spec = |command: Vec<OsString>, ms| ChildSpec {
            command,
            stop_timeout: Duration::from_millis(ms),
            database_url: None,
        };
        assert!(matches!(
            ChildWork::new(spec(vec![], 100)),
            Err(ChildError::NoCommand)
        ));
        assert!(matches!(
            ChildWork::new(spec(vec!["true".into()], 0)),
            Err(ChildError::ZeroStopTimeout)
        ));
        let w = ChildWork::new(spec(vec!["true".into()], 100)).unwrap();
        assert_eq!(
            w.stop_bound(),
            Some(Duration::from_millis(100) + KILL_GRACE)
        );
    }

    /// The barrier itself, without a node: a group with grandchildren that ignore SIGTERM is
    /// gone (every process) when `stop_group` returns, and it took the stop timeout.
    #[tokio::test]
    async fn stop_group_leaves_no_process_of_a_forking_term_ignoring_program() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "trap '' TERM; sleep 1000 & sleep 1000 & wait"]);
        let group = spawn_group(cmd).unwrap();
        let pgid = group.pgid;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(live_member(pgid));
        let mut keeper = Keeper {
            group,
            token: FenceToken(1),
            trace: ActorTrace::disabled("t"),
            leadership: test_leadership(),
            shard: crate::shard::ShardId::ZERO,
            stop_timeout: Duration::from_millis(300),
            lease_expiry_after_deadline: None,
        };
        let t0 = Instant::now();
        keeper.stop_group().await;
        let took = t0.elapsed();
        assert!(!live_member(pgid), "a process of group {pgid} survived");
        assert!(
            took >= Duration::from_millis(300),
            "killed before the stop timeout: {took:?}"
        );
        assert!(took < Duration::from_secs(3), "{took:?}");
    }

    fn test_leadership() -> Arc<Leadership> {
        let (_tx, rx) = watch::channel(None);
        Arc::new(Leadership::new(
            "t".into(),
            None,
            crate::elector::BackendKind::Custom,
            rx,
        ))
    }
}
