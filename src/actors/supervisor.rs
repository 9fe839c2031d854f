//! The NodeSupervisor: owns the node's phase, and the order a term starts and ends in.
//!
//! ```text
//!  follower --Elected(token)--> starting --WorkStarted--> leading
//!     ^                                                     |
//!     |                                      Demoted(reason) | StepDown
//!     |                                                     v
//!     +--Released-- releasing <--WorkStopped-- demoting (checkpoint, then stop, kill after bound)
//! ```
//!
//! A term whose work failed is recorded in the fleet's failure budget (`actors::budget`) before
//! its release; a term that finds the budget spent as it begins runs no work.
//!
//! Starting and stopping leader work awaits other actors, so both run in spawned tasks that report
//! back (`WorkStarted`, `WorkStopped`); `handle()` itself never awaits slow work. A `Demoted` that
//! arrives while work is still starting is deferred until it has started, then acted on at once;
//! so is the end of a work actor during the start (a refused claim ends one within milliseconds),
//! because a term with part of its work dead must not keep its lease.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::actors::backoff::{restart_delay, TermFailures};
use crate::actors::budget::FailureBudget;
use crate::actors::elector::{ElectorActor, ElectorArgs};
use crate::actors::messages::{
    ElectorMsg, Slot, StepDownError, StepDownReport, SupervisorMsg, WatchdogMsg,
};
use crate::actors::watchdog::LeaseWatchdog;
use crate::actors::DemotionReason;
use crate::backends::{Elector, FenceToken, LeaderInfo};
use crate::clock::monotonic_ns;
use crate::config::NodeConfig;
use crate::leadership::Leadership;
use crate::metrics as m;
use crate::shard::ShardId;
use crate::trace::ActorTrace;
use crate::work::{Fence, Registered, RunningWork, SupervisionPolicy, WorkContext};

pub struct SupervisorArgs {
    /// The node's config, shared by its shards.
    pub cfg: Arc<NodeConfig>,
    pub backend: Arc<dyn Elector>,
    pub works: Vec<Registered>,
    pub fence: Fence,
    pub trace: ActorTrace,
    pub shared: Arc<Leadership>,
    pub leader_tx: tokio::sync::watch::Sender<Option<LeaderInfo>>,
    /// The shard whose term this tree holds (shard 0 on an unsharded node).
    pub shard: ShardId,
    /// Whether placement wants this node to campaign from the start.
    pub wanted: bool,
    /// The node's failure detector's events (`None`: `[detector] kind = "lease"`).
    pub peer_events: Option<crate::actors::PeerEvents>,
}

enum Phase {
    Follower,
    Starting(FenceToken),
    Leading {
        token: FenceToken,
        works: Vec<Slot>,
    },
    Demoting {
        token: FenceToken,
        reason: DemotionReason,
    },
    Releasing {
        token: FenceToken,
        reason: DemotionReason,
        work_stopped_mono_ns: u64,
    },
}

pub struct SupervisorState {
    args: SupervisorArgs,
    elector: ActorRef<ElectorMsg>,
    watchdog: ActorRef<WatchdogMsg>,
    phase: Phase,
    deferred: Option<DemotionReason>,
    /// Work actors that ended while their term was starting, with why (the supervision event
    /// arrives before `WorkStarted` names them; `on_work_started` acts on it).
    ended_while_starting: HashMap<ractor::ActorId, String>,
    step_down_waiters: Vec<RpcReplyPort<Result<StepDownReport, StepDownError>>>,
    shutdown_waiters: Vec<RpcReplyPort<()>>,
    /// The elector or watchdog died: finish stopping work, then stop the node.
    fatal: Option<String>,
    demotion_started: Option<Instant>,
    /// Restarts of each work (by registration index) in the current term, for `Restart`'s window.
    restarts: HashMap<usize, VecDeque<Instant>>,
    /// Restarted works whose start is in flight; a demotion waits for them (like `Starting`).
    restarting: usize,
    /// A `Shutdown` policy fired: stop the node once the lease is released.
    stop_after_release: Option<String>,
    /// Failed terms in a row, and the wait before campaigning again (`actors::backoff`).
    term_failures: TermFailures,
    /// The fleet-wide failure budget (`actors::budget`; `None`: off).
    budget: Option<Arc<FailureBudget>>,
    /// Whether placement wants this node to hold this shard's term (always at K = 1). Kept
    /// because a campaign can win after placement withdrew it: the withdrawal then reaches an
    /// elector that already leads, and only this says that the new term is not ours to keep.
    placed: bool,
}

