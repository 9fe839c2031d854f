//! Starting a node, step by step: the config and the registered work checked, the node-wide
//! pieces opened (metrics, trace, fence, detector), one supervision tree per shard, placement,
//! and the HTTP server; then the handle.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ractor::{Actor, ActorRef};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::handle::{NodeHandle, NodeTasks, ShardHandle};
use super::NodeBuilder;
use crate::actors::messages::SupervisorMsg;
use crate::actors::placement::{MemberClient, PlacementArgs, PlacementState};
use crate::actors::supervisor::{NodeSupervisor, SupervisorArgs};
use crate::actors::PeerEvents;
use crate::backends;
use crate::clock::NodeClock;
use crate::config::{Fencing, NodeConfig, ShardNames};
use crate::elector::Elector;
#[cfg(feature = "http")]
use crate::http::{self, HttpApp};
use crate::leadership::Leadership;
use crate::tasks::AbortOnDrop;
use crate::trace::ActorTrace;
use crate::work::sequencer::{CommitLimits, SequencerHandle, SequencerWork, WindowSettings};
use crate::work::{Fence, Registered, SupervisionPolicy};

impl NodeBuilder {
    /// Starts the node: validates the config, connects to the fenced resource and the backend,
    /// spawns the supervision tree (and the HTTP server, if asked) and returns its handle.
    pub async fn start(mut self) -> anyhow::Result<NodeHandle> {
        let custom_elector = self.elector.take();
        let mut node = NodeParts::open(self, custom_elector.is_some()).await?;
        let shard_names = node.cfg.shard_names();
        let electors = match custom_elector {
            Some(e) => vec![e],
            None => backends::build_shards(&node.cfg, &shard_names)
                .await
                .context("connecting the election backend")?,
        };
        let shards = node.spawn_trees(shard_names, electors).await?;
        let placement_task = (node.shard_count > 1).then(|| node.spawn_placement(&shards));
        let (cfg, http_addr) = (&node.cfg, &node.http_addr);
        tracing::info!(node = %cfg.node_id, http_addr = http_addr.as_deref().unwrap_or("-"), backend = %cfg.backend, shards = node.shard_count, "node started");

        let (http_stop_tx, http_stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = node.serve_http(&shards, http_stop_rx)?;
        Ok(node.into_handle(shards, server, http_stop_tx, placement_task))
    }
}

/// What [`NodeBuilder::start`] opens for the whole node before any shard's tree, and every
/// later step reads.
struct NodeParts {
    /// One config for every shard; what differs per shard is its names.
    cfg: Arc<NodeConfig>,
    shard_count: u32,
    works: Vec<Registered>,
    /// The built-in sequencer's handles, one per shard.
    sequencers: Option<Vec<SequencerHandle>>,
    /// Whether the built-in scheduler is registered.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    scheduler: bool,
    trace: ActorTrace,
    /// The descriptor soft limit the node runs with.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    nofile: u64,
    /// The address the backend publishes as this node's candidacy.
    http_addr: Option<String>,
    fence: Fence,
    placement: Arc<PlacementState>,
    members: MemberClient,
    peer_events: Option<PeerEvents>,
    #[cfg(all(feature = "http", feature = "prometheus"))]
    prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
    #[cfg(feature = "http")]
    http: Option<tokio::net::TcpListener>,
    #[cfg(all(feature = "http", feature = "tls"))]
    http_tls: Option<tokio_rustls::TlsAcceptor>,
    #[cfg(feature = "swim")]
    detector: Option<crate::actors::detector::Detector>,
}

impl NodeParts {
    /// In this order, a failure stopping the start there: the config checked, the registered
    /// work (the built-in sequencer placed), metrics, the actor trace, the descriptor limit,
    /// the HTTP listener's address and TLS, the fenced resource, the failure detector, the
    /// members' client.
    async fn open(b: NodeBuilder, custom_elector: bool) -> anyhow::Result<NodeParts> {
        #[cfg_attr(not(feature = "http"), allow(unused_mut))]
        let mut cfg = b.cfg;
        cfg.validate().context("config")?;
        let shard_count = cfg.shard_count();
        anyhow::ensure!(
            shard_count == 1 || !custom_elector,
            "config: a custom Elector serves one election; [shards] count must be 1 with it"
        );
        let mut works = b.works;
        let sequencers = b
            .sequencer_at
            .map(|at| register_sequencer(&cfg, &mut works, at, shard_count));
        check_stop_bounds(&cfg, &works)?;
        crate::metrics::describe();
        // The recorder is installed either way; only the HTTP server renders it (/metrics).
        #[cfg(feature = "prometheus")]
        #[cfg_attr(not(feature = "http"), allow(unused_variables))]
        let prometheus = crate::metrics::install(&cfg.node_id);
        let trace = open_trace(&cfg)?;
        let nofile = raise_nofile_limit();
        #[cfg(feature = "http")]
        if let Some(listener) = &b.http {
            advertise_listener(&mut cfg, listener)?;
        }
        let http_addr = cfg.advertise_addr.clone();
        // Built before anything starts, so a bad certificate or key fails the start, not the
        // first client.
        #[cfg(all(feature = "http", feature = "tls"))]
        let http_tls = match &b.http {
            Some(_) => http::tls_acceptor(&cfg.http).context("[http] TLS")?,
            None => None,
        };

        let fence = Fence::new(&cfg.resource, &cfg.node_id)?;
        check_fencing_mode(&fence, cfg.fencing).await?;
        // Started before the electors, so they subscribe before anything can be confirmed dead.
        #[cfg(feature = "swim")]
        let detector = start_detector(&cfg).await?;
        #[cfg(feature = "swim")]
        let peer_events = detector.as_ref().map(|d| d.events());
        #[cfg(not(feature = "swim"))]
        let peer_events: Option<PeerEvents> = None;
        let placement = Arc::new(PlacementState::default());
        let members = MemberClient::for_config(&cfg.http).context("[http] member_ca_file")?;
        Ok(NodeParts {
            cfg: Arc::new(cfg),
            shard_count,
            works,
            sequencers,
            scheduler: b.scheduler,
            trace,
            nofile,
            http_addr,
            fence,
            placement,
            members,
            peer_events,
            #[cfg(all(feature = "http", feature = "prometheus"))]
            prometheus,
            #[cfg(feature = "http")]
            http: b.http,
            #[cfg(all(feature = "http", feature = "tls"))]
            http_tls,
            #[cfg(feature = "swim")]
            detector,
        })
    }

