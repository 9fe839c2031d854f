//! One fleet member, assembled: the supervision tree, the fenced resource, the registered leader
//! work and, optionally, baton's own HTTP server. [`NodeBuilder`] is the library entry point;
//! `baton node` is a thin wrapper over it.
//!
//! [`NodeBuilder::start`] returns a [`NodeHandle`]: ask it whether this node leads and with which
//! token, watch the leader, step down, shut down. baton's HTTP server is optional
//! ([`NodeBuilder::serve_http`], feature `http`): a service may answer `/status` from its own
//! server by reading the handle, or not at all.
//!
//! ```no_run
//! # async fn demo(cfg: baton::config::NodeConfig) -> anyhow::Result<()> {
//! let node = baton::node::NodeBuilder::new(cfg)
//!     .with_job("report", |mut term| async move {
//!         println!("leading with token {}", term.token());
//!         term.stopping().await;
//!         Ok(())
//!     })
//!     .start()
//!     .await?;
//! println!("leading: {}", node.is_leading());
//! node.shutdown().await
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ractor::{Actor, ActorRef};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::actors::supervisor::{
    NodeSupervisor, StepDownError, StepDownReport, SupervisorArgs, SupervisorMsg,
};
use crate::backends;
use crate::clock::NodeClock;
use crate::config::{Fencing, NodeConfig};
use crate::elector::{Elector, FenceToken, LeaderInfo};
#[cfg(feature = "http")]
use crate::http::{self, HttpApp};
use crate::leadership::{Leadership, Status};
use crate::trace::ActorTrace;
use crate::work::job::{FnWork, Term};
use crate::work::scheduler::SchedulerWork;
use crate::work::sequencer::{CommitLimits, SequencerHandle, SequencerWork};
use crate::work::{Fence, LeaderWork, Registered, SupervisionPolicy};

/// Assembles a node. Register leader work with [`NodeBuilder::with_job`] (a closure) or
/// [`NodeBuilder::with_work`] (an actor-based [`LeaderWork`]).
pub struct NodeBuilder {
    cfg: NodeConfig,
    works: Vec<Registered>,
    sequencer: Option<SequencerHandle>,
    /// Whether the built-in scheduler is registered (`GET /read` then reports its cursor).
    scheduler: bool,
    elector: Option<Arc<dyn Elector>>,
    #[cfg(feature = "http")]
    http: Option<tokio::net::TcpListener>,
}

impl NodeBuilder {
    /// A node with `cfg` and no leader work yet; timing is validated by [`NodeBuilder::start`].
    pub fn new(cfg: NodeConfig) -> NodeBuilder {
        NodeBuilder {
            cfg,
            works: Vec::new(),
            sequencer: None,
            scheduler: false,
            elector: None,
            #[cfg(feature = "http")]
            http: None,
        }
    }

    /// Registers a singleton job: started on every win, checkpointed and stopped on every loss.
    /// If it fails during a term, the node demotes ([`SupervisionPolicy::Demote`]).
    pub fn with_work(self, work: Arc<dyn LeaderWork>) -> NodeBuilder {
        self.with_work_supervised(work, SupervisionPolicy::Demote)
    }

    /// [`NodeBuilder::with_work`] with another supervision policy.
    pub fn with_work_supervised(
        mut self,
        work: Arc<dyn LeaderWork>,
        policy: SupervisionPolicy,
    ) -> NodeBuilder {
        self.works.push(Registered { work, policy });
        self
    }

    /// Registers a closure job: called with a [`Term`] each time this node wins; it returns when
    /// [`Term::stopping`] resolves (after publishing its progress). See [`crate::work::job`].
    pub fn with_job<F, Fut>(self, name: &'static str, job: F) -> NodeBuilder
    where
        F: Fn(Term) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.with_job_supervised(name, SupervisionPolicy::Demote, job)
    }

