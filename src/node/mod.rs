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

use crate::config::NodeConfig;
use crate::elector::Elector;
use crate::work::job::{FnWork, Term};
use crate::work::scheduler::SchedulerWork;
use crate::work::{LeaderWork, Registered, SupervisionPolicy};

mod handle;
mod start;

pub use handle::{NodeHandle, ShardHandle};

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
