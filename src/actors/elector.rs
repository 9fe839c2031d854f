//! The Elector actor: the campaign/renew/release loop, written once for every backend.
//!
//! * Campaigns in a spawned task (campaign blocks until we win) and reports `Elected` with the
//!   token and the lease deadline to the supervisor.
//! * Renews liveness on a timer — every `renew_interval` after a success, every `retry_interval`
//!   after a failure — and, while leading, moves the watchdog's deadline forward from each renewal's
//!   *send* time. A failed renewal does not demote by itself: the watchdog does, when the last good
//!   grant runs out. A renewal that says the lease is gone demotes at once.
//! * Releases (resign / transfer) only when the supervisor says the work has stopped.
//! * With a failure detector (`[detector] kind = "swim"`): when it confirms a peer dead, a
//!   follower asks the backend to end that peer's lease ([`Elector::expire_dead_holder`], a
//!   compare-and-delete on the lease still naming it) and, if it did, campaigns at once instead
//!   of polling until the lease runs out. With shards a confirmation is kept for one lease
//!   TTL, so the elector of a shard that placement hands over only *because* of that death ends
//!   the dead node's lease as its campaign starts. A leader told that it was itself declared dead demotes
//!   (its lease is about to be ended by the others), in the usual order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use rand::Rng;
use tokio::task::JoinHandle;

use crate::actors::budget::FailureBudget;
use crate::actors::messages::{ElectorMsg, SupervisorMsg, WatchdogMsg};
use crate::actors::DemotionReason;
use crate::backends::{Elector, ElectorError, FenceToken, Grant, LeaderInfo};
use crate::clock::NodeClock;
use crate::config::NodeConfig;
use crate::metrics as m;
use crate::trace::ActorTrace;

/// How long closing the backend may take as the elector stops.
const CLOSE_BOUND: Duration = Duration::from_secs(2);

pub struct ElectorArgs {
    pub backend: Arc<dyn Elector>,
    pub cfg: Arc<NodeConfig>,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub watchdog: ActorRef<WatchdogMsg>,
    pub trace: ActorTrace,
    pub leader_tx: tokio::sync::watch::Sender<Option<LeaderInfo>>,
    /// Whether to campaign from the start (placement's first word; always true at K = 1).
    pub candidate: bool,
    /// The fleet-wide failure budget each campaign waits for (`None`: off).
    pub budget: Option<Arc<FailureBudget>>,
    /// The failure detector's events (`None`: no detector, leases alone decide).
    pub peer_events: Option<crate::actors::PeerEvents>,
}

#[derive(Debug, PartialEq)]
enum Mode {
    Idle,
    Campaigning,
    Leading(FenceToken),
    /// Demotion in progress: waiting for the supervisor's `Release`.
    Demoting,
}

pub struct ElectorState {
    args: ElectorArgs,
    clock: NodeClock,
    mode: Mode,
    campaign_task: Option<JoinHandle<()>>,
    observe_task: JoinHandle<()>,
    /// Forwards the detector's events into the mailbox (`None`: no detector).
    peer_task: Option<JoinHandle<()>>,
    renew_in_flight: bool,
    last_renew_ok: Option<Instant>,
    last_renew_attempt: Option<Instant>,
    last_renew_failed: bool,
    /// Whether this node seeks the term (see [`ElectorMsg::SetCandidate`]).
    candidate: bool,
    /// A withdrawal's `close()` is in flight: no campaign may start until it is done, or the
    /// close could end the new campaign's session.
    withdrawing: bool,
    /// The last campaign failed, and its candidacy may still be queued in the backend (a
    /// request that timed out may have been applied): a withdrawal while idle must still close
    /// it, or it would hold its place on a session the node keeps alive for its other shards.
    failed_campaign_may_linger: bool,
    /// Members the failure detector confirmed dead, and when (see [`Self::expire_recently_dead`]).
    recently_dead: HashMap<String, Instant>,
}

pub struct ElectorActor;