    /// [`NodeBuilder::with_job`] with another supervision policy.
    pub fn with_job_supervised<F, Fut>(
        self,
        name: &'static str,
        policy: SupervisionPolicy,
        job: F,
    ) -> NodeBuilder
    where
        F: Fn(Term) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.with_work_supervised(Arc::new(FnWork::new(name, job)), policy)
    }

    /// The built-in sequencer (`POST /next`) and scheduler, as enabled in the config.
    pub fn with_default_work(mut self) -> NodeBuilder {
        if self.cfg.sequencer.enabled {
            let handle = SequencerHandle::default();
            let work = Arc::new(SequencerWork {
                handle: handle.clone(),
                limits: CommitLimits {
                    max_batch_ids: self.cfg.sequencer.max_batch_ids,
                    in_flight: self.cfg.sequencer.commits_in_flight,
                    min_interval: Duration::from_millis(self.cfg.sequencer.min_commit_interval_ms),
                },
            });
            self = self.with_work(work);
            self.sequencer = Some(handle);
        }
        if self.cfg.scheduler.enabled {
            let work = Arc::new(SchedulerWork {
                cfg: self.cfg.scheduler.clone(),
            });
            self = self.with_work(work);
            self.scheduler = true;
        }
        self
    }

    /// Elects with your own [`Elector`] instead of the configured backend (`cfg.backend` is
    /// then only a label). Check it first with the conformance suite (feature `conformance`).
    pub fn with_elector(mut self, elector: Arc<dyn Elector>) -> NodeBuilder {
        self.elector = Some(elector);
        self
    }

    /// Serves baton's HTTP API (`/status /next /metrics /stepdown /healthz`) on `listener`.
    #[cfg(feature = "http")]
    pub fn serve_http(mut self, listener: tokio::net::TcpListener) -> NodeBuilder {
        self.http = Some(listener);
        self
    }

    /// Starts the node: validates the config, connects to the fenced resource and the backend,
    /// spawns the supervision tree (and the HTTP server, if asked) and returns its handle.
    pub async fn start(self) -> anyhow::Result<NodeHandle> {
        #[cfg_attr(not(feature = "http"), allow(unused_mut))]
        let mut cfg = self.cfg;
        cfg.validate().context("config")?;
        check_stop_bounds(&cfg, &self.works)?;
        crate::metrics::describe();
        // The recorder is installed either way; only the HTTP server renders it (/metrics).
        #[cfg(feature = "prometheus")]
        #[cfg_attr(not(feature = "http"), allow(unused_variables))]
        let prometheus = crate::metrics::install(&cfg.node_id);
        let clock = NodeClock {
            skew_ms: cfg.clock_skew_ms,
            drift: cfg.clock_drift,
        };
        let trace = ActorTrace::open(
            &cfg.node_id,
            clock,
            &cfg.state_dir.join("actor-trace.jsonl"),
        )
        .with_context(|| format!("opening the actor trace in {}", cfg.state_dir.display()))?;
        let nofile = raise_nofile_limit();
        #[cfg(feature = "http")]
        if let Some(listener) = &self.http {
            let bound = listener.local_addr()?;
            // The listener may differ from `http_listen` (a library user binds their own).
            cfg.check_admin_surface(bound.ip()).context("config")?;
            // The backend publishes this address as our candidacy, so followers can redirect.
            cfg.advertise_addr.get_or_insert_with(|| bound.to_string());
        }
        let http_addr = cfg.advertise_addr.clone();
        // Built before anything starts, so a bad certificate or key fails the start, not the
        // first client.
        #[cfg(all(feature = "http", feature = "tls"))]
        let http_tls = match &self.http {
            Some(_) => http::tls_acceptor(&cfg.http).context("[http] TLS")?,
            None => None,
        };

        let fence = Fence::new(&cfg.resource, &cfg.node_id)?;
        check_fencing_mode(&fence, cfg.fencing).await?;
        let backend = match self.elector {
            Some(e) => e,
            None => backends::build(&cfg).await?,
        };

        let (leader_tx, leader_rx) = watch::channel(None);
        let leadership = Arc::new(Leadership::new(
            cfg.node_id.clone(),
            http_addr.clone(),
            cfg.backend,
            leader_rx,
        ));
        #[cfg(feature = "http")]
        let read_backend = (backend.clone(), fence.clone());
        let args = SupervisorArgs {
            cfg: cfg.clone(),
            backend,
            works: self.works,
            fence,
            trace: trace.clone(),
            shared: leadership.clone(),
            leader_tx,
        };
        let (supervisor, sup_handle) = Actor::spawn(None, NodeSupervisor, args)
            .await
            .context("starting the supervision tree")?;
        tracing::info!(node = %cfg.node_id, http_addr = http_addr.as_deref().unwrap_or("-"), backend = %cfg.backend, "node started");

        let (http_stop_tx, http_stop_rx) = tokio::sync::oneshot::channel::<()>();
        #[cfg(feature = "http")]
        let server = self.http.map(|listener| -> std::io::Result<_> {
            let (elector, fence) = read_backend;
            let app = Arc::new(HttpApp {
                shared: leadership.clone(),
                read: http::ReadSettings {
                    default_mode: cfg.read_mode_default,
                    lease_margin: Duration::from_millis(cfg.read_lease_margin_ms),
                    rate_bound: cfg.clock_rate_error,
                    sequencer: self.sequencer.is_some(),
                    scheduler: self.scheduler,
                    elector,
                    fence,
                    node_rt: tokio::runtime::Handle::current(),
                    confirms: Default::default(),
                },
                supervisor: supervisor.clone(),
                sequencer: self.sequencer.unwrap_or_default(),
                #[cfg(feature = "prometheus")]
                prometheus,
                admin_token: cfg.admin_token.clone(),
                max_block: cfg.sequencer.max_block,
                max_connections: http::connection_cap(cfg.http.max_connections, nofile),
                limits: cfg.http.clone(),
                trace: trace.clone(),
                #[cfg(feature = "tls")]
                tls: http_tls,
            });
            tracing::info!(
                max_connections = app.max_connections,
                nofile_soft_limit = nofile,
                "client connection cap"
            );
            http::spawn_server(listener, app, async move {
                let _ = http_stop_rx.await;
            })
        });
        #[cfg(feature = "http")]
        let server = match server.transpose() {
            Ok(s) => s,
            Err(e) => {
                supervisor.stop(Some("the HTTP server did not start".into()));
                return Err(anyhow::Error::new(e).context("starting the HTTP server"));
            }
        };
        #[cfg(not(feature = "http"))]
        let server: Option<tokio::sync::oneshot::Receiver<()>> = {
            let _ = (http_stop_rx, self.sequencer, self.scheduler, nofile);
            None
        };
        Ok(NodeHandle {
            leadership,
            supervisor,
            tasks: Arc::new(tokio::sync::Mutex::new(NodeTasks {
                tree: sup_handle,
                server,
                http_stop: Some(http_stop_tx),
            })),
            trace,
            stop_bound: cfg.work_stop_timeout() * 3 + Duration::from_secs(2),
        })
    }

    /// Serves HTTP on `listener` and runs the node until `shutdown` resolves, then demotes
    /// (checkpoint, stop, release) and returns. An error if the tree stopped on its own.
    #[cfg(feature = "http")]
    pub async fn run(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> anyhow::Result<()> {
        let node = self.serve_http(listener).start().await?;
        tokio::select! {
            _ = shutdown => node.shutdown().await,
            _ = node.stopped() => {
                node.shutdown().await?;
                anyhow::bail!("the supervision tree stopped on its own; see the actor trace")
            }
        }
    }
}

