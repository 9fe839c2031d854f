//! One fleet member, assembled: the supervision tree, the fenced resource, the registered leader
//! work and the HTTP server. [`NodeBuilder`] is the library entry point; `baton node` is a thin
//! wrapper over it.
//!
//! ```no_run
//! # async fn demo(cfg: baton::config::NodeConfig) -> anyhow::Result<()> {
//! let listener = tokio::net::TcpListener::bind(cfg.http_listen).await?;
//! baton::node::NodeBuilder::new(cfg)
//!     .with_default_work()
//!     .run(listener, async { let _ = tokio::signal::ctrl_c().await; })
//!     .await
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ractor::Actor;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::actors::leadership::Leadership;
use crate::actors::supervisor::{NodeSupervisor, SupervisorArgs, SupervisorMsg};
use crate::backends;
use crate::clock::NodeClock;
use crate::config::{Fencing, NodeConfig};
#[cfg(feature = "http")]
use crate::http::{self, HttpApp};
use crate::trace::ActorTrace;
use crate::work::scheduler::SchedulerWork;
use crate::work::sequencer::{SequencerHandle, SequencerWork};
use crate::work::{Fence, LeaderWork};

/// Assembles a node. Register leader work with [`NodeBuilder::with_work`].
pub struct NodeBuilder {
    cfg: NodeConfig,
    works: Vec<Arc<dyn LeaderWork>>,
    sequencer: Option<SequencerHandle>,
}

impl NodeBuilder {
    pub fn new(cfg: NodeConfig) -> NodeBuilder {
        NodeBuilder {
            cfg,
            works: Vec::new(),
            sequencer: None,
        }
    }

    /// Registers a singleton job: started on every win, checkpointed and stopped on every loss.
    pub fn with_work(mut self, work: Arc<dyn LeaderWork>) -> NodeBuilder {
        self.works.push(work);
        self
    }

    /// The built-in sequencer (`POST /next`) and scheduler, as enabled in the config.
    pub fn with_default_work(mut self) -> NodeBuilder {
        if self.cfg.sequencer.enabled {
            let handle = SequencerHandle::default();
            self.works.push(Arc::new(SequencerWork {
                handle: handle.clone(),
                max_batch_ids: self.cfg.sequencer.max_batch_ids,
            }));
            self.sequencer = Some(handle);
        }
        if self.cfg.scheduler.enabled {
            self.works.push(Arc::new(SchedulerWork {
                cfg: self.cfg.scheduler.clone(),
            }));
        }
        self
    }

    /// Runs the node until `shutdown` resolves, then demotes (checkpoint, stop, release) and exits.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> anyhow::Result<()> {
        let mut cfg = self.cfg;
        cfg.validate().context("config")?;
        #[cfg(feature = "prometheus")]
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
        let bound = listener.local_addr()?;
        let http_addr = cfg
            .advertise_addr
            .clone()
            .unwrap_or_else(|| bound.to_string());
        // The backend publishes this address as our candidacy, so followers can redirect to us.
        cfg.advertise_addr = Some(http_addr.clone());

        let fence = Fence::new(&cfg.resource, &cfg.node_id)?;
        check_fencing_mode(&fence, cfg.fencing).await?;
        let backend = backends::build(&cfg).await?;
        let peer = backend.peer_rpc();

        let (leader_tx, leader_rx) = watch::channel(None);
        let shared = Arc::new(Leadership::new(
            cfg.node_id.clone(),
            Some(http_addr.clone()),
            cfg.backend,
            leader_rx,
        ));
        let args = SupervisorArgs {
            cfg: cfg.clone(),
            backend,
            works: self.works,
            fence,
            trace: trace.clone(),
            shared: shared.clone(),
            leader_tx,
        };
        let (supervisor, sup_handle) = Actor::spawn(None, NodeSupervisor, args)
            .await
            .context("starting the supervision tree")?;
        tracing::info!(node = %cfg.node_id, %http_addr, backend = %cfg.backend, "node started");

        #[cfg(feature = "http")]
        let app = Arc::new(HttpApp {
            shared,
            supervisor: supervisor.clone(),
            sequencer: self.sequencer.unwrap_or_default(),
            #[cfg(feature = "prometheus")]
            prometheus,
            admin_token: cfg.admin_token.clone(),
            max_block: cfg.sequencer.max_block,
            peer,
        });
        let (http_stop_tx, http_stop_rx) = tokio::sync::oneshot::channel::<()>();
        #[cfg(feature = "http")]
        let server = tokio::spawn(http::serve(listener, app, async move {
            let _ = http_stop_rx.await;
        }));
        #[cfg(not(feature = "http"))]
        let server = {
            let _ = (listener, peer, http_stop_rx);
            tokio::spawn(async {})
        };

        // Either the caller shuts us down, or the tree stopped on its own (a fatal error).
        let mut sup_handle = sup_handle;
        let fatal = tokio::select! {
            _ = shutdown => false,
            _ = &mut sup_handle => true,
        };
        if !fatal {
            trace.step("node", "shutdown", None, "");
            let _ = supervisor
                .call(
                    SupervisorMsg::Shutdown,
                    Some(cfg.work_stop_timeout() * 3 + Duration::from_secs(2)),
                )
                .await;
            supervisor.stop(Some("shutdown".into()));
            let _ = sup_handle.await;
        }
        let _ = http_stop_tx.send(());
        let _ = server.await;
        if fatal {
            anyhow::bail!("the supervision tree stopped on its own; see the actor trace");
        }
        Ok(())
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