#[async_trait]
impl Actor for ElectorActor {
    type Msg = ElectorMsg;
    type State = ElectorState;
    type Arguments = ElectorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: ElectorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let (backend, tx, every) = (
            args.backend.clone(),
            args.leader_tx.clone(),
            args.cfg.retry_interval(),
        );
        let observe_task = tokio::spawn(async move { backend.observe(tx, every).await });
        let peer_task = args.peer_events.as_ref().map(|events| {
            let (mut rx, me) = (events.subscribe(), myself.clone());
            tokio::spawn(async move {
                use tokio::sync::broadcast::error::RecvError;
                loop {
                    match rx.recv().await {
                        Ok(ev) => {
                            if me.cast(ElectorMsg::Peer(ev)).is_err() {
                                return;
                            }
                        }
                        // Missed events are also learnt the slow way: the lease runs out.
                        Err(RecvError::Lagged(_)) => continue,
                        Err(RecvError::Closed) => return,
                    }
                }
            })
        });
        myself.send_interval(args.cfg.retry_interval(), || ElectorMsg::RenewTick);
        let _ = myself.cast(ElectorMsg::Campaign);
        let clock = NodeClock {
            skew_ms: args.cfg.clock_skew_ms,
            drift: args.cfg.clock_drift,
        };
        let candidate = args.candidate;
        Ok(ElectorState {
            args,
            candidate,
            withdrawing: false,
            failed_campaign_may_linger: false,
            recently_dead: HashMap::new(),
            clock,
            mode: Mode::Idle,
            campaign_task: None,
            observe_task,
            peer_task,
            renew_in_flight: false,
            last_renew_ok: None,
            last_renew_attempt: None,
            last_renew_failed: false,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.campaign_task.take() {
            t.abort();
        }
        state.observe_task.abort();
        if let Some(t) = state.peer_task.take() {
            t.abort();
        }
        // Withdraw any candidacy; bounded so a dead backend cannot hold shutdown hostage.
        let backend = state.args.backend.clone();
        if tokio::time::timeout(CLOSE_BOUND, backend.close())
            .await
            .is_err()
        {
            tracing::warn!(
                bound_ms = CLOSE_BOUND.as_millis() as u64,
                "the election backend did not close within bound_ms; given up"
            );
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ElectorMsg::Campaign => state.start_campaign(&myself),
            ElectorMsg::SetCandidate(on) => state.set_candidate(&myself, on),
            ElectorMsg::Withdrawn => {
                state.withdrawing = false;
                state.start_campaign(&myself);
            }
            ElectorMsg::CampaignDone { result, started } => {
                state.on_campaign_done(&myself, result, started)
            }
            ElectorMsg::Peer(ev) => state.on_peer_event(&myself, ev),
            ElectorMsg::DeadHolderExpired {
                dead,
                confirmed_at,
                result,
            } => state.on_dead_holder_expired(&myself, dead, confirmed_at, result),
            ElectorMsg::RetryDeadExpiry => {
                if state.mode == Mode::Campaigning {
                    state.expire_recently_dead(&myself);
                }
            }
            ElectorMsg::RenewTick => state.maybe_renew(&myself),
            ElectorMsg::RenewDone(result) => state.on_renew_done(&myself, result),
            ElectorMsg::Release {
                successor,
                pause,
                bound,
            } => state.release(&myself, successor, pause, bound),
            ElectorMsg::ReleaseDone { result, pause } => {
                let detail = result
                    .as_ref()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                state.args.trace.step("elector", "released", None, &detail);
                let _ = state.args.supervisor.cast(SupervisorMsg::Released {
                    result: result.map_err(|e| e.to_string()),
                });
                myself.send_after(pause, || ElectorMsg::Campaign);
            }
        }
        Ok(())
    }
}

impl ElectorState {
    /// Releases the lease (to `successor` where the backend can), within `bound` if given, in
    /// a task that reports [`ElectorMsg::ReleaseDone`]; campaigning resumes `pause` after it.
    fn release(
        &mut self,
        myself: &ActorRef<ElectorMsg>,
        successor: Option<String>,
        pause: Duration,
        bound: Option<Duration>,
    ) {
        self.mode = Mode::Idle;
        let (backend, me, trace) = (
            self.args.backend.clone(),
            myself.clone(),
            self.args.trace.clone(),
        );
        tokio::spawn(async move {
            trace.step(
                "elector",
                "release-begin",
                None,
                successor.as_deref().unwrap_or(""),
            );
            let resign = backend.resign(successor.as_deref());
            let result = match bound {
                None => resign.await,
                Some(b) => match tokio::time::timeout(b, resign).await {
                    Ok(r) => r,
                    Err(_) => {
                        tracing::warn!(
                            bound_ms = b.as_millis() as u64,
                            "the lease's release did not finish within bound_ms (the backend, or the successor a hand-over waits for, may be stopping too); given up: the lease runs out by itself"
                        );
                        Err(ElectorError::Unavailable(format!(
                            "the release did not finish within {} ms",
                            b.as_millis()
                        )))
                    }
                },
            };
            let _ = me.cast(ElectorMsg::ReleaseDone { result, pause });
        });
    }