/// A running node. Cheap to clone (every clone is the same node), so a service can hand it to
/// its own request handlers. Dropping it does not stop the node; call [`NodeHandle::shutdown`].
#[derive(Clone)]
pub struct NodeHandle {
    leadership: Arc<Leadership>,
    supervisor: ActorRef<SupervisorMsg>,
    tasks: Arc<tokio::sync::Mutex<NodeTasks>>,
    trace: ActorTrace,
    stop_bound: Duration,
}

struct NodeTasks {
    tree: JoinHandle<()>,
    /// Resolves (or errs) when the HTTP server's thread has finished.
    server: Option<tokio::sync::oneshot::Receiver<()>>,
    http_stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Refuses a config whose supervisor would give up on a registered work before that work can
/// have stopped: the stop is a barrier only if the supervisor waits for all of it.
fn check_stop_bounds(cfg: &NodeConfig, works: &[Registered]) -> anyhow::Result<()> {
    for w in works {
        if let Some(needed) = w.work.stop_bound() {
            anyhow::ensure!(
                cfg.work_stop_timeout() >= needed,
                "work_stop_timeout_ms ({}) must be at least {} ms: the stop bound of work {:?}",
                cfg.work_stop_timeout_ms,
                needed.as_millis(),
                w.work.name()
            );
        }
    }
    Ok(())
}

impl NodeHandle {
    /// What `GET /status` reports: role, token, time left on the lease, leader, acting.
    pub fn status(&self) -> Status {
        self.leadership.status()
    }

