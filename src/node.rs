//! One fleet member, assembled: the supervision tree, the fenced resource, the registered leader
//! work and, optionally, baton's own HTTP server. [`NodeBuilder`] is the library entry point;
//! `baton node` is a thin wrapper over it.
//!
//! [`NodeBuilder::start`] returns a [`NodeHandle`]: ask it whether this node leads and with which
//! token, watch the leader, step down, shut down. baton's HTTP server is optional
//! (`NodeBuilder::serve_http`, feature `http`): a service may answer `/status` from its own
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

use crate::actors::placement::{MemberClient, PlacementArgs, PlacementState, PlacementView};
use crate::actors::messages::{StepDownError, StepDownReport, SupervisorMsg};
use crate::actors::supervisor::{NodeSupervisor, SupervisorArgs};
use crate::backends;
use crate::clock::NodeClock;
use crate::config::{Fencing, NodeConfig};
use crate::elector::{Elector, FenceToken, LeaderInfo};
#[cfg(feature = "http")]
use crate::http::{self, HttpApp};
use crate::leadership::{Leadership, Status};
use crate::shard::ShardId;
use crate::tasks::AbortOnDrop;
use crate::trace::ActorTrace;
use crate::work::job::{FnWork, Term};
use crate::work::scheduler::SchedulerWork;
use crate::work::sequencer::{CommitLimits, SequencerHandle, SequencerWork, WindowSettings};
use crate::work::{Fence, LeaderWork, Registered, SupervisionPolicy};

/// Assembles a node. Register leader work with [`NodeBuilder::with_job`] (a closure) or
/// [`NodeBuilder::with_work`] (an actor-based [`LeaderWork`]).
pub struct NodeBuilder {
    cfg: NodeConfig,
    works: Vec<Registered>,
    /// Where in `works` the built-in sequencer goes (it needs one handle per shard, so it is
    /// built in [`NodeBuilder::start`], once the shard count is final).
    sequencer_at: Option<usize>,
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
            sequencer_at: None,
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