    fn on_peer_event(&mut self, myself: &ActorRef<ElectorMsg>, ev: crate::actors::PeerEvent) {
        use crate::actors::PeerEvent;
        match ev {
            PeerEvent::DeclaredMeDead => {
                self.args
                    .trace
                    .step("elector", "declared-dead", None, "by the failure detector");
                if let Mode::Leading(token) = self.mode {
                    // The others are ending our lease now; the fence refuses whatever we write
                    // after their term begins, so stop first (checkpoint -> stop -> release).
                    self.mode = Mode::Demoting;
                    let _ = self.args.supervisor.cast(SupervisorMsg::Demoted {
                        token: Some(token),
                        reason: DemotionReason::LeaseLost(
                            "the failure detector declared this node dead".into(),
                        ),
                    });
                }
            }
            PeerEvent::ConfirmedDead(dead) => {
                if dead == self.args.cfg.node_id {
                    return;
                }
                // Kept for a campaign that starts later: with shards, placement hands a dead
                // member's shards to their new owners only after the confirmation, so their
                // electors were not candidates when it arrived.
                self.recently_dead.insert(dead.clone(), Instant::now());
                if self.mode == Mode::Campaigning {
                    self.expire_if_holder(myself, dead);
                }
            }
        }
    }

    /// Ends `dead`'s lease in the backend if it may hold this term's seat, unless the backend
    /// last showed someone else leading (a compare-and-delete would find nothing). Only while
    /// campaigning: a leader's own seat is not in question, and an idle node seeks nothing.
    fn expire_if_holder(&mut self, myself: &ActorRef<ElectorMsg>, dead: String) {
        let known = self.args.leader_tx.borrow().clone();
        if known.is_some_and(|l| l.node_id != dead) {
            return;
        }
        // Once per confirmation: a later campaign must not expire the same lease again (a
        // failed expiry puts it back, see `on_dead_holder_expired`).
        let confirmed_at = self
            .recently_dead
            .remove(&dead)
            .unwrap_or_else(Instant::now);
        self.args.trace.step("elector", "peer-dead", None, &dead);
        let (backend, me) = (self.args.backend.clone(), myself.clone());
        tokio::spawn(async move {
            let result = backend.expire_dead_holder(&dead).await;
            let _ = me.cast(ElectorMsg::DeadHolderExpired {
                dead,
                confirmed_at,
                result,
            });
        });
    }

    /// At a campaign's start: the members confirmed dead within one lease TTL (after that their
    /// leases have run out by themselves) whose lease may hold the seat.
    fn expire_recently_dead(&mut self, myself: &ActorRef<ElectorMsg>) {
        let ttl = Duration::from_millis(self.args.cfg.lease_ttl_ms);
        self.recently_dead.retain(|_, at| at.elapsed() < ttl);
        let dead: Vec<String> = self.recently_dead.keys().cloned().collect();
        for d in dead {
            self.expire_if_holder(myself, d);
        }
    }