    /// Whether this node holds a term right now.
    pub fn is_leading(&self) -> bool {
        self.leadership.is_leading()
    }

    /// The fencing token of the term this node holds, if any.
    pub fn token(&self) -> Option<FenceToken> {
        self.leadership.token()
    }

    /// A watch of who leads, as the backend reports it.
    pub fn leader(&self) -> watch::Receiver<Option<LeaderInfo>> {
        self.leadership.leader_watch()
    }

    /// Graceful demotion: checkpoint, stop, release; with `successor`, hand leadership to that
    /// node where the backend can (raft).
    pub async fn step_down(
        &self,
        successor: Option<&str>,
    ) -> Result<StepDownReport, StepDownError> {
        let successor = successor.map(str::to_owned);
        match self
            .supervisor
            .call(
                |reply| SupervisorMsg::StepDown { successor, reply },
                Some(self.stop_bound + Duration::from_secs(10)),
            )
            .await
        {
            Ok(ractor::rpc::CallResult::Success(r)) => r,
            Ok(_) | Err(_) => Err(StepDownError::Unsupported(
                "the supervisor did not answer (stopping or stopped)".into(),
            )),
        }
    }

    /// Resolves when the supervision tree has stopped: on its own (a fatal error, or leader work
    /// under the `Shutdown` policy failed) or after [`NodeHandle::shutdown`].
    pub async fn stopped(&self) {
        while !self.tasks.lock().await.tree.is_finished() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Demotes if leading (checkpoint, stop, release), stops the tree and the HTTP server.
    /// Idempotent.
    pub async fn shutdown(&self) -> anyhow::Result<()> {
        let mut tasks = self.tasks.lock().await;
        if !tasks.tree.is_finished() {
            self.trace.step("node", "shutdown", None, "");
            let _ = self
                .supervisor
                .call(SupervisorMsg::Shutdown, Some(self.stop_bound))
                .await;
            self.supervisor.stop(Some("shutdown".into()));
            let _ = (&mut tasks.tree).await;
        }
        if let Some(tx) = tasks.http_stop.take() {
            let _ = tx.send(());
        }
        if let Some(server) = tasks.server.take() {
            let _ = server.await;
        }
        Ok(())
    }
}

/// Raises the descriptor soft limit to the hard limit and returns the soft limit the node runs
/// with (logged: it sizes the connection cap).
fn raise_nofile_limit() -> u64 {
    match crate::rlimit::raise_nofile_soft_limit() {
        Ok(l) => {
            tracing::info!(
                soft_before = l.soft_before,
                soft = l.soft,
                hard = l.hard,
                "descriptor limit (RLIMIT_NOFILE)"
            );
            l.soft
        }
        Err(e) => {
            // Unknown: assume the common default, so the cap stays conservative.
            tracing::warn!(error = %e, "descriptor limit unknown; assuming 1024");
            1024
        }
    }
}

/// The node's `--fencing` must agree with the resource's own switch, which only the resource's
/// owner can change: a node cannot switch the fence off by itself.
async fn check_fencing_mode(fence: &Fence, wanted: Fencing) -> anyhow::Result<()> {
    match tokio::time::timeout(Duration::from_secs(5), fence.fencing_enabled()).await {
        Ok(Ok(on)) => {
            let want_on = wanted == Fencing::On;
            if on != want_on {
                anyhow::bail!(
                    "the resource has fencing {} but this node was started with --fencing {}; switch the resource with `baton migrate --fencing {}`",
                    if on { "on" } else { "off" },
                    if want_on { "on" } else { "off" },
                    if want_on { "on" } else { "off" }
                );
            }
            if !on {
                tracing::warn!(
                    "FENCING IS OFF: stale leaders' writes will be accepted (experiment mode)"
                );
            }
            Ok(())
        }
        Ok(Err(crate::work::FenceError::Schema(e))) => {
            anyhow::bail!("the fenced resource has no baton schema ({e}); run `baton migrate`")
        }
        // Unreachable now is not fatal: leader work will fail its claim and the node will demote
        // until the resource is back.
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "fenced resource unreachable at start; leader work will wait for it");
            Ok(())
        }
        Err(_) => {
            tracing::warn!("fenced resource did not answer within 5 s at start");
            Ok(())
        }
    }
}
