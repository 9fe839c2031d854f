//! A running node's handle: whether it leads and with which token, who leads, step down,
//! shut down; and the same for each of its shards.

use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::actors::messages::{StepDownError, StepDownReport, SupervisorMsg};
use crate::actors::placement::{PlacementState, PlacementView};
use crate::config::NodeConfig;
use crate::elector::{FenceToken, LeaderInfo};
use crate::leadership::{Leadership, Status};
use crate::shard::ShardId;
use crate::tasks::AbortOnDrop;
use crate::trace::ActorTrace;

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

/// The node's tasks, stopped by [`NodeHandle::shutdown`].
pub(super) struct NodeTasks {
    /// One supervision tree per shard.
    pub(super) trees: Vec<JoinHandle<()>>,
    /// Resolves (or errs) when the HTTP server's thread has finished.
    pub(super) server: Option<tokio::sync::oneshot::Receiver<()>>,
    pub(super) http_stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// The placement task (K > 1); aborted when dropped.
    pub(super) placement: Option<AbortOnDrop>,
    /// The failure detector (`[detector] kind = "swim"`); stopped after the terms are released.
    #[cfg(feature = "swim")]
    pub(super) detector: Option<crate::actors::detector::Detector>,
}

impl NodeHandle {
    /// The handle of a node just started: its shards' handles (shard `s` at `s`), placement, its
    /// tasks and trace, with the shutdown's drain and stop bounds from `cfg`.
    pub(super) fn new(
        cfg: &NodeConfig,
        shards: Vec<ShardHandle>,
        placement: Arc<PlacementState>,
        tasks: NodeTasks,
        trace: ActorTrace,
    ) -> NodeHandle {
        NodeHandle {
            shards: Arc::new(shards),
            placement,
            drain_wait: (cfg.shard_count() > 1)
                .then(|| Duration::from_millis(cfg.shards.probe_interval_ms * 3)),
            tasks: Arc::new(tokio::sync::Mutex::new(tasks)),
            trace,
            stop_bound: cfg.work_stop_timeout() * 3 + Duration::from_secs(2),
        }
    }
}

impl ShardHandle {
    pub(super) fn new(leadership: Arc<Leadership>, supervisor: ActorRef<SupervisorMsg>) -> Self {
        ShardHandle {
            leadership,
            supervisor,
        }
    }
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