    /// A sharded job: [`NodeBuilder::with_job`] on a fleet of `shards` shards (sets
    /// `[shards] count`). Each shard's term runs its own instance; [`Term::shard`] says which,
    /// and [`Term::fence`] writes in that shard's fence domain.
    pub fn with_sharded_job<F, Fut>(
        mut self,
        name: &'static str,
        shards: u32,
        job: F,
    ) -> NodeBuilder
    where
        F: Fn(Term) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        self.cfg.shards.count = shards;
        self.with_job(name, job)
    }

    /// The built-in sequencer (`POST /next`) and scheduler, as enabled in the config.
    pub fn with_default_work(mut self) -> NodeBuilder {
        if self.cfg.sequencer.enabled {
            self.sequencer_at = Some(self.works.len());
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
        let shard_count = cfg.shard_count();
        anyhow::ensure!(
            shard_count == 1 || self.elector.is_none(),
            "config: a custom Elector serves one election; [shards] count must be 1 with it"
        );
        let mut works = self.works;
        let sequencers: Option<Vec<SequencerHandle>> = self.sequencer_at.map(|at| {
            let handles: Vec<SequencerHandle> = (0..shard_count)
                .map(|_| SequencerHandle::default())
                .collect();
            let work = Arc::new(SequencerWork {
                handles: handles.clone(),
                limits: CommitLimits {
                    max_batch_ids: cfg.sequencer.max_batch_ids,
                    in_flight: cfg.sequencer.commits_in_flight,
                    min_interval: Duration::from_millis(cfg.sequencer.min_commit_interval_ms),
                },
                mode: cfg.sequencer.mode,
                window: WindowSettings {
                    ids: cfg.sequencer.window_ids as i64,
                    rate_bound: cfg.clock_rate_error,
                    margin: Duration::from_millis(cfg.read_lease_margin_ms),
                },
            });
            works.insert(
                at,
                Registered {
                    work,
                    policy: SupervisionPolicy::Demote,
                },
            );
            handles
        });
        check_stop_bounds(&cfg, &works)?;
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
        // Started before the electors, so they subscribe before anything can be confirmed dead.
        #[cfg(feature = "swim")]
        let detector = match cfg.detector.kind {
            crate::config::DetectorKind::Swim => Some(
                crate::actors::detector::start(&cfg)
                    .await
                    .context("starting the failure detector")?,
            ),
            crate::config::DetectorKind::Lease => None,
        };
        #[cfg(feature = "swim")]
        let peer_events = detector.as_ref().map(|d| d.events());
        #[cfg(not(feature = "swim"))]
        let peer_events: Option<crate::actors::PeerEvents> = None;
        let placement = Arc::new(PlacementState::default());
        let members = MemberClient::for_config(&cfg.http).context("[http] member_ca_file")?;
        let mut shards: Vec<ShardTree> = Vec::with_capacity(shard_count as usize);
        // One config for every shard; what differs per shard is its names.
        let cfg = Arc::new(cfg);
        let shard_names = cfg.shard_names();
        let electors = match self.elector {
            Some(e) => vec![e],
            None => backends::build_shards(&cfg, &shard_names)
                .await
                .context("connecting the election backend")?,
        };
        for (names, backend) in shard_names.into_iter().zip(electors) {
            let (shard, s) = (names.shard, names.shard.0);
            let shard_fence = if s == 0 {
                fence.clone()
            } else {
                fence.for_shard(shard)?
            };
            let shard_trace = if shard_count > 1 {
                trace.for_shard(shard)
            } else {
                trace.clone()
            };
            let (leader_tx, leader_rx) = watch::channel(None);
            let leadership = Arc::new(Leadership::new(
                cfg.node_id.clone(),
                http_addr.clone(),
                cfg.backend,
                leader_rx,
            ));
            let args = SupervisorArgs {
                cfg: cfg.clone(),
                backend: backend.clone(),
                works: works.clone(),
                fence: shard_fence.clone(),
                trace: shard_trace,
                shared: leadership.clone(),
                leader_tx,
                shard,
                // At K = 1 every member seeks the one term, as before shards; at K > 1
                // placement says which (after its first round of probes).
                wanted: shard_count == 1,
                peer_events: peer_events.clone(),
            };
            let (supervisor, join) = match Actor::spawn(None, NodeSupervisor, args).await {
                Ok(x) => x,
                Err(e) => {
                    for t in &shards {
                        t.supervisor.stop(Some("node start failed".into()));
                    }
                    return Err(anyhow::Error::new(e).context("starting the supervision tree"));
                }
            };
            shards.push(ShardTree {
                leadership,
                supervisor,
                join,
                elector: backend,
                fence: shard_fence,
                sequencer: sequencers.as_ref().map(|h| h[s as usize].clone()),
            });
        }
        let placement_task = (shard_count > 1).then(|| {
            AbortOnDrop(tokio::spawn(crate::actors::placement::run(PlacementArgs {
                node_id: cfg.node_id.clone(),
                members: cfg.shard_members(),
                cfg: cfg.shards.clone(),
                supervisors: shards.iter().map(|t| t.supervisor.clone()).collect(),
                leaderships: shards.iter().map(|t| t.leadership.clone()).collect(),
                trace: trace.clone(),
                state: placement.clone(),
                client: members.clone(),
                peer_events: peer_events.as_ref().map(|e| e.subscribe()),
            })))
        });
        tracing::info!(node = %cfg.node_id, http_addr = http_addr.as_deref().unwrap_or("-"), backend = %cfg.backend, shards = shard_count, "node started");

        let (http_stop_tx, http_stop_rx) = tokio::sync::oneshot::channel::<()>();
        #[cfg(feature = "http")]
        let server = self.http.map(|listener| -> std::io::Result<_> {
            let app = Arc::new(HttpApp {
                shards: shards
                    .iter()
                    .enumerate()
                    .map(|(s, t)| http::ShardApp {
                        shard: s,
                        shared: t.leadership.clone(),
                        supervisor: t.supervisor.clone(),
                        sequencer: t.sequencer.clone().unwrap_or_default(),
                        elector: t.elector.clone(),
                        fence: t.fence.clone(),
                        confirms: Default::default(),
                    })
                    .collect(),
                placement: placement.clone(),
                read: http::ReadSettings {
                    default_mode: cfg.read_mode_default,
                    lease_margin: Duration::from_millis(cfg.read_lease_margin_ms),
                    rate_bound: cfg.clock_rate_error,
                    sequencer: sequencers.is_some(),
                    scheduler: self.scheduler,
                    node_rt: tokio::runtime::Handle::current(),
                    counters: Default::default(),
                },
                #[cfg(feature = "prometheus")]
                prometheus,
                admin_token: cfg.admin_token.clone(),
                max_block: cfg.sequencer.max_block,
                max_connections: http::connection_cap(cfg.http.max_connections, nofile),
                limits: cfg.http.clone(),
                trace: trace.clone(),
                ui: http::UiState::new(http_addr.clone(), cfg.shard_members(), members),
                #[cfg(feature = "tls")]
                tls: http_tls,
                #[cfg(feature = "swim")]
                detector: detector.as_ref().map(|d| d.shared_view()),
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
                for t in &shards {
                    t.supervisor
                        .stop(Some("the HTTP server did not start".into()));
                }
                return Err(anyhow::Error::new(e).context("starting the HTTP server"));
            }
        };
        #[cfg(not(feature = "http"))]
        let server: Option<tokio::sync::oneshot::Receiver<()>> = {
            let _ = (http_stop_rx, &sequencers, self.scheduler, nofile);
            None
        };
        let (handles, joins): (Vec<ShardHandle>, Vec<JoinHandle<()>>) = shards
            .into_iter()
            .map(|t| {
                (
                    ShardHandle {
                        leadership: t.leadership,
                        supervisor: t.supervisor,
                    },
                    t.join,
                )
            })
            .unzip();
        Ok(NodeHandle {
            shards: Arc::new(handles),
            placement,
            drain_wait: (shard_count > 1)
                .then(|| Duration::from_millis(cfg.shards.probe_interval_ms * 3)),
            tasks: Arc::new(tokio::sync::Mutex::new(NodeTasks {
                trees: joins,
                server,
                http_stop: Some(http_stop_tx),
                placement: placement_task,
                #[cfg(feature = "swim")]
                detector,
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
///
/// The node-level accessors ([`NodeHandle::status`], [`NodeHandle::token`], ...) are about
/// shard 0, the only shard of an unsharded node; [`NodeHandle::shard`] gives any shard's.
#[derive(Clone)]
pub struct NodeHandle {
    shards: Arc<Vec<ShardHandle>>,
    placement: Arc<PlacementState>,
    /// K > 1: how long a shutdown drains (answers 503 to probes so peers take its shards and
    /// start campaigning) before it releases them.
    drain_wait: Option<Duration>,
    tasks: Arc<tokio::sync::Mutex<NodeTasks>>,
    trace: ActorTrace,
    stop_bound: Duration,
}

/// One shard's term on this node: its status mirror and its supervisor.
#[derive(Clone)]
pub struct ShardHandle {
    leadership: Arc<Leadership>,
    supervisor: ActorRef<SupervisorMsg>,
}

/// What `start` assembles per shard before the handle exists.
struct ShardTree {
    leadership: Arc<Leadership>,
    supervisor: ActorRef<SupervisorMsg>,
    join: JoinHandle<()>,
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    elector: Arc<dyn Elector>,
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    fence: Fence,
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    sequencer: Option<SequencerHandle>,
}

struct NodeTasks {
    /// One supervision tree per shard.
    trees: Vec<JoinHandle<()>>,
    /// Resolves (or errs) when the HTTP server's thread has finished.
    server: Option<tokio::sync::oneshot::Receiver<()>>,
    http_stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// The placement task (K > 1); aborted when dropped.
    placement: Option<AbortOnDrop>,
    /// The failure detector (`[detector] kind = "swim"`); stopped after the terms are released.
    #[cfg(feature = "swim")]
    detector: Option<crate::actors::detector::Detector>,
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

impl ShardHandle {
    /// This shard's status: role, token, time left on the lease, leader, acting.
    pub fn status(&self) -> Status {
        self.leadership.status()
    }

    /// Whether this node holds this shard's term right now.
    pub fn is_leading(&self) -> bool {
        self.leadership.is_leading()
    }

    /// The fencing token of this shard's term held here, if any.
    pub fn token(&self) -> Option<FenceToken> {
        self.leadership.token()
    }

    /// A watch of who leads this shard, as the backend reports it.
    pub fn leader(&self) -> watch::Receiver<Option<LeaderInfo>> {
        self.leadership.leader_watch()
    }

    async fn step_down(
        &self,
        successor: Option<&str>,
        bound: Duration,
    ) -> Result<StepDownReport, StepDownError> {
        let successor = successor.map(str::to_owned);
        match self
            .supervisor
            .call(
                |reply| SupervisorMsg::StepDown { successor, reply },
                Some(bound),
            )
            .await
        {
            Ok(ractor::rpc::CallResult::Success(r)) => r,
            Ok(_) | Err(_) => Err(StepDownError::Unsupported(
                "the supervisor did not answer (stopping or stopped)".into(),
            )),
        }
    }
}

impl NodeHandle {
    /// What `GET /status` reports: role, token, time left on the lease, leader, acting
    /// (shard 0's).
    pub fn status(&self) -> Status {
        self.shards[0].status()
    }

    /// Whether this node holds shard 0's term right now.
    pub fn is_leading(&self) -> bool {
        self.shards[0].is_leading()
    }

    /// The fencing token of shard 0's term held here, if any.
    pub fn token(&self) -> Option<FenceToken> {
        self.shards[0].token()
    }

    /// A watch of who leads shard 0, as the backend reports it.
    pub fn leader(&self) -> watch::Receiver<Option<LeaderInfo>> {
        self.shards[0].leader()
    }

    /// The number of shards (K).
    pub fn shard_count(&self) -> u32 {
        self.shards.len() as u32
    }

    /// Shard `shard`'s term on this node (`None` past K).
    pub fn shard(&self, shard: ShardId) -> Option<&ShardHandle> {
        self.shards.get(shard.0 as usize)
    }

    /// The shards this node leads right now.
    pub fn shards_led(&self) -> Vec<ShardId> {
        (0..self.shards.len() as u32)
            .map(ShardId)
            .filter(|s| self.shards[s.0 as usize].is_leading())
            .collect()
    }

    /// Placement's current view (live members and each shard's owner; empty at K = 1).
    pub fn placement(&self) -> PlacementView {
        self.placement.view()
    }

    /// Graceful demotion of shard 0: checkpoint, stop, release; with `successor`, hand
    /// leadership to that node where the backend can (raft).
    pub async fn step_down(
        &self,
        successor: Option<&str>,
    ) -> Result<StepDownReport, StepDownError> {
        self.step_down_shard(ShardId::ZERO, successor).await
    }

    /// [`NodeHandle::step_down`] for one shard.
    pub async fn step_down_shard(
        &self,
        shard: ShardId,
        successor: Option<&str>,
    ) -> Result<StepDownReport, StepDownError> {
        let Some(h) = self.shard(shard) else {
            return Err(StepDownError::Unsupported(format!(
                "no shard {shard}: this node runs {}",
                self.shards.len()
            )));
        };
        h.step_down(successor, self.stop_bound + Duration::from_secs(10))
            .await
    }

    /// Resolves when a supervision tree has stopped: on its own (a fatal error, or leader work
    /// under the `Shutdown` policy failed) or after [`NodeHandle::shutdown`].
    pub async fn stopped(&self) {
        while !self
            .tasks
            .lock()
            .await
            .trees
            .iter()
            .any(|t| t.is_finished())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Demotes every shard this node leads (checkpoint, stop, release), stops the trees and the
    /// HTTP server. On a sharded node it first drains: `/healthz` answers 503, so peers place
    /// its shards elsewhere and start campaigning for them, and each shard's release is then a
    /// hand-over rather than a wait. Idempotent.
    pub async fn shutdown(&self) -> anyhow::Result<()> {
        let mut tasks = self.tasks.lock().await;
        if tasks.trees.iter().any(|t| !t.is_finished()) {
            self.trace.step("node", "shutdown", None, "");
            if let Some(wait) = self.drain_wait {
                self.placement.start_draining();
                self.trace.step(
                    "node",
                    "draining",
                    None,
                    &format!("wait_ms={}", wait.as_millis()),
                );
                tokio::time::sleep(wait).await;
            }
            tasks.placement.take();
            tracing::info!(
                shards = self.shards.len(),
                bound_ms = self.stop_bound.as_millis() as u64,
                "shutting down: each term held is demoted (leader work checkpointed and stopped, then the lease released), waiting at most bound_ms"
            );
            let calls = self.shards.iter().enumerate().map(|(s, h)| async move {
                let done = h
                    .supervisor
                    .call(SupervisorMsg::Shutdown, Some(self.stop_bound))
                    .await;
                if !matches!(done, Ok(ractor::rpc::CallResult::Success(()))) {
                    tracing::warn!(
                        shard = s,
                        bound_ms = self.stop_bound.as_millis() as u64,
                        "the demotion did not finish within bound_ms; stopping the shard's supervision tree anyway"
                    );
                }
                h.supervisor.stop(Some("shutdown".into()));
            });
            futures::future::join_all(calls).await;
            for tree in tasks.trees.iter_mut() {
                let _ = tree.await;
            }
            tracing::info!("every supervision tree has stopped");
        }
        #[cfg(feature = "swim")]
        if let Some(d) = tasks.detector.take() {
            d.stop();
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