    fn on_dead_holder_expired(
        &mut self,
        myself: &ActorRef<ElectorMsg>,
        dead: String,
        confirmed_at: Instant,
        result: Result<crate::backends::DeadHolderExpiry, ElectorError>,
    ) {
        use crate::backends::DeadHolderExpiry;
        match result {
            Ok(expiry) if expiry.ended() => {
                metrics::counter!(m::DETECTOR_TAKEOVERS).increment(1);
                self.args
                    .trace
                    .step("elector", "dead-holder-expired", None, &dead);
                tracing::info!(dead = %dead, "the failure detector confirmed the leader dead; its lease is ended, campaigning now");
                // The backend says how its waiting campaign learns of the free seat: a polling
                // one would see it only at its next poll, so it is woken to poll now (not
                // restarted: a poll dropped in flight can still land and hold the seat for a
                // lease); one woken by the holder key's deletion goes on by itself.
                if self.mode == Mode::Campaigning && expiry == DeadHolderExpiry::EndedCampaignPolls
                {
                    self.args.backend.wake_campaign();
                }
            }
            Ok(_) => {}
            Err(e) => {
                // Asked again every retry interval while the confirmation is younger than a
                // lease (after that the lease has run out by itself).
                let ttl = Duration::from_millis(self.args.cfg.lease_ttl_ms);
                if confirmed_at.elapsed() < ttl {
                    tracing::debug!(dead = %dead, error = %e, "could not end a dead holder's lease yet; asking again");
                    self.recently_dead.insert(dead, confirmed_at);
                    myself.send_after(self.args.cfg.retry_interval(), || {
                        ElectorMsg::RetryDeadExpiry
                    });
                } else {
                    tracing::warn!(dead = %dead, error = %e, "could not end a dead holder's lease; waiting for it to run out");
                }
            }
        }
    }