pub struct NodeSupervisor;

#[async_trait]
impl Actor for NodeSupervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SupervisorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let cell = myself.get_cell();
        let (watchdog, _) = Actor::spawn_linked(
            None,
            LeaseWatchdog,
            (myself.clone(), args.trace.clone(), args.shared.clone()),
            cell.clone(),
        )
        .await?;
        let budget = FailureBudget::new(
            &args.cfg.failure_budget,
            args.fence.clone(),
            args.shared.clone(),
            args.trace.clone(),
            args.shard,
        );
        let elector_args = ElectorArgs {
            backend: args.backend.clone(),
            cfg: args.cfg.clone(),
            supervisor: myself.clone(),
            watchdog: watchdog.clone(),
            trace: args.trace.clone(),
            leader_tx: args.leader_tx.clone(),
            candidate: args.wanted,
            budget: budget.clone(),
            peer_events: args.peer_events.clone(),
        };
        let (elector, _) = Actor::spawn_linked(None, ElectorActor, elector_args, cell).await?;
        args.trace
            .step("supervisor", "started", None, args.backend.kind().as_str());
        let term_failures = TermFailures::new(&args.cfg.term_backoff, &args.cfg.node_id);
        let placed = args.wanted;
        Ok(SupervisorState {
            placed,
            args,
            elector,
            watchdog,
            phase: Phase::Follower,
            deferred: None,
            ended_while_starting: HashMap::new(),
            step_down_waiters: Vec::new(),
            shutdown_waiters: Vec::new(),
            fatal: None,
            demotion_started: None,
            restarts: HashMap::new(),
            restarting: 0,
            stop_after_release: None,
            term_failures,
            budget,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.args.shared.set_acting(None);
        state.args.trace.step(
            "supervisor",
            "stopped",
            None,
            state.fatal.as_deref().unwrap_or(""),
        );
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Elected {
                token,
                lease_deadline,
                grant_sent_at,
            } => state.on_elected(&myself, token, lease_deadline, grant_sent_at),
            SupervisorMsg::WorkStarted { token, result } => {
                state.on_work_started(&myself, token, result)
            }
            SupervisorMsg::RestartDue { token, index } => {
                state.on_restart_due(&myself, token, index)
            }
            SupervisorMsg::WorkRestarted {
                token,
                index,
                result,
            } => state.on_work_restarted(&myself, token, index, result),
            SupervisorMsg::Demoted { token, reason } => state.demote(&myself, token, reason),
            SupervisorMsg::WorkStopped { token } => state.on_work_stopped(&myself, token),
            SupervisorMsg::Released { result } => state.on_released(&myself, result),
            SupervisorMsg::StepDown { successor, reply } => {
                if !matches!(state.phase, Phase::Leading { .. } | Phase::Starting(_)) {
                    let _ = reply.send(Err(StepDownError::NotLeader));
                    return Ok(());
                }
                if successor.is_some() && !state.args.backend.supports_transfer() {
                    let _ = reply.send(Err(StepDownError::Unsupported(format!(
                        "the {} backend cannot hand leadership to a named node",
                        state.args.backend.kind()
                    ))));
                    return Ok(());
                }
                state.step_down_waiters.push(reply);
                state.demote(&myself, None, DemotionReason::StepDown { successor });
            }
            SupervisorMsg::Placement { wanted } => {
                state.placed = wanted;
                let _ = state.elector.cast(ElectorMsg::SetCandidate(wanted));
                if !wanted {
                    state.demote(&myself, None, DemotionReason::Handover);
                } else if matches!(state.deferred, Some(DemotionReason::Handover)) {
                    // Placed here again before a starting term's hand-over began: keep it.
                    state.deferred = None;
                }
            }
            SupervisorMsg::Shutdown(reply) => {
                if matches!(state.phase, Phase::Follower) {
                    let _ = reply.send(());
                } else {
                    state.shutdown_waiters.push(reply);
                    state.demote(&myself, None, DemotionReason::Shutdown);
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        evt: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match &evt {
            SupervisionEvent::ActorTerminated(cell, _, reason) => (
                cell.clone(),
                reason.clone().unwrap_or_else(|| "stopped".into()),
            ),
            SupervisionEvent::ActorFailed(cell, err) => (cell.clone(), format!("failed: {err}")),
            _ => return Ok(()),
        };
        if cell.get_id() == state.elector.get_id() || cell.get_id() == state.watchdog.get_id() {
            // Without its elector or watchdog the node cannot know whether it leads: stop acting.
            let msg = format!(
                "{} ended: {why}",
                if cell.get_id() == state.elector.get_id() {
                    "elector"
                } else {
                    "watchdog"
                }
            );
            tracing::error!(%msg, "supervision tree broken; stopping leader work and the node");
            state.fatal = Some(msg.clone());
            if matches!(state.phase, Phase::Follower) {
                myself.stop(Some(msg));
            } else {
                state.demote(&myself, None, DemotionReason::WorkFailed(msg));
            }
            return Ok(());
        }
        // A work that ends while its term is still starting is not in the phase yet: kept with
        // its reason (a job's error chain) for `on_work_started`.
        if matches!(state.phase, Phase::Starting(_)) {
            state.ended_while_starting.insert(cell.get_id(), why);
            return Ok(());
        }
        if let Phase::Leading { works, .. } = &mut state.phase {
            if let Some(pos) = works
                .iter()
                .position(|w| w.running.cell().get_id() == cell.get_id())
            {
                let slot = works.remove(pos);
                let why = format!("{}: {why}", slot.running.name());
                state.on_work_ended(&myself, slot.index, why);
            }
        }
        Ok(())
    }
}

impl SupervisorState {
    /// The `shard` label of this tree's metrics.
    fn shard_label(&self) -> String {
        self.args.shard.0.to_string()
    }

    /// Says a demotion out loud as it begins: at WARN when the term was taken from this node
    /// (its lease ran out or is gone: whatever it had not committed under this token is lost,
    /// and the resource refuses its writes once a newer term has written), at INFO when it gives
    /// the term up itself. A term ended by its failing work is said when it has stopped
    /// (`actors::backoff`), a term the spent failure budget ended by the budget.
    fn say_demotion(&self, token: FenceToken, reason: &DemotionReason) {
        let (holder, shard) = (&self.args.cfg.node_id, self.args.shard.0);
        let stop_bound_ms = self.args.cfg.work_stop_timeout().as_millis() as u64;
        match reason {
            DemotionReason::LeaseDeadline => tracing::warn!(
                token = token.0,
                holder = %holder,
                shard,
                reason = %reason,
                stop_bound_ms,
                "lease deadline passed without a renewal: this node demotes and stops its leader work now; what it had not committed under this token is lost, and the resource refuses this token's writes once a newer term writes"
            ),
            DemotionReason::LeaseLost(_) => tracing::warn!(
                token = token.0,
                holder = %holder,
                shard,
                reason = %reason,
                stop_bound_ms,
                "lease lost: this node demotes and stops its leader work now; what it had not committed under this token is lost, and the resource refuses this token's writes once a newer term writes"
            ),
            DemotionReason::WorkFailed(_) | DemotionReason::FailureBudgetExhausted => {}
            other => tracing::info!(
                token = token.0,
                holder = %holder,
                shard,
                reason = %other,
                stop_bound_ms,
                "demoting: checkpointing and stopping leader work (waiting at most stop_bound_ms for each), then releasing the lease"
            ),
        }
    }

    fn on_elected(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        token: FenceToken,
        lease_deadline: Instant,
        grant_sent_at: Instant,
    ) {
        if !matches!(self.phase, Phase::Follower) || self.fatal.is_some() {
            tracing::warn!(token = token.0, "Elected while not a follower; ignored");
            return;
        }
        self.args
            .trace
            .step("supervisor", "elected", Some(token), "");
        // The term first, so the watchdog's deadline (published when it arms) lands on it.
        self.args.shared.set_term(Some(token));
        let _ = self.watchdog.cast(WatchdogMsg::Arm {
            token,
            deadline: lease_deadline,
            sent_at: grant_sent_at,
        });
        self.phase = Phase::Starting(token);
        if !self.placed {
            // Won by a campaign that placement withdrew while it was in flight: hand the term
            // over once its work has started (the one demotion order), or the shard stays
            // with a node that placement sends nobody to take it from.
            self.deferred.get_or_insert(DemotionReason::Handover);
        }
        self.ended_while_starting.clear();
        self.term_failures.term_began();
        let ctx = WorkContext {
            token,
            node_id: self.args.cfg.node_id.clone(),
            fence: self.args.fence.clone(),
            trace: self.args.trace.clone(),
            supervisor: myself.get_cell(),
            leadership: self.args.shared.clone(),
            shard: self.args.shard,
        };
        self.restarts.clear();
        let (works, me, budget) = (self.args.works.clone(), myself.clone(), self.budget.clone());
        tokio::spawn(async move {
            // A campaign under way when the fleet spent its budget may win right after: such a
            // term runs no work.
            if let Some(budget) = budget {
                if budget.spent_now().await {
                    let result = Err(DemotionReason::FailureBudgetExhausted);
                    let _ = me.cast(SupervisorMsg::WorkStarted { token, result });
                    return;
                }
            }
            let mut started: Vec<Slot> = Vec::new();
            let mut failure = None;
            for (index, w) in works.iter().enumerate() {
                match w.work.start(ctx.clone()).await {
                    Ok(running) => started.push(Slot { index, running }),
                    Err(e) => {
                        failure = Some(e.to_string());
                        break;
                    }
                }
            }
            let result = match failure {
                None => Ok(started),
                Some(e) => {
                    stop_all(&started, &ctx.trace, token, Duration::from_secs(2)).await;
                    Err(DemotionReason::WorkFailed(e))
                }
            };
            let _ = me.cast(SupervisorMsg::WorkStarted { token, result });
        });
    }

    fn on_work_started(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        token: FenceToken,
        result: Result<Vec<Slot>, DemotionReason>,
    ) {
        if !matches!(self.phase, Phase::Starting(t) if t == token) {
            return;
        }
        match result {
            Ok(works) => {
                let ended = std::mem::take(&mut self.ended_while_starting);
                self.phase = Phase::Leading { token, works };
                self.args.shared.set_acting(Some(token));
                let shard = self.shard_label();
                metrics::gauge!(m::LEADERS_ACTING, "shard" => shard.clone()).set(1.0);
                metrics::gauge!(m::FENCE_TOKEN, "shard" => shard.clone()).set(token.0 as f64);
                metrics::counter!(m::TRANSITIONS, "to" => "leader", "shard" => shard).increment(1);
                self.args
                    .trace
                    .step("supervisor", "work-started", Some(token), "");
                // A work that ended while the term was starting is handled by its policy now,
                // with the reason it ended for. One whose end is still on its way is handled
                // when its supervision event arrives (the term is `Leading` by then).
                let mut ended_slots = Vec::new();
                if let Phase::Leading { works, .. } = &mut self.phase {
                    let mut pos = 0;
                    while pos < works.len() {
                        match ended.get(&works[pos].running.cell().get_id()) {
                            Some(why) => ended_slots.push((works.remove(pos), why.clone())),
                            None => pos += 1,
                        }
                    }
                }
                for (slot, why) in ended_slots {
                    let why = format!("{}: {why}", slot.running.name());
                    self.on_work_ended(myself, slot.index, why);
                }
                if let Some(reason) = self.deferred.take() {
                    self.demote(myself, Some(token), reason);
                }
            }
            Err(reason) => {
                self.args.trace.step(
                    "supervisor",
                    "work-start-failed",
                    Some(token),
                    &reason.to_string(),
                );
                // Nothing runs; release so another node can lead.
                self.phase = Phase::Leading {
                    token,
                    works: Vec::new(),
                };
                self.demote(myself, Some(token), reason);
            }
        }
    }

    /// Begins checkpoint → stop → release, unless a demotion is already under way.
    fn demote(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        about: Option<FenceToken>,
        reason: DemotionReason,
    ) {
        match &mut self.phase {
            Phase::Starting(token) => {
                if about.is_none_or(|t| t == *token) {
                    self.deferred.get_or_insert(reason);
                }
            }
            Phase::Leading { token, works } => {
                let token = *token;
                if about.is_some_and(|t| t != token) {
                    return;
                }
                if self.restarting > 0 {
                    // A restarted work is starting: demote once it has (it must be stopped too).
                    self.deferred.get_or_insert(reason);
                    return;
                }
                let works = std::mem::take(works);
                self.demotion_started = Some(Instant::now());
                self.args.trace.step(
                    "supervisor",
                    "demote-begin",
                    Some(token),
                    &reason.to_string(),
                );
                self.say_demotion(token, &reason);
                let _ = self.watchdog.cast(WatchdogMsg::Disarm);
                // From here the node reports itself as not leading; the work drains behind it.
                self.args.shared.set_term(None);
                self.phase = Phase::Demoting { token, reason };
                let (trace, bound, me) = (
                    self.args.trace.clone(),
                    self.args.cfg.work_stop_timeout(),
                    myself.clone(),
                );
                let holder = self.args.cfg.node_id.clone();
                tokio::spawn(async move {
                    checkpoint_all(&works, &trace, token, &holder, bound).await;
                    stop_all(&works, &trace, token, bound).await;
                    let _ = me.cast(SupervisorMsg::WorkStopped { token });
                });
            }
            Phase::Follower | Phase::Demoting { .. } | Phase::Releasing { .. } => {}
        }
    }

    fn on_work_stopped(&mut self, myself: &ActorRef<SupervisorMsg>, token: FenceToken) {
        let Phase::Demoting { token: t, reason } = &self.phase else {
            return;
        };
        if *t != token {
            return;
        }
        let reason = reason.clone();
        let work_stopped_mono_ns = monotonic_ns();
        self.args.shared.set_acting(None);
        let shard = self.shard_label();
        metrics::gauge!(m::LEADERS_ACTING, "shard" => shard.clone()).set(0.0);
        metrics::gauge!(m::FENCE_TOKEN, "shard" => shard.clone()).set(0.0);
        metrics::counter!(m::TRANSITIONS, "to" => "follower", "shard" => shard).increment(1);
        self.args.trace.step(
            "supervisor",
            "work-stopped",
            Some(token),
            &reason.to_string(),
        );
        if let Some(msg) = self.fatal.clone() {
            myself.stop(Some(msg));
            return;
        }
        let successor = match &reason {
            DemotionReason::StepDown { successor } => successor.clone(),
            _ => None,
        };
        // After handing over voluntarily, give the successor a head start so a backend without
        // a queue does not simply hand leadership straight back to us.
        let handover = matches!(
            reason,
            DemotionReason::StepDown { .. } | DemotionReason::Handover
        ) || self.stop_after_release.is_some();
        let refused = self.args.fence.refused_claims_in_a_row() > 0;
        let ended = self.term_failures.term_ended(token, &reason, refused);
        let pause = ended.pause.max(if handover {
            self.args.cfg.renew_interval()
        } else {
            Duration::ZERO
        });
        self.phase = Phase::Releasing {
            token,
            reason,
            work_stopped_mono_ns,
        };
        // A term whose claim the resource left unanswered failed on the resource, not on its
        // work: it backs off locally, and is not spent from the fleet's budget (an outage of the
        // resource must not stop the fleet once the resource is back).
        let failure = ended
            .failure
            .filter(|_| !self.args.fence.claim_unanswered(token));
        // At shutdown the release is a courtesy to the successor (the lease runs out by itself
        // otherwise), and its backend or successor may be stopping too (a whole fleet stopped
        // at once): it is bounded, so the node exits within its stop timeout.
        let shutting_down = matches!(reason_of(&self.phase), Some(DemotionReason::Shutdown))
            || !self.shutdown_waiters.is_empty();
        let bound = shutting_down.then_some(SHUTDOWN_RELEASE_BOUND);
        if let Some(b) = bound {
            tracing::info!(
                token = token.0,
                holder = %self.args.cfg.node_id,
                shard = self.args.shard.0,
                bound_ms = b.as_millis() as u64,
                "leader work stopped; releasing the lease (waiting at most bound_ms)"
            );
        }
        self.release(
            token,
            ElectorMsg::Release {
                successor,
                pause,
                bound,
            },
            failure,
        );
    }

    /// Has the elector release the term, once its failure (if any, and if the budget is on) is
    /// recorded in the fleet's budget: recorded while this node still holds the term, so the
    /// fenced record is accepted.
    fn release(&self, token: FenceToken, release: ElectorMsg, failure: Option<String>) {
        let (Some(budget), Some(error)) = (self.budget.clone(), failure) else {
            let _ = self.elector.cast(release);
            return;
        };
        let elector = self.elector.clone();
        tokio::spawn(async move {
            budget.record(token, &error).await;
            let _ = elector.cast(release);
        });
    }

    fn on_released(&mut self, myself: &ActorRef<SupervisorMsg>, result: Result<(), String>) {
        let Phase::Releasing {
            token,
            reason,
            work_stopped_mono_ns,
        } = std::mem::replace(&mut self.phase, Phase::Follower)
        else {
            return;
        };
        if let Some(started) = self.demotion_started.take() {
            metrics::histogram!(m::DEMOTION_SECONDS).record(started.elapsed().as_secs_f64());
        }
        self.args
            .trace
            .step("supervisor", "demoted", Some(token), &reason.to_string());
        let report = StepDownReport {
            token,
            successor: match &reason {
                DemotionReason::StepDown { successor } => successor.clone(),
                _ => None,
            },
            work_stopped_mono_ns,
            released_mono_ns: monotonic_ns(),
            release_error: result.err(),
        };
        for w in self.step_down_waiters.drain(..) {
            let _ = w.send(Ok(report.clone()));
        }
        for w in self.shutdown_waiters.drain(..) {
            let _ = w.send(());
        }
        if let Some(why) = self.stop_after_release.take() {
            self.args
                .trace
                .step("supervisor", "policy-shutdown", Some(token), &why);
            tracing::error!(%why, "leader work failed under the Shutdown policy; stopping the node");
            myself.stop(Some(why));
        }
    }

    /// A work of the current term ended on its own (already removed from the phase): apply its
    /// supervision policy.
    fn on_work_ended(&mut self, myself: &ActorRef<SupervisorMsg>, index: usize, why: String) {
        let Phase::Leading { token, .. } = self.phase else {
            return;
        };
        // The term has failed, whatever ends it (see `actors::backoff`).
        self.term_failures.work_failed(&why);
        let policy = self.args.works[index].policy.clone();
        match policy {
            SupervisionPolicy::Demote => {
                self.demote(myself, Some(token), DemotionReason::WorkFailed(why))
            }
            SupervisionPolicy::Shutdown => {
                self.stop_after_release.get_or_insert(why.clone());
                self.demote(myself, Some(token), DemotionReason::WorkFailed(why))
            }
            SupervisionPolicy::Restart {
                max,
                within,
                backoff,
            } => {
                let now = Instant::now();
                let history = self.restarts.entry(index).or_default();
                while history
                    .front()
                    .is_some_and(|t| now.duration_since(*t) > within)
                {
                    history.pop_front();
                }
                if history.len() as u64 >= u64::from(max) {
                    let why = format!("{why} (restarted {max} times within {within:?})");
                    self.demote(myself, Some(token), DemotionReason::WorkFailed(why));
                    return;
                }
                let delay = restart_delay(backoff, history.len());
                history.push_back(now);
                let name = self.args.works[index].work.name();
                self.args.trace.step(
                    name,
                    "restart-scheduled",
                    Some(token),
                    &format!("{why}; backoff_ms={}", delay.as_millis()),
                );
                myself.send_after(delay, move || SupervisorMsg::RestartDue { token, index });
            }
        }
    }

    fn on_restart_due(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        token: FenceToken,
        index: usize,
    ) {
        // Only inside the same term, and not once demotion has begun.
        if !matches!(self.phase, Phase::Leading { token: t, .. } if t == token) {
            return;
        }
        self.restarting += 1;
        let name = self.args.works[index].work.name();
        metrics::counter!(m::WORK_RESTARTS, "work" => name).increment(1);
        let ctx = WorkContext {
            token,
            node_id: self.args.cfg.node_id.clone(),
            fence: self.args.fence.clone(),
            trace: self.args.trace.clone(),
            supervisor: myself.get_cell(),
            leadership: self.args.shared.clone(),
            shard: self.args.shard,
        };
        let (work, me) = (self.args.works[index].work.clone(), myself.clone());
        tokio::spawn(async move {
            let result = work.start(ctx).await.map_err(|e| e.to_string());
            let _ = me.cast(SupervisorMsg::WorkRestarted {
                token,
                index,
                result,
            });
        });
    }

    fn on_work_restarted(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        token: FenceToken,
        index: usize,
        result: Result<Box<dyn RunningWork>, String>,
    ) {
        self.restarting = self.restarting.saturating_sub(1);
        let Phase::Leading { token: t, works } = &mut self.phase else {
            return;
        };
        if *t != token {
            return;
        }
        let name = self.args.works[index].work.name();
        match result {
            Ok(running) => {
                let ended = running.cell().get_status() >= ractor::ActorStatus::Stopping;
                works.push(Slot { index, running });
                self.args.trace.step(name, "restarted", Some(token), "");
                if ended {
                    let slot = works.pop().expect("just pushed");
                    let why = format!("{}: ended while restarting", slot.running.name());
                    self.on_work_ended(myself, index, why);
                }
            }
            Err(e) => {
                self.args
                    .trace
                    .step(name, "restart-failed", Some(token), &e);
                self.on_work_ended(myself, index, format!("{name}: restart failed: {e}"));
            }
        }
        if self.restarting == 0 {
            if let Some(reason) = self.deferred.take() {
                self.demote(myself, Some(token), reason);
            }
        }
    }
}

/// How long a release at shutdown may take (the lease runs out by itself after that). A
/// release answers within milliseconds from a healthy backend; raft's hand-over waits for its
/// successor's election, which never comes when the successor is stopping too.
pub(crate) const SHUTDOWN_RELEASE_BOUND: Duration = Duration::from_secs(1);

/// The reason of a term that is ending (demoting or releasing).
fn reason_of(phase: &Phase) -> Option<&DemotionReason> {
    match phase {
        Phase::Demoting { reason, .. } | Phase::Releasing { reason, .. } => Some(reason),
        _ => None,
    }
}

/// The first of a term's works that has already ended (a refused claim ends one within
/// milliseconds, often before the rest of the term has started). ractor marks an actor Stopping
/// before it notifies its supervisor, so a supervision event that arrived while the term was
/// starting, and was not matched then, shows here as well as one still on its way.
async fn checkpoint_all(
    works: &[Slot],
    trace: &ActorTrace,
    token: FenceToken,
    holder: &str,
    bound: Duration,
) {
    for w in works.iter().map(|s| &s.running) {
        match tokio::time::timeout(bound, w.checkpoint()).await {
            Ok(Ok(())) => trace.step(w.name(), "checkpointed", Some(token), ""),
            Ok(Err(e)) => {
                // Its last step failed as the term ended (a commit a newer term cut off, a
                // write refused): said, not dropped. Not a failed term: the term's end is why.
                tracing::warn!(
                    token = token.0,
                    holder = %holder,
                    work = w.name(),
                    error = %e,
                    "leader work failed while its term was ending: what it had not committed is lost"
                );
                trace.step(w.name(), "checkpoint-failed", Some(token), &e.to_string())
            }
            Err(_) => {
                tracing::warn!(
                    token = token.0,
                    holder = %holder,
                    work = w.name(),
                    bound_ms = bound.as_millis() as u64,
                    "leader work did not checkpoint within bound_ms as its term ended; it is stopped now"
                );
                trace.step(w.name(), "checkpoint-timeout", Some(token), "")
            }
        }
    }
}

/// Stops every work actor and waits until each has fully stopped; kills one that overruns `bound`.
/// A work already on its way out (it ended by itself: a job that returned as it checkpointed, a
/// program that exited at its SIGTERM) refuses the stop request: it is waited for, and killed
/// only if it is still not gone after `bound`.
async fn stop_all(works: &[Slot], trace: &ActorTrace, token: FenceToken, bound: Duration) {
    for w in works.iter().map(|s| &s.running) {
        let cell: ActorCell = w.cell();
        let stopped = match cell
            .stop_and_wait(Some("demoted".into()), Some(bound))
            .await
        {
            Ok(()) => true,
            Err(ractor::RactorErr::Timeout) => false,
            Err(_) => cell.wait(Some(bound)).await.is_ok(),
        };
        if !stopped && !matches!(cell.get_status(), ractor::ActorStatus::Stopped) {
            trace.step(w.name(), "kill", Some(token), "stop bound exceeded");
            tracing::warn!(
                token = token.0,
                work = w.name(),
                bound_ms = bound.as_millis() as u64,
                "leader work did not stop within bound_ms; killed"
            );
            let _ = cell.kill_and_wait(Some(bound)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::{BackendKind, ElectorResult, Grant, Win};

    /// A seat that never falls to a campaign of its own (the test says who won) and reports
    /// every resignation.
    struct Seat {
        resigned: Arc<tokio::sync::Notify>,
    }

    #[async_trait]
    impl Elector for Seat {
        fn kind(&self) -> BackendKind {
            BackendKind::PgLease
        }
        async fn campaign(&self) -> ElectorResult<Win> {
            std::future::pending().await
        }
        async fn renew(&self) -> ElectorResult<Option<Grant>> {
            Ok(Some(Grant {
                sent_at: Instant::now(),
                ttl: Duration::from_secs(3),
            }))
        }
        async fn resign(&self, _successor: Option<&str>) -> ElectorResult<()> {
            self.resigned.notify_one();
            Ok(())
        }
        async fn leader(&self) -> ElectorResult<Option<LeaderInfo>> {
            Ok(None)
        }
        async fn close(&self) -> ElectorResult<()> {
            Ok(())
        }
    }

    /// A race seen in `experiments/FINDINGS.md`: placement withdraws a shard from this node while its
    /// campaign is winning, and the win arrives after the withdrawal. The supervisor must hand
    /// that term over (release it), or the shard stays here with nobody sent to take it.
    #[tokio::test]
    async fn a_term_won_after_placement_withdrew_it_is_handed_over() {
        let resigned = Arc::new(tokio::sync::Notify::new());
        let cfg = NodeConfig::default();
        let (leader_tx, leader_rx) = tokio::sync::watch::channel(None);
        let args = SupervisorArgs {
            backend: Arc::new(Seat {
                resigned: resigned.clone(),
            }),
            works: Vec::new(),
            fence: Fence::new(&cfg.resource, "n1").unwrap(),
            trace: ActorTrace::disabled("n1"),
            shared: Arc::new(Leadership::new(
                "n1".into(),
                None,
                BackendKind::PgLease,
                leader_rx,
            )),
            leader_tx,
            shard: ShardId(3),
            wanted: true,
            peer_events: None,
            cfg: Arc::new(cfg),
        };
        let (supervisor, _join) = Actor::spawn(None, NodeSupervisor, args).await.unwrap();
        supervisor
            .cast(SupervisorMsg::Placement { wanted: false })
            .unwrap();
        supervisor
            .cast(SupervisorMsg::Elected {
                token: FenceToken(7),
                // Far off: the watchdog would end the term at its deadline anyway, and the
                // hand-over must come long before.
                lease_deadline: Instant::now() + Duration::from_secs(60),
                grant_sent_at: Instant::now(),
            })
            .unwrap();
        let released = tokio::time::timeout(Duration::from_secs(2), resigned.notified()).await;
        supervisor.stop(None);
        assert!(
            released.is_ok(),
            "a term won after placement withdrew it was kept, not handed over"
        );
    }
}