    /// One supervision tree per shard (`names[s]`, elected by `electors[s]`). If one fails to
    /// start, those already started are stopped.
    async fn spawn_trees(
        &self,
        names: Vec<ShardNames>,
        electors: Vec<Arc<dyn Elector>>,
    ) -> anyhow::Result<Vec<ShardTree>> {
        let mut shards: Vec<ShardTree> = Vec::with_capacity(self.shard_count as usize);
        for (names, backend) in names.into_iter().zip(electors) {
            match self.spawn_tree(names, backend).await {
                Ok(tree) => shards.push(tree),
                Err(e) => {
                    for t in &shards {
                        t.supervisor.stop(Some("node start failed".into()));
                    }
                    return Err(e);
                }
            }
        }
        Ok(shards)
    }

    /// Shard `names.shard`'s supervision tree: its fence domain, trace, status mirror and
    /// supervisor.
    async fn spawn_tree(
        &self,
        names: ShardNames,
        backend: Arc<dyn Elector>,
    ) -> anyhow::Result<ShardTree> {
        let (shard, s) = (names.shard, names.shard.0);
        let shard_fence = if s == 0 {
            self.fence.clone()
        } else {
            self.fence.for_shard(shard)?
        };
        let shard_trace = if self.shard_count > 1 {
            self.trace.for_shard(shard)
        } else {
            self.trace.clone()
        };
        let (leader_tx, leader_rx) = watch::channel(None);
        let leadership = Arc::new(Leadership::new(
            self.cfg.node_id.clone(),
            self.http_addr.clone(),
            self.cfg.backend,
            leader_rx,
        ));
        let args = SupervisorArgs {
            cfg: self.cfg.clone(),
            backend: backend.clone(),
            works: self.works.clone(),
            fence: shard_fence.clone(),
            trace: shard_trace,
            shared: leadership.clone(),
            leader_tx,
            shard,
            // At K = 1 every member seeks the one term, as before shards; at K > 1
            // placement says which (after its first round of probes).
            wanted: self.shard_count == 1,
            peer_events: self.peer_events.clone(),
        };
        let (supervisor, join) = Actor::spawn(None, NodeSupervisor, args)
            .await
            .map_err(|e| anyhow::Error::new(e).context("starting the supervision tree"))?;
        Ok(ShardTree {
            leadership,
            supervisor,
            join,
            elector: backend,
            fence: shard_fence,
            sequencer: self.sequencers.as_ref().map(|h| h[s as usize].clone()),
        })
    }