    /// Drops the campaign in flight, then closes the session so no candidacy stays queued
    /// (cancel-safe by the Elector contract). A win that raced with this arrives as a
    /// CampaignDone in mode Idle and is ignored (no work starts without the supervisor's
    /// Elected), and close() gives that seat up too. `Withdrawn` follows.
    fn withdraw_campaign(&mut self, myself: &ActorRef<ElectorMsg>) {
        if let Some(t) = self.campaign_task.take() {
            t.abort();
        }
        self.failed_campaign_may_linger = false;
        self.mode = Mode::Idle;
        self.withdrawing = true;
        let (backend, me) = (self.args.backend.clone(), myself.clone());
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), backend.close()).await;
            let _ = me.cast(ElectorMsg::Withdrawn);
        });
    }

    fn set_candidate(&mut self, myself: &ActorRef<ElectorMsg>, on: bool) {
        if self.candidate == on {
            return;
        }
        self.candidate = on;
        self.args.trace.step(
            "elector",
            if on { "candidate" } else { "withdraw" },
            None,
            "",
        );
        match (on, &self.mode) {
            (true, Mode::Idle) => self.start_campaign(myself),
            (false, Mode::Campaigning) => self.withdraw_campaign(myself),
            (false, Mode::Idle) if self.failed_campaign_may_linger => {
                self.withdraw_campaign(myself)
            }
            _ => {}
        }
    }

    fn start_campaign(&mut self, myself: &ActorRef<ElectorMsg>) {
        if self.mode != Mode::Idle || !self.candidate || self.withdrawing {
            return;
        }
        self.mode = Mode::Campaigning;
        self.args.trace.step("elector", "campaign", None, "");
        let (backend, me, budget) = (
            self.args.backend.clone(),
            myself.clone(),
            self.args.budget.clone(),
        );
        self.campaign_task = Some(tokio::spawn(async move {
            // Not while the fleet has spent its failure budget (cancel-safe: a withdrawal or
            // a shutdown aborts the wait like the campaign).
            if let Some(budget) = &budget {
                budget.wait_until_open().await;
            }
            let started = Instant::now();
            // Meanwhile the budget is watched: a campaign may wait long (a raft follower's,
            // until its node leads the raft group), and this node must still say when the
            // fleet has spent its budget.
            let result = match &budget {
                Some(budget) => tokio::select! {
                    result = backend.campaign() => result,
                    never = budget.watch() => match never {},
                },
                None => backend.campaign().await,
            };
            let _ = me.cast(ElectorMsg::CampaignDone { result, started });
        }));
        self.expire_recently_dead(myself);
    }

    fn on_campaign_done(
        &mut self,
        myself: &ActorRef<ElectorMsg>,
        result: Result<crate::backends::Win, ElectorError>,
        started: Instant,
    ) {
        self.campaign_task = None;
        if self.mode != Mode::Campaigning {
            return;
        }
        match result {
            Ok(win) => {
                self.failed_campaign_may_linger = false;
                metrics::histogram!(m::CAMPAIGN_SECONDS).record(started.elapsed().as_secs_f64());
                // The election proper: from the vacancy this node saw to now (never before
                // this campaign began).
                let election = win.vacant_since.map(|v| v.max(started).elapsed());
                if let Some(e) = election {
                    metrics::histogram!(m::ELECTION_SECONDS).record(e.as_secs_f64());
                }
                let deadline = self.deadline(win.grant);
                self.mode = Mode::Leading(win.token);
                let detail = election
                    .map(|e| format!("election_us={}", e.as_micros()))
                    .unwrap_or_default();
                self.args
                    .trace
                    .step("elector", "won", Some(win.token), &detail);
                let _ = self.args.supervisor.cast(SupervisorMsg::Elected {
                    token: win.token,
                    lease_deadline: deadline,
                    grant_sent_at: win.grant.sent_at,
                });
            }
            Err(e) => {
                self.mode = Mode::Idle;
                self.failed_campaign_may_linger = true;
                tracing::warn!(error = %e, "campaign failed; retrying");
                let jitter = rand::thread_rng().gen_range(0..=self.args.cfg.retry_interval_ms);
                myself.send_after(
                    self.args.cfg.retry_interval() + Duration::from_millis(jitter),
                    || ElectorMsg::Campaign,
                );
            }
        }
    }

    /// Renews on schedule: every renew interval after a success, every retry interval after a failure.
    fn maybe_renew(&mut self, myself: &ActorRef<ElectorMsg>) {
        if self.renew_in_flight {
            return;
        }
        let now = Instant::now();
        let due = match (self.last_renew_attempt, self.last_renew_failed) {
            (None, _) => true,
            (Some(_), true) => true, // the tick itself runs at the retry interval
            (Some(_), false) => self
                .last_renew_ok
                .is_none_or(|t| now.duration_since(t) >= self.args.cfg.renew_interval()),
        };
        if !due {
            return;
        }
        self.renew_in_flight = true;
        self.last_renew_attempt = Some(now);
        let (backend, me) = (self.args.backend.clone(), myself.clone());
        tokio::spawn(async move {
            let _ = me.cast(ElectorMsg::RenewDone(backend.renew().await));
        });
    }

    fn on_renew_done(
        &mut self,
        myself: &ActorRef<ElectorMsg>,
        result: Result<Option<Grant>, ElectorError>,
    ) {
        self.renew_in_flight = false;
        match result {
            Ok(None) => self.last_renew_failed = false,
            Ok(Some(grant)) => {
                metrics::counter!(m::RENEWALS).increment(1);
                self.last_renew_failed = false;
                self.last_renew_ok = Some(grant.sent_at);
                if let Mode::Leading(token) = self.mode {
                    let _ = self.args.watchdog.cast(WatchdogMsg::Extend {
                        token,
                        deadline: self.deadline(grant),
                        sent_at: grant.sent_at,
                    });
                }
            }
            Err(ElectorError::LeaseLost(why)) => {
                metrics::counter!(m::RENEWAL_FAILURES).increment(1);
                self.last_renew_failed = true;
                self.args.trace.step("elector", "lease-lost", None, &why);
                match self.mode {
                    Mode::Leading(token) => {
                        self.mode = Mode::Demoting;
                        let _ = self.args.supervisor.cast(SupervisorMsg::Demoted {
                            token: Some(token),
                            reason: DemotionReason::LeaseLost(why),
                        });
                    }
                    Mode::Campaigning => {
                        // The candidacy rode on the lost session: withdraw it and start over.
                        if let Some(t) = self.campaign_task.take() {
                            t.abort();
                        }
                        self.mode = Mode::Idle;
                        let backend = self.args.backend.clone();
                        let me = myself.clone();
                        tokio::spawn(async move {
                            let _ = backend.close().await;
                            let _ = me.cast(ElectorMsg::Campaign);
                        });
                    }
                    Mode::Idle | Mode::Demoting => {}
                }
            }
            Err(e) => {
                metrics::counter!(m::RENEWAL_FAILURES).increment(1);
                self.last_renew_failed = true;
                tracing::warn!(error = %e, "lease renewal failed; the watchdog decides if it runs out");
            }
        }
    }

    /// `sent_at + ttl - margin`, on the monotonic clock, through the node's clock-rate model.
    fn deadline(&self, grant: Grant) -> Instant {
        let usable = grant
            .ttl
            .saturating_sub(self.args.cfg.lease_safety_margin(grant.ttl));
        self.clock.real_deadline(grant.sent_at, usable)
    }
}