    /// Placement (K > 1): which shards this node seeks, from its probes of the members.
    fn spawn_placement(&self, shards: &[ShardTree]) -> AbortOnDrop {
        let cfg = &self.cfg;
        AbortOnDrop(tokio::spawn(crate::actors::placement::run(PlacementArgs {
            node_id: cfg.node_id.clone(),
            members: cfg.shard_members(),
            cfg: cfg.shards.clone(),
            supervisors: shards.iter().map(|t| t.supervisor.clone()).collect(),
            leaderships: shards.iter().map(|t| t.leadership.clone()).collect(),
            trace: self.trace.clone(),
            state: self.placement.clone(),
            client: self.members.clone(),
            peer_events: self.peer_events.as_ref().map(|e| e.subscribe()),
        })))
    }

    /// baton's HTTP server, when a listener was given ([`NodeBuilder::serve_http`]): it serves
    /// until `stop` resolves, and the receiver returned resolves (or errs) when its threads
    /// have finished. If it does not start, every shard's tree is stopped.
    #[cfg(feature = "http")]
    fn serve_http(
        &mut self,
        shards: &[ShardTree],
        stop: tokio::sync::oneshot::Receiver<()>,
    ) -> anyhow::Result<Option<tokio::sync::oneshot::Receiver<()>>> {
        let Some(listener) = self.http.take() else {
            return Ok(None);
        };
        let app = Arc::new(self.http_app(shards));
        tracing::info!(
            max_connections = app.max_connections,
            nofile_soft_limit = self.nofile,
            "client connection cap"
        );
        match http::spawn_server(listener, app, async move {
            let _ = stop.await;
        }) {
            Ok(server) => Ok(Some(server)),
            Err(e) => {
                for t in shards {
                    t.supervisor
                        .stop(Some("the HTTP server did not start".into()));
                }
                Err(anyhow::Error::new(e).context("starting the HTTP server"))
            }
        }
    }

    /// Without the `http` feature there is no server: `stop` is dropped.
    #[cfg(not(feature = "http"))]
    fn serve_http(
        &mut self,
        _shards: &[ShardTree],
        _stop: tokio::sync::oneshot::Receiver<()>,
    ) -> anyhow::Result<Option<tokio::sync::oneshot::Receiver<()>>> {
        Ok(None)
    }

    /// The HTTP server's state: every shard's, placement's, the read settings and limits.
    #[cfg(feature = "http")]
    fn http_app(&mut self, shards: &[ShardTree]) -> HttpApp {
        let cfg = &self.cfg;
        HttpApp {
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
            placement: self.placement.clone(),
            read: http::ReadSettings {
                default_mode: cfg.read_mode_default,
                lease_margin: Duration::from_millis(cfg.read_lease_margin_ms),
                rate_bound: cfg.clock_rate_error,
                sequencer: self.sequencers.is_some(),
                scheduler: self.scheduler,
                node_rt: tokio::runtime::Handle::current(),
                counters: Default::default(),
            },
            #[cfg(feature = "prometheus")]
            prometheus: self.prometheus.take(),
            admin_token: cfg.admin_token.clone(),
            max_block: cfg.sequencer.max_block,
            max_connections: http::connection_cap(cfg.http.max_connections, self.nofile),
            limits: cfg.http.clone(),
            trace: self.trace.clone(),
            ui: http::UiState::new(
                self.http_addr.clone(),
                cfg.shard_members(),
                self.members.clone(),
            ),
            #[cfg(feature = "tls")]
            tls: self.http_tls.take(),
            #[cfg(feature = "swim")]
            detector: self.detector.as_ref().map(|d| d.shared_view()),
        }
    }

    /// The node's handle: its shards' handles, and the tasks a shutdown stops.
    fn into_handle(
        self,
        shards: Vec<ShardTree>,
        server: Option<tokio::sync::oneshot::Receiver<()>>,
        http_stop: tokio::sync::oneshot::Sender<()>,
        placement_task: Option<AbortOnDrop>,
    ) -> NodeHandle {
        let (handles, trees) = shards.into_iter().map(ShardTree::split).unzip();
        let tasks = NodeTasks {
            trees,
            server,
            http_stop: Some(http_stop),
            placement: placement_task,
            #[cfg(feature = "swim")]
            detector: self.detector,
        };
        NodeHandle::new(&self.cfg, handles, self.placement, tasks, self.trace)
    }
}

/// Registers the built-in sequencer at `at` in `works`: one work for every shard, serving
/// through one handle per shard (returned, for the HTTP server).
fn register_sequencer(
    cfg: &NodeConfig,
    works: &mut Vec<Registered>,
    at: usize,
    shard_count: u32,
) -> Vec<SequencerHandle> {
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

/// The node's actor trace (`actor-trace.jsonl` in the state directory), on the node's clock.
fn open_trace(cfg: &NodeConfig) -> anyhow::Result<ActorTrace> {
    let clock = NodeClock {
        skew_ms: cfg.clock_skew_ms,
        drift: cfg.clock_drift,
    };
    ActorTrace::open(
        &cfg.node_id,
        clock,
        &cfg.state_dir.join("actor-trace.jsonl"),
    )
    .with_context(|| format!("opening the actor trace in {}", cfg.state_dir.display()))
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

/// Checks the admin surface against the address `listener` is bound to, and advertises that
/// address unless the config names one.
#[cfg(feature = "http")]
fn advertise_listener(
    cfg: &mut NodeConfig,
    listener: &tokio::net::TcpListener,
) -> anyhow::Result<()> {
    let bound = listener.local_addr()?;
    // The listener may differ from `http_listen` (a library user binds their own).
    cfg.check_admin_surface(bound.ip()).context("config")?;
    // The backend publishes this address as our candidacy, so followers can redirect.
    cfg.advertise_addr.get_or_insert_with(|| bound.to_string());
    Ok(())
}

/// The failure detector, when `[detector] kind = "swim"`.
#[cfg(feature = "swim")]
async fn start_detector(
    cfg: &NodeConfig,
) -> anyhow::Result<Option<crate::actors::detector::Detector>> {
    Ok(match cfg.detector.kind {
        crate::config::DetectorKind::Swim => Some(
            crate::actors::detector::start(cfg)
                .await
                .context("starting the failure detector")?,
        ),
        crate::config::DetectorKind::Lease => None,
    })
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

impl ShardTree {
    /// The shard's handle, and its tree's task.
    fn split(self) -> (ShardHandle, JoinHandle<()>) {
        (
            ShardHandle::new(self.leadership, self.supervisor),
            self.join,
        )
    }
}
